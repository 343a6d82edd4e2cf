"""The DLRM example end to end through ``bosen launch`` (two workers, staleness 0 and > 0, a held-out
AUC stated against the teacher's, the Bayes-optimal ranking), and the model's two embedding layouts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from conftest import REPO, first_worker, run_cmd

import bosen
from bosen import checkpoint
from bosen.apps import microtasks as M
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
    # the synchronous path: plain SGD on the servers, dense storage
    sync = {"backup": {"mode": "static", "k": 2}}
    with pytest.raises(ValueError, match="optimizer: with backup the servers take plain SGD steps"):
        dlrm.DLRMArgs(**sync)
    with pytest.raises(ValueError, match="backup: needs storage: dense"):
        dlrm.DLRMArgs(**sync, optimizer="sgd", storage="sparse")
    assert "its workers cannot change" in (dlrm.not_elastic(sync, 3) or "")  # backup workers proper: k < n
    assert dlrm.not_elastic(sync, 2) is None  # every gradient applied: the micro-tasks move


def test_a_workers_task_samples_are_the_training_sets_by_id():
    """``TaskSamples`` holds the shares of the tasks it is given (generated apart, kept ones reused) and
    gathers drawn ids, in their order, as the whole training set has them."""
    a = from_dict(dlrm.DLRMArgs, {**SYNC, "train_samples": 100}, "app.args")
    full = criteo.generate(a.spec, 0, 100)
    mine = dlrm.TaskSamples(a, [3, 1], 4)
    ids = np.concatenate([M.share(100, 3, 4)[[4, 0, 20]], M.share(100, 1, 4)[[0, 24, 3]]])
    got = mine.batch(ids)
    for x, want in zip(got, (full.dense, full.ids, full.labels), strict=True):
        np.testing.assert_array_equal(x.numpy(), want[ids])
    moved = dlrm.TaskSamples(a, [1, 2], 4, mine.parts)
    assert moved.parts[1] is mine.parts[1]
    np.testing.assert_array_equal(moved.batch(M.share(100, 2, 4))[1].numpy(), full.ids[M.share(100, 2, 4)])


def test_hybrid_mode_keeps_one_micro_task_per_rank_and_says_why_it_cannot_scale():
    with pytest.raises(ValueError, match="micro_tasks: hybrid mode .* one task each: leave micro_tasks at 0"):
        dlrm.DLRMArgs(dense="allreduce", micro_tasks=4)
    assert dlrm.ELASTIC and dlrm.not_elastic({"micro_tasks": 8}, 2) is None
    assert "its workers cannot change while it runs" in (dlrm.not_elastic({"dense": "allreduce"}, 2) or "")


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


def _replay(a: dlrm.DLRMArgs, iterations: int, T: int, ranks_at: Callable[[int], list[int]]
            ) -> tuple[dlrm.DLRM, np.ndarray, dict[int, M.Draws]]:
    """The synchronous path with every gradient applied, in one process: each iteration every rank of
    ``ranks_at(it)`` draws its mini-batch from the micro-tasks it owns then (``M.assign``), and SGD steps
    on the mean of their gradients at ``lr`` (static k = n). Returns the model, the embedding rows some
    batch touched, and each task's sampler (``Draws``) after the last iteration."""
    ref = dlrm.model(a)
    full = criteo.generate(a.spec, 0, a.train_samples)
    data = [torch.from_numpy(x) for x in (full.dense, full.ids, full.labels)]
    tasks = {t: M.Draws(a.train_samples, [t], T, a.seed) for t in range(T)}
    touched = np.zeros(ref.emb.weight.shape[0], dtype=bool)
    for it in range(iterations):
        ranks = ranks_at(it)
        owners = M.assign(T, ranks)
        ref.zero_grad()
        for r in ranks:
            mine = M.owned(owners, r).tolist()
            cuts = np.diff(np.linspace(0, a.batch_size, len(mine) + 1).round().astype(np.int64)).tolist()
            idx = torch.from_numpy(np.concatenate([tasks[t].draw(k) for t, k in zip(mine, cuts, strict=True)]))
            x, ids, y = (v[idx] for v in data)
            touched[(ids + ref.offsets).view(-1).numpy()] = True
            F.binary_cross_entropy_with_logits(ref(x, ids), y).backward()
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(p.grad, alpha=-a.lr / len(ranks))
    return ref, touched, tasks


def _sync_launch(tmp_path: Path, args: dict, every: int) -> Path:
    """The config of a launched synchronous DLRM job: two servers, two workers, checkpoints."""
    cfg = {"cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 2},
           "checkpoint": {"every_clocks": every, "keep": 100},
           "app": {"module": "bosen.apps.pytorch.examples.dlrm", "tables": "bosen.apps.pytorch.examples.dlrm:tables",
                   "args": args}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def _until(p: subprocess.Popen, done: Callable[[], bool], what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert p.poll() is None, f"the job ended before {what}:\n{p.stdout.read() if p.stdout else ''}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:g}s"
        time.sleep(0.02)


def _complete(run: Path, clock: int, workers: int | None = 2) -> bool:
    try:
        checkpoint.check_complete(run / "checkpoints", clock, 2, workers, None)
        return True
    except checkpoint.CheckpointError:
        return False


def _saved(run: Path, clock: int, tables: dict, workers: int | None = 2) -> tuple[dict, dict, dict]:
    """Checkpoint ``clock``: each of ``tables``' values (both servers' rows), each server's backup arrays
    of each table (``p<i>.*``), and the workers' ``task.*`` arrays."""
    parts = checkpoint.check_complete(run / "checkpoints", clock, 2, workers, None)
    values = {n: np.full((t["rows"], t["cols"]), np.nan, np.float32) for n, t in tables.items()}
    backup: dict[str, list[dict]] = {n: [] for n in tables}
    tasks: dict[str, np.ndarray] = {}
    for name, part in parts.items():
        arrays = part.load()
        if name.startswith("worker-"):
            tasks.update({k: v for k, v in arrays.items() if k.startswith("task.")})
            continue
        for i, n in enumerate(tables):
            values[n][arrays[f"t{i}.rows"]] = arrays[f"t{i}.values"]
            backup[n].append({k.split(".", 1)[1]: v for k, v in arrays.items() if k.startswith(f"p{i}.")})
    assert not any(np.isnan(v).any() for v in values.values())
    return values, backup, tasks


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_synchronous_dlrm_job_survives_a_lost_worker_a_resume_and_a_scale_out_with_the_values_of_a_replay(tmp_path):
    """Static k = n (every gradient applied), 3 micro-tasks, 2 servers, checkpoints every 4 iterations.
    Worker 1 is held before its CLOCK(10) (its gradient of 9 sent, not completed) and SIGKILLed there:
    the launcher replaces it from the checkpoint at 8, the servers keep w_9 and wait for rank 1's
    gradient of 9, and the replacement, its task's sampler restored at 8, draws and drops iteration 8's
    mini-batch as it clocks up to 9, so it computes the lost one's gradient. Then worker 0 holds before
    CLOCK(18), the job is stopped (SIGKILL) once the checkpoint at 16 is complete and resumed from it
    (``bosen launch --resume``), and the resumed job is scaled 2 -> 3 workers (``bosen scale``: the tasks
    move at B). A checkpoint past B equals a single-process replay of SGD on the mean of the job's
    workers' gradients (2 before B, 3 from B) to float32 rounding (rows no batch touched keep their
    first values), every step took all the workers' gradients (nothing dropped), and every task's
    sampler is where the replay's is."""
    args = {**SYNC, "epochs": 500, "micro_tasks": 3, "backup": {"mode": "static", "k": 2}}  # 6 iterations an epoch
    tables = dlrm.tables(args, tmp_path / "t")
    path, run = _sync_launch(tmp_path, args, every=4), (tmp_path / "run").resolve()
    go, go2 = tmp_path / "go", tmp_path / "go2"
    env = {**os.environ, "BOSEN_FAULT": f"hold-before-clock:1:10:{go};hold-before-clock:0:18:{go2}"}
    launch = [sys.executable, "-m", "bosen", "launch", str(path), "--run-dir", str(run), "--no-plot"]
    with (tmp_path / "launch.out").open("w") as log:
        p = subprocess.Popen(launch, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    try:
        _until(p, lambda: Path(f"{go}.held").exists() and _complete(run, 8), "worker 1 held at 10, checkpoint 8")
        first_worker(p.pid, 1).kill()
        go.touch()  # the replacement goes on past 10
        _until(p, lambda: Path(f"{go2}.held").exists() and _complete(run, 16), "worker 0 held at 18, checkpoint 16")
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    out = (tmp_path / "launch.out").read_text()
    assert "worker-1 was killed by SIGKILL: replacing it from the checkpoint at clock 8" in out, out[-3000:]
    assert not _complete(run, 20)
    with (tmp_path / "resume.out").open("w") as log:
        p = subprocess.Popen([*launch[:5], "--resume", str(run), "--no-plot"], stdout=log, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
    try:
        _until(p, lambda: _complete(run, 20), "the resumed job's checkpoint at 20")
        lines: list[str] = []
        bosen.scale(run, workers=3, out=lines.append)
        [b] = (int(m) for m in re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines)))
        c = b + 8 - b % 4  # a checkpoint with an iteration of 3 workers before it
        _until(p, lambda: _complete(run, c, 3), f"a checkpoint at {c}", timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert "resuming from the checkpoint at clock 16" in (tmp_path / "resume.out").read_text()
    a = from_dict(dlrm.DLRMArgs, args, "app.args")
    ref, touched, samplers = _replay(a, c, 3, lambda it: [0, 1] if it < b else [0, 1, 2])
    values, backup, tasks = _saved(run, c, tables, 3)
    dense = Layout.of(ref).values(ref).reshape(-1)
    np.testing.assert_allclose(values["params"].reshape(-1)[:dense.size], dense, rtol=1e-5, atol=2e-6)
    np.testing.assert_allclose(values["emb"], ref.emb.weight.detach().numpy(), rtol=1e-5, atol=2e-6)
    init = dlrm.model(a).emb.weight.detach().numpy()
    assert not np.allclose(values["emb"][touched], init[touched], atol=1e-4)  # the rows the batches touched moved
    np.testing.assert_array_equal(values["emb"][~touched], init[~touched])  # and only those
    for shards_of in backup.values():
        assert len(shards_of) == 2
        for k in shards_of:
            assert k["k_history"].tolist() == [2] * b + [3] * (c - b) and k["counts"][1:3].tolist() == [0, 0], b
    for t, d in samplers.items():
        for name, want in d.state(t).items():
            np.testing.assert_array_equal(tasks[M.key(t, name)], want, err_msg=f"task {t} {name}")
    print(f"B {b}, checkpoint {c}: dense off by {np.abs(values['params'].reshape(-1)[:dense.size] - dense).max():.2g}, "
          f"embeddings by {np.abs(values['emb'] - ref.emb.weight.detach().numpy()).max():.2g}")


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_sync_dlrm_learns_with_backup_workers(bosen_cluster, bosen_procs, tmp_path):
    """Static k = 1 of 2, every table a backup table over two servers: each iteration every table takes
    one worker's gradient (at lr * k / n) and drops or never gets the other's; 64 iterations still lift
    the held-out AUC well above the initial model's (single-process SGD on one worker's 64 batches at
    that rate: 0.58, the teacher's 0.84). (Static k = n, where every gradient is applied:
    ``test_a_synchronous_dlrm_job_survives_...`` below, against a replay.)"""
    n = 2
    drops = {**SYNC, "lr": 2.0, "train_samples": 4096, "test_samples": 2000, "backup": {"mode": "static", "k": 1}}
    job = _sync_job(bosen_cluster, bosen_procs, tmp_path / "drops", n, drops)
    b_ = from_dict(dlrm.DLRMArgs, drops, "app.args")
    test = criteo.generate(b_.spec, 0, b_.test_samples, criteo.HELDOUT)
    start = criteo.auc(dlrm.scores(dlrm.model(b_), test), test.labels)

    out, backup = job()
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
