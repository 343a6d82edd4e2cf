"""bosen.jobs.pollux: Pollux's scheduler over running jobs: the model fitted from measured clocks gives
the slots to the job that scales, a goodput agent's φ and (m, s) make a job adaptive, run directories
the scheduler cannot move are refused by name, and on two real MLR jobs (``bosen launch``, micro-tasks)
the loop (``schedule``) scales one of them out through ``bosen scale`` and returns when both end."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

import bosen
from bosen import checkpoint
from bosen.apps import goodput as gp
from bosen.errors import BosenError
from bosen.jobs import cli
from bosen.jobs.pollux import Agent, Move, Scheduler, Tracked, clock_gaps, schedule, track


def test_the_slots_go_to_the_job_whose_clocks_shrink_with_workers(tmp_path: Path) -> None:
    # measured: job a halves its clock from 1 to 2 workers (computation), job b does not (sync)
    a = Tracked(tmp_path / "a", work=10_000, workers=2, samples=[(1, 1.0), (2, 0.52)], started=0.0)
    b = Tracked(tmp_path / "b", work=10_000, workers=2, samples=[(1, 1.0), (2, 0.98)], started=0.0)
    s = Scheduler([a, b], 6, scale=lambda *x, **k: 0.0)
    target = s.decide()
    assert target[0] > target[1] >= 1 and sum(target) <= 6, target
    lone = Tracked(tmp_path / "l", work=10_000, workers=1, samples=[(1, 1.0)], started=0.0)
    assert Scheduler([lone], 8, scale=lambda *x, **k: 0.0).decide() == [2]  # at most twice what was measured
    c = Tracked(tmp_path / "c", work=10_000, workers=2)  # no clock measured yet: keeps its workers
    assert Scheduler([a, b, c], 6, scale=lambda *x, **k: 0.0).decide()[2] == 2
    with pytest.raises(ValueError, match="more than the 3 slots"):
        Scheduler([a, b], 3)


def test_an_agents_phi_and_batches_make_the_job_adaptive(tmp_path: Path) -> None:
    run = tmp_path / "a"
    (run / "workers").mkdir(parents=True)
    recs = [{"clock": c, "time": 0.1 * c, "m": 64, "s": 0} for c in range(6)]
    recs[1] |= {"goodput_phi": -1.0}  # not measured yet
    recs[4] |= {"goodput_phi": 900.0, "goodput_batch": 64}
    recs[5] |= {"goodput_workers": 2}  # the K a clock ran at, where the agent says it
    (run / "workers" / "0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    plain = Tracked(run, work=1000, workers=1)
    agent = Tracked(run, work=1000, workers=1, agent=Agent(64, 2048, 4096))
    s = Scheduler([plain, agent], 4, scale=lambda *x, **k: 0.0)
    s.observe()
    assert plain.phi is None and agent.phi == 900.0 and len(agent.runs) == 5 and agent.runs[0] == (1, 64.0, 0.0,
                                                                                                   pytest.approx(0.1))
    assert agent.runs[-1][0] == 2
    plain_model, agent_model = s.model(plain), s.model(agent)
    assert plain_model is not None and not plain_model.adaptive and plain_model.phi == float("inf")
    assert agent_model is not None and agent_model.adaptive and agent_model.phi == 900.0 and agent_model.m0 == 64
    # attained service: workers x rank 0's seconds run (0.5 s at one worker), what overload ranks by
    assert plain.attained == pytest.approx(0.5) and plain_model.attained == pytest.approx(0.5)


def test_run_dirs_the_scheduler_cannot_move_are_refused_by_name(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(BosenError, match="not a run directory"):
        track(tmp_path / "missing")
    assert cli.main(["schedule", str(tmp_path / "missing"), "--slots", "2"]) == 2
    assert "bosen schedule: " in capsys.readouterr().err
    with pytest.raises(BosenError, match="no running launcher"):
        track(tmp_path)
    cfg = json.loads(_job(tmp_path, "x").read_text())
    del cfg["checkpoint"]
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))
    (tmp_path / "control.json").write_text(json.dumps({"address": "tcp://127.0.0.1:1", "pid": os.getpid()}))
    with pytest.raises(BosenError, match="no checkpoints"):
        track(tmp_path)
    cfg["checkpoint"] = {"every_clocks": 200}
    cfg["app"]["args"]["goodput"] = {"m0": 128}
    (tmp_path / "config.yaml").write_text(json.dumps(cfg))
    with _launcher(tmp_path, workers=3):  # scaled since its launch: the launcher's count, not the config's
        t = track(tmp_path)
    assert (t.workers, t.max_workers, t.agent) == (3, 4, Agent(128, 4096, 4096))
    with pytest.raises(ValueError, match="interval"):
        schedule([tmp_path], 2, interval=0)


@contextlib.contextmanager
def _launcher(run: Path, workers: int) -> Iterator[None]:
    """A stand-in launcher's control endpoint that says the job has ``workers`` workers."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REP)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    (run / "control.json").write_text(json.dumps({"address": f"tcp://127.0.0.1:{port}", "pid": os.getpid()}))
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            if sock.poll(50):
                assert json.loads(sock.recv()) == {"op": "shape"}
                sock.send(json.dumps({"ok": True, "workers": workers, "scaling": False}).encode())

    t = threading.Thread(target=answer, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
        sock.close(0)
        ctx.term()


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
def test_the_loop_scales_one_of_two_real_jobs_out_and_returns_when_they_end(tmp_path: Path) -> None:
    runs = [(tmp_path / n).resolve() for n in ("a", "b")]
    procs = [subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(_job(tmp_path, r.name)), "--run-dir",
                               str(r), "--no-plot"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True,
                              start_new_session=True) for r in runs]
    lines: list[str] = []
    moves: list[Move] = []
    loop = threading.Thread(target=lambda: moves.extend(schedule(runs, 3, interval=1.0, delay=1.0,
                                                                 out=lines.append)), daemon=True)
    try:
        for r in runs:
            _wait(r, 2, procs)  # both run: the loop's first interval measures each
        loop.start()
        deadline = time.monotonic() + 90
        while not any("1 -> 2 workers" in x for x in lines):  # one free slot: one job gets it
            assert loop.is_alive() and time.monotonic() < deadline, lines
            time.sleep(0.1)
        grown = next(r for r in runs if any(f"{r.name} 1 -> 2" in x for x in lines))
        while not (grown / "workers" / "1.jsonl").exists():  # the second worker reports
            assert time.monotonic() < deadline, lines
            time.sleep(0.1)
        for p in procs:  # the jobs end: the loop drops them and returns
            os.killpg(p.pid, signal.SIGTERM)
        loop.join(30)
        assert not loop.is_alive(), lines
        assert [(m.run_dir, m.before, m.after) for m in moves] == [(grown, 1, 2)], lines
        assert sum("ended" in x for x in lines) == 2 and not any("kept its workers" in x for x in lines), lines
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_the_scheduler_scales_an_agent_driven_job_and_its_agent_re_picks_for_the_new_count(tmp_path: Path) -> None:
    """One synchronous MLR job whose goodput agent picks (m, s), on 2 slots: once the agent reports φ,
    a scheduler step gives the job the free slot through `bosen scale`; from the boundary on rank 0's
    records name K = 2, the agent's choice there is made for 2 (M = 2·m·(s + 1)) and differs from the
    one for 1, every worker runs it, and the scheduler's next look reads them as the job's samples at 2.
    Scaled back to 1 at a boundary inside an interval (checkpoints every 25 clocks, intervals of 10), the
    leaver hands its sums of that interval to rank 0 with its tasks: the interval's row counts the steps
    both measured in it."""
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 1}, "checkpoint": {"every_clocks": 25, "keep": 200},
           "tables": {"W": {"rows": 10, "cols": 1001, "dtype": "float32", "init": {"zeros": True},
                            "backup": {"mode": "static", "k": 1, "lr": 0.5}},
                      "goodput": {"rows": 10000, "cols": 10, "dtype": "float64", "staleness": 0,
                                  "init": {"zeros": True}}},
           # 200 features a sample: computation grows with the batch, so a second worker pays in the model
           "app": {"module": "bosen.apps.mlr",
                   "args": {"data": "synthetic", "synthetic": {"n": 20000, "nnz": 200}, "holdout": 0.1,
                            "batch_size": 32, "micro_tasks": 4, "eval_every": 0, "epochs": 100000,
                            "goodput": {"interval_clocks": 10}}}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(cfg))
    run = (tmp_path / "run").resolve()
    p = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(path), "--run-dir", str(run), "--no-plot"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True, start_new_session=True)

    def records(rank: int) -> list[dict]:
        f = run / "workers" / f"{rank}.jsonl"
        lines = f.read_text().splitlines() if f.exists() else []
        return [json.loads(x) for x in lines[:-1]]  # the last may be half written

    try:
        deadline = time.monotonic() + 120
        while not any(r.get("goodput_phi", -1) >= 0 for r in records(0)):  # the agent measures φ and picks
            assert p.poll() is None and time.monotonic() < deadline, "the job ended or stalled"
            time.sleep(0.1)
        # no re-allocation penalty (δ = 0): the move follows from the model alone. With δ > 0 it waits until
        # the job's age outweighs the gain the model sees in a second worker, and on 2 cores this job's
        # steps are mostly overhead: its fit may give a second worker a gain of 0.1% (T_grad's slope in m at
        # its floor; measured 0.90-0.9997 for SPEEDUP(1)), which δ = 1 s outweighs for an hour of age (the
        # test failed so, 2 of 5 clean runs). The penalty's aging is tested in tests/bosen/test_scheduling.py.
        s = Scheduler([track(run)], 2, delay=0.0)
        assert s.jobs[0].workers == 1 and s.jobs[0].agent is not None
        moves = s.step()
        while not moves:  # the loop's intervals: the fit learns (a job measured at one worker only so far)
            assert p.poll() is None and time.monotonic() < deadline and not s.refused, s.refused
            time.sleep(0.5)
            moves = s.step()
        assert [(r, k) for r, k, _ in moves] == [(run, 2)], s.refused
        while not [r for r in records(1) if "iteration" in r][5:]:  # the joiner ran a few steps
            assert p.poll() is None and time.monotonic() < deadline, "the job ended or stalled"
            time.sleep(0.1)
        s.observe()
        while not any(k == 2 for k, *_ in s.jobs[0].runs):  # the scheduler's record of clocks at 2 workers
            assert p.poll() is None and time.monotonic() < deadline, "the scheduler saw no clock at 2 workers"
            time.sleep(0.2)
            s.observe()
        lines: list[str] = []
        while True:  # asked where the next checkpoint boundary (a scale-in's) is an odd multiple of 25
            now = max(r["iteration"] for r in records(0) if "iteration" in r)
            if (now // 25 + 1) % 2 == 1 and 25 - now % 25 > 5:
                break
            assert p.poll() is None and time.monotonic() < deadline + 60, "the job ended or stalled"
            time.sleep(0.02)
        bosen.scale(run, workers=1, out=lines.append)
        b2 = int(re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines))[-1])
        while b2 % 10 == 0:  # (a proposal withdrawn) at an interval's end nothing is handed over: once more
            bosen.scale(run, workers=2, out=lines.append)
            bosen.scale(run, workers=1, out=lines.append)
            b2 = int(re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines))[-1])
        c = ((b2 // 10 + 1) * 10 // 25 + 1) * 25  # a checkpoint past the end of B2's interval
        parts = None
        while parts is None:
            assert p.poll() is None and time.monotonic() < deadline + 60, "no checkpoint past the scale-in"
            time.sleep(0.1)
            try:
                parts = checkpoint.check_complete(run / "checkpoints", c, 1, None, None)
            except checkpoint.CheckpointError:
                pass
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    server = parts["server-0"].load()
    rows = np.zeros((10000, gp.COLS))
    rows[server["t1.rows"]] = server["t1.values"]
    rank0 = [r for r in records(0) if "iteration" in r]
    b = next(r["iteration"] for r in rank0 if r["goodput_workers"] == 2)
    commits = [int(x) for x in re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines))]
    joined = commits[-2] if len(commits) > 1 else b
    i = (b2 - 1) // 10
    # every step is measured (two micro-batches at least): 10 by rank 0, those since the interval began
    # (or it joined) by the leaver
    assert rows[i, gp.C_WORKERS] == 1 and rows[i, gp.C_STEPS] == 10 + b2 - max(10 * i, joined), (b2, rows[i])
    before = [r for r in rank0 if r["iteration"] < b][-1]
    at = next(r for r in rank0 if r["iteration"] == b)
    assert at["goodput_batch"] == 2 * at["m"] * (at["s"] + 1) and (at["m"], at["s"]) != (before["m"], before["s"])
    first_out = int(re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines))[0])
    assert all(r["goodput_workers"] == 2 for r in rank0 if b <= r["iteration"] < first_out)
    ran = {r["iteration"]: (r["m"], r["s"], r["lr_gain"]) for r in rank0}
    assert all(ran[r["iteration"]] == (r["m"], r["s"], r["lr_gain"]) for r in records(1) if "iteration" in r)
    assert any(k == 2 for k, *_ in s.jobs[0].runs) and s.jobs[0].workers == 2
