"""The DLRM example end to end through ``bosen launch`` (two workers, staleness 0 and > 0, a held-out
AUC stated against the teacher's, the Bayes-optimal ranking), and the model's two embedding layouts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import REPO, run_cmd

from bosen.apps.pytorch.examples import criteo, dlrm
from bosen.apps.pytorch.layout import Layout
from bosen.config import from_dict

DLRM_CONFIG = REPO / "configs" / "torch-dlrm.yaml"


def launch(run_dir: Path, *sets: str, timeout: float = 120) -> list[dict]:
    cmd = [sys.executable, "-m", "bosen", "launch", str(DLRM_CONFIG), "--run-dir", str(run_dir), "--quiet",
           "--no-plot"]
    for s in sets:
        cmd += ["--set", s]
    p = run_cmd(cmd, timeout=timeout)  # forked from the session's zygote: the launcher's imports are paid once
    assert p.returncode == 0, f"launch failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return lines


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_dlrm_learns_through_the_launcher(tmp_path):
    """100,000 samples (one epoch, two workers, batch 128, server AdaGrad, staleness 2): the held-out
    AUC gets at least half of the way from chance (0.5) to the teacher's (0.798 here); measured 0.664
    (0.666 at staleness 0, which tests/apps/pytorch/test_rowcache.py runs in process), and
    single-process torch AdaGrad reaches 0.672 on the same samples."""
    lines = launch(tmp_path / "run", "consistency.staleness=2", "app.args.train_samples=100000",
                   "app.args.evals_per_epoch=2")
    clocks = sorted((x for x in lines if x.get("kind") == "clock"), key=lambda x: x["clock"])
    steps = 50_000 // 128  # 390 per worker, a clock every 4
    assert [c["clock"] for c in clocks] == [48, 97] and all(c["workers"] == 2 for c in clocks)
    assert sum(c["samples"] for c in clocks) == 2 * steps * 128
    teacher = clocks[-1]["teacher_auc"]
    assert 0.75 < teacher < 0.85  # the generator's ceiling, from the held-out labels
    auc = [c["heldout_auc"] for c in clocks]
    assert auc[-1] >= 0.5 + 0.5 * (teacher - 0.5), (auc, teacher)
    assert auc[-1] > auc[0] > 0.55
    assert clocks[-1]["heldout_count"] == 20_000
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert sorted(cfg["tables"]) == ["emb", "params"]  # fused: one table for the 26 features' rows
    assert cfg["tables"]["emb"]["rows"] == sum(min(r, 10_000) for r in criteo.KAGGLE_ROWS)
    assert cfg["tables"]["emb"]["update"] == "adagrad" and cfg["tables"]["emb"]["update_args"]["alpha"] == 0.05
    # traffic: the client's buffer adds up a clock's 4 steps, so each worker sends the dense table
    # (25 rows of 1024 float32 and a 4-byte id each: ids travel as int32 where they fit) once per
    # clock, and the embedding rows its 4 batches touched (at most the rows pushed), never the
    # 156,000-row table
    sent = sum(x["bytes_sent"] for x in lines if x.get("kind") == "client")
    dense = 2 * 98 * 25 * (1024 * 4 + 4)
    touched = clocks[-1]["rows_pushed"]  # both workers' counts, summed by the launcher
    assert dense + touched / 4 * (16 * 4 + 4) <= sent <= 1.1 * (dense + touched * (16 * 4 + 4)), (sent, touched)
    assert touched < 2 * steps * 128 * 26 / 2


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_per_feature_embeddings_are_tables_of_their_own(tmp_path):
    lines = launch(tmp_path / "run", "app.args.embedding=per_feature", "app.args.train_samples=8192",
                   "app.args.evals_per_epoch=1", "app.args.test_samples=2000", "app.args.optimizer=delta-adagrad")
    clocks = [x for x in lines if x.get("kind") == "clock"]
    assert len(clocks) == 1 and clocks[0]["workers"] == 2 and clocks[0]["heldout_auc"] > 0.5
    cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert sorted(cfg["tables"]) == sorted(["params", *(f"emb.{f}" for f in range(26))])
    assert [cfg["tables"][f"emb.{f}"]["rows"] for f in range(26)] == [min(r, 10_000) for r in criteo.KAGGLE_ROWS]
    assert {t["update"] for t in cfg["tables"].values()} == {"add"}
    # the dense parameters' table at staleness 0 (dense_staleness), the embeddings' at the job's (None)
    assert cfg["tables"]["params"]["staleness"] == 0
    assert all(cfg["tables"][f"emb.{f}"]["staleness"] is None for f in range(26)) and cfg["consistency"]["staleness"]


def test_fused_and_per_feature_embeddings_are_the_same_model():
    rows = (7, 3, 11) + (2,) * 23
    a = dlrm.DLRM(rows, dim=4, fused=False)
    b = dlrm.DLRM(rows, dim=4, fused=True)
    with torch.no_grad():
        b.bottom.load_state_dict(a.bottom.state_dict())
        b.top.load_state_dict(a.top.state_dict())
        b.emb.weight.copy_(torch.cat([e.weight for e in a.emb]))
    rng = np.random.default_rng(0)
    dense = torch.from_numpy(rng.normal(size=(32, 13)).astype(np.float32))
    ids = torch.from_numpy(np.stack([rng.integers(0, r, 32) for r in rows], 1))
    torch.testing.assert_close(a(dense, ids), b(dense, ids))
    cat = dlrm.DLRM(rows, dim=4, interaction="cat", fused=True)
    assert cat.top[0].in_features == 27 * 4 and cat(dense, ids).shape == (32,)


def test_eval_points_and_bad_arguments():
    assert dlrm.eval_steps(390, 2, 4) == [196, 390]
    assert dlrm.eval_steps(390, 1, 4) == [390]
    assert dlrm.eval_steps(10, 4, 4) == [4, 8, 10]
    with pytest.raises(ValueError, match="app.args.max_rows: must be >= 1"):
        dlrm.tables({"max_rows": 0}, Path("unused"))
    with pytest.raises(ValueError, match="app.args.embedding"):
        dlrm.tables({"embedding": "one"}, Path("unused"))
    with pytest.raises(ValueError, match="app.args.dense_staleness: must be >= 0"):
        dlrm.tables({"dense_staleness": -1}, Path("unused"))
    # the synchronous path: plain SGD on the servers, dense storage, no micro-tasks (it cannot scale)
    sync = {"backup": {"mode": "static", "k": 2}}
    with pytest.raises(ValueError, match="optimizer: with backup the servers take plain SGD steps"):
        dlrm.DLRMArgs(**sync)
    with pytest.raises(ValueError, match="backup: needs storage: dense"):
        dlrm.DLRMArgs(**sync, optimizer="sgd", storage="sparse")
    assert "its workers cannot change" in (dlrm.not_elastic(sync) or "")


def test_hybrid_mode_keeps_one_micro_task_per_rank_and_says_why_it_cannot_scale():
    with pytest.raises(ValueError, match="micro_tasks: hybrid mode .* one task each: leave micro_tasks at 0"):
        dlrm.DLRMArgs(dense="allreduce", micro_tasks=4)
    assert dlrm.ELASTIC and dlrm.not_elastic({"micro_tasks": 8}) is None
    assert "its workers cannot change while it runs" in (dlrm.not_elastic({"dense": "allreduce"}) or "")


# the synchronous path (backup tables with embeddings): a DLRM small enough for a few seconds
SYNC = {"optimizer": "sgd", "lr": 0.5, "batch_size": 32, "train_samples": 384, "test_samples": 500, "dim": 4,
        "bottom": 8, "top": 8, "max_rows": 50, "evals_per_epoch": 1, "epochs": 1}


def _sync_job(bosen_cluster, bosen_procs, folder: Path, n: int, args: dict) -> Callable[[], tuple[list[dict], dict]]:
    """Start a synchronous DLRM job of ``n`` workers (two servers); the function returned waits for it and
    gives each worker's final values (``dlrm_sync_worker.py``) and per table each server's backup STATUS."""
    from conftest import worker

    from bosen.jobs.status import query

    c = bosen_cluster(2, n, tables=dlrm.tables(args, folder / "t"), staleness=0, name=folder.name)
    outs = [folder / f"w{r}.npz" for r in range(n)]
    ps = [worker(bosen_procs, "dlrm_sync_worker.py", c.path, "--args", json.dumps(args), "--out", outs[r],
                 env={"BOSEN_RANK": str(r)}) for r in range(n)]

    def finish() -> tuple[list[dict], dict]:
        assert bosen_procs.wait_all(ps, 90) == [0] * n
        status = [query(s)["tables"] for s in c.config["cluster"]["servers"]]
        return [dict(np.load(o)) for o in outs], {t: [s[t]["backup"] for s in status] for t in status[0]}
    return finish


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_sync_dlrm_is_sgd_on_the_mean_gradient_and_learns_with_backup_workers(bosen_cluster, bosen_procs, tmp_path):
    """Two jobs at once (their start-up overlaps), every table a backup table over two servers.

    Static k = n: the servers' steps equal a single-process replay of the same mini-batches, SGD on the
    mean of the n gradients (the fused embedding's: the rows each batch touched, summed over the
    workers, / n), to float32 rounding; rows no batch touched keep their first values.

    Static k = 1 of 2: each iteration every table takes one worker's gradient (at lr * k / n) and drops
    or never gets the other's; 64 iterations still lift the held-out AUC well above the initial
    model's (single-process SGD on one worker's 64 batches at that rate: 0.58, the teacher's 0.84)."""
    n = 2
    exact = {**SYNC, "backup": {"mode": "static", "k": n}}
    drops = {**SYNC, "lr": 2.0, "train_samples": 4096, "test_samples": 2000, "backup": {"mode": "static", "k": 1}}
    jobs = [_sync_job(bosen_cluster, bosen_procs, tmp_path / name, n, args)
            for name, args in (("exact", exact), ("drops", drops))]
    # the replay, while the jobs run
    a = from_dict(dlrm.DLRMArgs, exact, "app.args")
    steps = dlrm.sync_steps(a, n)
    ref = dlrm.model(a)
    shards = [criteo.shard(a.spec, r, n, a.train_samples) for r in range(n)]
    touched = np.zeros(ref.emb.weight.shape[0], dtype=bool)
    for t in range(steps):
        ref.zero_grad()
        for r, d in enumerate(shards):
            idx = dlrm.sync_batch(a, r, len(d), steps, t)
            x, ids, y = (torch.from_numpy(v[idx]) for v in (d.dense, d.ids, d.labels))
            touched[(ids + ref.offsets).view(-1).numpy()] = True
            F.binary_cross_entropy_with_logits(ref(x, ids), y).backward()
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(p.grad, alpha=-a.lr / n)
    dense = Layout.of(ref).values(ref).reshape(-1)
    b_ = from_dict(dlrm.DLRMArgs, drops, "app.args")
    test = criteo.generate(b_.spec, 0, b_.test_samples, criteo.HELDOUT)
    start = criteo.auc(dlrm.scores(dlrm.model(b_), test), test.labels)

    out, backup = jobs[0]()
    for o in out:
        assert o["iteration"].tolist() == [steps, steps]
        np.testing.assert_allclose(o["dense"][:dense.size], dense, rtol=1e-5, atol=2e-6)
        np.testing.assert_allclose(o["emb0"], ref.emb.weight.detach().numpy(), rtol=1e-5, atol=2e-6)
    init = dlrm.model(a).emb.weight.detach().numpy()
    assert not np.allclose(out[0]["emb0"][touched], init[touched], atol=1e-4)  # the rows the batches touched moved
    np.testing.assert_array_equal(out[0]["emb0"][~touched], init[~touched])  # and only those
    assert sorted(backup) == ["emb", "params"]
    for shards_of in backup.values():
        for b in shards_of:
            assert b["k_history"] == [n] * steps and b["dropped_late"] == 0 and b["dropped_repeat"] == 0

    out, backup = jobs[1]()
    steps = dlrm.sync_steps(b_, n)
    auc = out[0]["auc"].tolist()
    assert len(auc) == 1 and auc[0] > max(0.55, start + 0.03), (auc, start)
    for o in out:
        assert o["iteration"].tolist() == [steps, steps]
    for shards_of in backup.values():
        for b in shards_of:
            assert b["k_history"] == [1] * steps and b["accepted"] == steps and all(len(x) == 1 for x in b["applied"])
    # both workers' gradients were applied, each iteration one of them; the other's dropped (late) or not
    # sent (its worker read past the iteration)
    assert {r for b in backup["params"] for x in b["applied"] for r in x} == {0, 1}
