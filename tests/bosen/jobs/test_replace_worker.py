"""A lost worker is replaced (bosen/jobs/launch.py, server/daemon.py ``_rejoin``; docs/recovery.md):
real jobs through ``bosen launch``, a worker SIGKILLed mid-job."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import checkpoint_job, launch_job, saved_table


def job(tmp_path: Path, args: dict, every: int | None = 4, comm: bool = False) -> Path:
    return checkpoint_job(tmp_path, args, staleness=2, every=every, comm=comm)


launch = launch_job
table = saved_table


def tri(b: int) -> int:
    return b * (b + 1) // 2


@pytest.mark.slow
@pytest.mark.parametrize("comm", [False, True])
def test_a_killed_worker_is_replaced_and_redoes_its_clocks_since_the_checkpoint(tmp_path: Path, comm: bool) -> None:
    """Worker 0 SIGKILLs itself entering tick 9 (its updates of ticks < 9 applied); the launcher
    replaces it from the newest complete checkpoint C, the servers take back its updates of ticks
    C..8 (plain addition, server/undo.py), the replacement redoes them and goes on, and the job ends
    with exactly a failure-free run's table: every update counted once. Each clock has one record,
    of both workers."""
    ticks = 40
    cfg = job(tmp_path, {"ticks": ticks, "die_at": 9, "slow_rank": 1, "slow_s": 0.02}, comm=comm)
    run = tmp_path / "run"
    code, out = launch(cfg, "--run-dir", run)
    assert code == 0, out
    m = re.search(r"worker-0 was killed by SIGKILL: replacing it from the checkpoint at clock (\d+)", out)
    assert m is not None, out
    c = int(m.group(1))
    assert c in (4, 8) and "worker-0.1 replaces worker-0: it redoes clocks from" in out, out
    w = table(run / "checkpoints", ticks)
    np.testing.assert_array_equal(w[:, 1], tri(ticks))
    np.testing.assert_array_equal(w[:, 0], tri(ticks))
    assert "took back" in "\n".join(p.read_text() for p in (run / "logs").glob("server-*.log")), out
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    clocks = [r for r in metrics if r["kind"] == "clock"]
    assert [r["clock"] for r in clocks] == list(range(ticks)) and all(r["workers"] == 2 for r in clocks)
    assert sorted(r["clock"] for r in metrics if r["kind"] == "redo") == list(range(c, 9))


@pytest.mark.slow
def test_a_killed_worker_without_checkpoints_fails_the_job_saying_why(tmp_path: Path) -> None:
    cfg = job(tmp_path, {"ticks": 30, "die_at": 5}, every=None)
    code, out = launch(cfg, "--run-dir", tmp_path / "run")
    assert code == 1, out
    assert "worker-0 was killed by SIGKILL (a lost worker is replaced only in a job that makes checkpoints" in out, out


@pytest.mark.slow
def test_a_worker_killed_after_it_left_the_job_is_not_replaced(tmp_path: Path) -> None:
    """Worker 1 finishes, leaves the job (BYE) and is SIGKILLed on its way out: its work is done, and
    a replacement would redo its clocks after the others finished with its results (what they wrote
    would no longer be the tables' state). The launcher says so and the job ends as if it had exited."""
    ticks = 12
    cfg = job(tmp_path, {"ticks": ticks, "die_at": ticks, "die_rank": 1})
    run = tmp_path / "run"
    code, out = launch(cfg, "--run-dir", run)
    assert code == 0, out
    assert "worker-1 was killed by SIGKILL after it left the job: its work is done, nothing is redone" in out, out
    assert "replacing it" not in out, out
    w = table(run / "checkpoints", ticks)
    np.testing.assert_array_equal(w, np.full((8, 2), tri(ticks)))
    assert "took back" not in "\n".join(p.read_text() for p in (run / "logs").glob("server-*.log")), out
