"""The DLRM example end to end through ``bosen launch`` (two workers, staleness 0 and > 0, a held-out
AUC stated against the teacher's, the Bayes-optimal ranking), and the model's two embedding layouts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from conftest import REPO

from bosen.apps.pytorch.examples import criteo, dlrm

DLRM_CONFIG = REPO / "configs" / "torch-dlrm.yaml"


def launch(run_dir: Path, *sets: str, timeout: float = 120) -> list[dict]:
    cmd = [sys.executable, "-m", "bosen", "launch", str(DLRM_CONFIG), "--run-dir", str(run_dir), "--quiet",
           "--no-plot"]
    for s in sets:
        cmd += ["--set", s]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
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


def test_hybrid_mode_keeps_one_micro_task_per_rank_and_says_why_it_cannot_scale():
    with pytest.raises(ValueError, match="micro_tasks: hybrid mode .* one task each: leave micro_tasks at 0"):
        dlrm.DLRMArgs(dense="allreduce", micro_tasks=4)
    assert dlrm.ELASTIC and dlrm.not_elastic({"micro_tasks": 8}) is None
    assert "its workers cannot change while it runs" in (dlrm.not_elastic({"dense": "allreduce"}) or "")
