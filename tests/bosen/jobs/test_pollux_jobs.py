"""bosen.jobs.pollux: Pollux's scheduler over running jobs: the model fitted from measured clocks gives
the slots to the job that scales, and on two real MLR jobs (``bosen launch``, micro-tasks) one
interval scales one of them out through ``bosen scale``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bosen.jobs.pollux import Scheduler, Tracked, clock_gaps


def test_the_slots_go_to_the_job_whose_clocks_shrink_with_workers(tmp_path: Path) -> None:
    # measured: job a halves its clock from 1 to 2 workers (computation), job b does not (sync)
    a = Tracked(tmp_path / "a", work=10_000, workers=2, samples=[(1, 1.0), (2, 0.52)], started=0.0)
    b = Tracked(tmp_path / "b", work=10_000, workers=2, samples=[(1, 1.0), (2, 0.98)], started=0.0)
    s = Scheduler([a, b], 6, scale=lambda *x, **k: 0.0)
    target = s.decide()
    assert target[0] > target[1] >= 1 and sum(target) <= 6, target
    c = Tracked(tmp_path / "c", work=10_000, workers=2)  # no clock measured yet: keeps its workers
    assert Scheduler([a, b, c], 6, scale=lambda *x, **k: 0.0).decide()[2] == 2
    with pytest.raises(ValueError, match="more than the 3 slots"):
        Scheduler([a, b], 3)


def _job(tmp_path: Path, name: str) -> Path:
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 1}, "consistency": {"staleness": 1},
           "comm": {"enabled": True}, "checkpoint": {"every_clocks": 200, "keep": 2},
           "tables": {"W": {"rows": 10, "cols": 101, "dtype": "float32", "init": {"zeros": True}}},
           "app": {"module": "bosen.apps.mlr",
                   "args": {"data": "synthetic", "synthetic": {"n": 20000, "nnz": 20}, "batch_size": 64,
                            "lr": 0.5, "micro_tasks": 4, "seed": 3, "eval_every": 0, "epochs": 100000}}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(json.dumps(cfg))
    return path


def _wait(run: Path, clocks: int, procs: list[subprocess.Popen[str]], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while clock_gaps(run, -1)[1] < clocks:
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, "a job ended or stalled"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_one_interval_scales_one_of_two_real_jobs_out(tmp_path: Path) -> None:
    runs = [(tmp_path / n).resolve() for n in ("a", "b")]
    procs = [subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(_job(tmp_path, r.name)), "--run-dir",
                               str(r), "--no-plot"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                              start_new_session=True) for r in runs]
    try:
        for r in runs:
            _wait(r, 4, procs)
        sched = Scheduler([Tracked(r, work=20000, workers=1) for r in runs], 3, delay=1.0)
        done = sched.step()
        assert sched.refused == [] and len(done) == 1 and done[0][1] == 2, (done, sched.refused)  # one free slot
        assert sorted(j.workers for j in sched.jobs) == [1, 2]
        assert all(len(j.samples) == 1 and j.samples[0][0] == 1 for j in sched.jobs)
        grown = next(j for j in sched.jobs if j.workers == 2)
        _wait(grown.run_dir, grown.skip_until + 2, procs)
        assert (grown.run_dir / "workers" / "1.jsonl").exists()  # the second worker reports
        sched.observe()
        assert grown.samples[-1][0] == 2  # a clock measured at 2 workers
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
