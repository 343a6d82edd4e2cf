"""A lost worker is replaced (bosen/jobs/launch.py, server/daemon.py ``_rejoin``; docs/recovery.md):
real jobs through ``bosen launch``, a worker SIGKILLed mid-job."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import PY, run_cmd, write_config

from bosen import checkpoint


def job(tmp_path: Path, args: dict, every: int | None = 4, comm: bool = False) -> Path:
    cfg: dict = {
        "cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 2},
        "consistency": {"staleness": 2, "read_timeout_s": 30},
        "tables": {"W": {"rows": 8, "cols": 2, "dtype": "int64"}},
        "app": {"module": "checkpoint_worker", "args": args},
    }
    if every is not None:
        cfg["checkpoint"] = {"every_clocks": every, "keep": 100}
    if comm:  # budgeted sends and pushes mid-clock, besides the end-of-tick flushes
        cfg["comm"] = {"client_bandwidth_mbps": 1, "server_bandwidth_mbps": 1, "client_send_rows": 2,
                       "server_push_rows": 2}
    return write_config(tmp_path / "job.yaml", cfg)


def launch(*args: object, timeout: float = 120) -> tuple[int, str]:
    r = run_cmd([PY, "-m", "bosen", "launch", *args, "--no-plot"], timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def table(base: Path, clock: int) -> np.ndarray:
    """Table W as checkpoint ``clock`` holds it (both servers' parts put together)."""
    parts = checkpoint.check_complete(base, clock, 2, 2, None)
    full = np.zeros((8, 2), dtype=np.int64)
    for j in range(2):
        arrays = parts[f"server-{j}"].load()
        full[arrays["t0.rows"]] = arrays["t0.values"]
    return full


def tri(b: int) -> int:
    return b * (b + 1) // 2


@pytest.mark.slow
@pytest.mark.parametrize("comm", [False, True])
def test_a_killed_worker_is_replaced_and_redoes_its_clocks_since_the_checkpoint(tmp_path: Path, comm: bool) -> None:
    """Worker 0 SIGKILLs itself entering tick 9 (its updates of ticks < 9 applied); the launcher
    replaces it from the newest complete checkpoint C, the replacement redoes ticks C..8 and goes on,
    and the job ends. The servers were not rolled back, so the lost worker's ticks C..8 count twice
    (once from it, once from the replacement), exactly that and nothing else: worker 1's column is
    exactly a failure-free run's. Each clock has one record, of both workers."""
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
    np.testing.assert_array_equal(w[:, 0], tri(ticks) + sum(t + 1 for t in range(c, 9)))
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
