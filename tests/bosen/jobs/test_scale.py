"""``bosen scale``: workers join and leave a running job launched by ``bosen launch`` (bosen/jobs/scale.py),
its micro-tasks moving at clock boundaries; real processes throughout."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import zmq
from conftest import descendants, first_worker

import bosen
from bosen import checkpoint
from bosen import config as config_mod
from bosen.apps import microtasks as M
from bosen.apps.lda.worker import LDAArgs, load_corpus
from bosen.config import build, from_dict
from bosen.jobs import status as status_mod
from bosen.jobs.job import read_metrics
from bosen.jobs.scale import ScaleError, Scaler, launcher_status, leave_boundary


def _final_counts(run: Path, cfg: dict, parts: dict) -> tuple[np.ndarray, np.ndarray, dict]:
    """The final word-topic table and the counts of the final assignments in checkpoint ``parts``."""
    states = {k: v for name, part in parts.items() if name.startswith("worker-")
              for k, v in part.load().items() if k.startswith("task.")}
    assert M.saved_tasks(states) == 8
    corpus = load_corpus(from_dict(LDAArgs, cfg["app"]["args"], "app.args"))
    final = np.load(run / "word_topic.npy")
    z = np.concatenate([states[M.key(t, "z")] for t in range(8)])
    counts = np.zeros(final.shape, dtype=np.int64)
    np.add.at(counts, (corpus.words, z), 1)
    return final, counts, states


def _lda_job(tmp_path: Path, iterations: int, checkpoints: bool = True, every: int = 3,
             workers: int = 2, every_s: float | None = None, staleness: int = 1) -> tuple[Path, dict]:
    cfg: dict = {"cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": workers},
                 "consistency": {"staleness": staleness}, "comm": {"enabled": True},
                 "tables": {"word_topic": {"rows": 150, "cols": 5, "dtype": "int32"},
                            "topic_summary": {"rows": 1, "cols": 5, "dtype": "int32"}},
                 "app": {"module": "bosen.apps.lda",
                         "args": {"data": "synthetic", "K": 5, "synth_docs": 600, "synth_vocab": 150,
                                  "synth_doc_len": 20.0, "iterations": iterations, "micro_tasks": 8, "seed": 2}}}
    if checkpoints:
        cfg["checkpoint"] = {"every_clocks": every, "keep": 500}  # all kept: the scaled ones are checked
        if every_s is not None:  # a time rule: the servers save only the boundaries rank 0 (or SAVE) picks
            cfg["checkpoint"]["every_s"] = every_s
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(cfg))
    return path, cfg


def _launch(path: Path, run: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``bosen launch``, its output into a file beside ``run`` (``_output`` reads it): a pipe nobody reads
    while the job runs fills with a line per clock and stops the launcher."""
    return subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(path), "--run-dir", str(run), "--no-plot"],
                            stdout=_log(run).open("w"), stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            env=None if env is None else {**os.environ, **env})


def _log(run: Path) -> Path:
    return run.parent / f"{run.name}.launch.out"


def _output(p: subprocess.Popen, run: Path, timeout: float) -> str:
    """The launcher's output once it has ended (within ``timeout`` s)."""
    p.wait(timeout=timeout)
    return _log(run).read_text()


def _wait_clock(p: subprocess.Popen, run: Path, clock: int, timeout: float = 90) -> None:
    """Until worker 0 reported ``clock`` (the job runs, past its start)."""
    deadline = time.monotonic() + timeout
    while True:
        assert p.poll() is None and time.monotonic() < deadline, "the job ended or stalled before it got going"
        try:
            lines = (run / "workers" / "0.jsonl").read_text().splitlines()
            if lines and json.loads(lines[-1]).get("clock", 0) >= clock:
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.02)


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def _every_checkpoint_and_the_end_exact(run: Path, cfg: dict, iterations: int, redone: bool = False) -> list[int]:
    """Each checkpoint's word-topic table equals the counts of its workers' assignments, and the final
    table the counts of the final assignments (2 servers at the end, the last checkpoint at the end).
    With ``redone``, checkpoints whose server parts were saved before a lost worker's take-back (in
    (C, T] of its replacement: corrections beside them, docs/recovery.md) are left out: they hold the
    lost process's ticks, their worker part the redo's. Returns the clocks checked."""
    base = run / "checkpoints"
    assert checkpoint.clocks(base)[0] == iterations + 2
    checked = []
    for c in checkpoint.clocks(base):
        if redone and list(checkpoint.clock_dir(base, c).glob("redo.*.npz")):
            continue
        checked.append(c)
        table, counts = _part_counts(cfg, checkpoint.check_complete(base, c, 2, None, None))
        np.testing.assert_array_equal(table, counts, err_msg=f"checkpoint at clock {c}")
    final, counts, _ = _final_counts(run, cfg, checkpoint.check_complete(base, iterations + 2, 2, None, None))
    np.testing.assert_array_equal(final, counts)
    return checked


@pytest.mark.timeout(200)
def test_lda_job_scaled_2_3_2_ends_with_the_counts_of_its_final_assignments(tmp_path):
    """An LDA job (8 micro-tasks, managed communication on, integer counts) scaled 2 -> 3 -> 2 workers
    mid-run: worker 2 joins and takes 2 tasks at one boundary, gives them back and leaves at a later
    one. Every clock counts every token once, the clock records sum 2, then 3, then 2 workers, every
    task sweeps once per mini-batch of every tick wherever it ran, and the final word-topic table is
    exactly the counts of the final assignments (nothing counted twice or lost in the moves). Before
    that, more workers than tasks and a run directory without a launcher are refused. The checkpoints made
    while 3 workers ran record ranks 0-2 as their makers, and the newest made by 3 servers resumes with
    the config's 2 servers and 2 workers, ending exact too."""
    iterations = 1000  # long enough for both steps: a joiner loads its data before the boundary is proposed
    # a checkpoint every 6 clocks (1002 is a multiple: the last is at the end); each costs every process
    # some 20 ms of CPU, the most of this job's clocks at every 3
    path, cfg = _lda_job(tmp_path, iterations, every=6)
    run = (tmp_path / "run").resolve()
    with pytest.raises(ScaleError, match="no running launcher"):
        bosen.scale(run, workers=3)
    p = _launch(path, run)
    try:
        _wait_clock(p, run, 5)
        with pytest.raises(ScaleError, match="the app has 8 micro-tasks .* so at most 8 workers"):
            bosen.scale(run, workers=9)
        lines: list[str] = []
        up = bosen.scale(run, workers=3, servers=3, out=lines.append)
        assert "the job runs with 3 workers (ranks [0, 1, 2])" in lines[-1], lines
        assert any("the job runs on 3 servers" in x for x in lines), lines
        # the joiner was started ahead: it loaded its data before the boundary was proposed
        said = [next(i for i, x in enumerate(lines) if w in x) for w in ("ready", "proposed clock", "join at clock")]
        assert said == sorted(said), lines
        r = subprocess.run([sys.executable, "-m", "bosen", "scale", str(run), "--workers", "2", "--servers", "2"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "the job runs on 2 servers" in r.stdout, r.stdout
        assert "ranks [2] leave" in r.stdout and "the job runs with 2 workers (ranks [0, 1])" in r.stdout, r.stdout
        out = _output(p, run, 150)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    assert up < 60
    moved = [int(m) for m in re.findall(r"committed: micro-tasks move at clock (\d+)", out)]
    assert len(moved) == 2 and moved[0] < moved[1], out[-3000:]
    b1, b2 = moved
    last = checkpoint.clocks(run / "checkpoints")[0]
    assert last == iterations + 2  # 2 opening clocks (staleness 1)
    final, counts, states = _final_counts(run, cfg, checkpoint.check_complete(run / "checkpoints", last, 2, 2, None))
    args: LDAArgs = from_dict(LDAArgs, cfg["app"]["args"], "app.args")
    for t in range(8):
        assert int(states[M.key(t, "sweeps")][0]) == iterations * args.batches(2), t
    corpus = load_corpus(args)
    np.testing.assert_array_equal(final, counts)
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    clocks = [r for r in recs if r.get("kind") == "clock" and "tokens" in r]
    assert all(r["tokens"] == corpus.n_tokens for r in clocks)
    workers = [r["workers"] for r in clocks]
    assert workers == [2] * (b1 - clocks[0]["clock"]) + [3] * (b2 - b1) + [2] * (clocks[-1]["clock"] + 1 - b2), workers
    # the checkpoints made while 3 workers ran record their makers; each holds every task once
    scaled = [c for c in checkpoint.clocks(run / "checkpoints") if b1 < c <= b2]
    assert scaled
    for c in checkpoint.clocks(run / "checkpoints"):
        ranks = checkpoint.checkpoint_ranks(checkpoint.clock_dir(run / "checkpoints", c))
        assert ranks == ([0, 1, 2] if c in scaled else [0, 1]), (c, ranks)
        parts = checkpoint.check_complete(run / "checkpoints", c, 2, None, None, verify=False)
        assert sorted(t for ts in checkpoint.tasks_by_worker(parts).values() for t in ts) == list(range(8))
    # servers joined before the first worker step and left before the second: the checkpoints of a
    # third server's time record the three
    three = [c for c in scaled if checkpoint.recorded_servers(checkpoint.clock_dir(run / "checkpoints", c)) == 3]
    assert three and three[-1] == scaled[-1], (three, scaled)  # newest first: the oldest of them
    # and the newest one made by three servers (and ranks 0, 1, 2) resumes with the config's two servers
    # and two workers: each server takes the rows the config's map gives it from all three parts, and
    # every task goes on from its saved chain
    for c in checkpoint.clocks(run / "checkpoints"):
        if c > three[0]:
            shutil.rmtree(checkpoint.clock_dir(run / "checkpoints", c))
    (run / "word_topic.npy").unlink()
    r = subprocess.run([sys.executable, "-m", "bosen", "launch", str(path), "--resume", str(run), "--no-plot"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"resuming from the checkpoint at clock {three[0]}" in r.stdout, r.stdout + r.stderr
    final, counts, _ = _final_counts(run, cfg, checkpoint.check_complete(run / "checkpoints", last, 2, 2, None))
    np.testing.assert_array_equal(final, counts)


@pytest.mark.timeout(120)
def test_impossible_requests_are_refused_naming_why(tmp_path):
    """A job without checkpoints, fewer than 1 worker or server, more servers than partitions, nothing
    asked; a request of servers and workers is checked whole: its refused workers part starts no server."""
    path, _ = _lda_job(tmp_path, 100_000, checkpoints=False)  # runs until killed: the requests never race its end
    run = (tmp_path / "run").resolve()
    p = _launch(path, run)
    try:
        _wait_clock(p, run, 3)
        for kw, msg in [({"workers": 3}, "this job makes no checkpoints"),
                        ({"workers": 0}, "a job needs at least 1 worker"),
                        ({"servers": 0}, "a job needs at least 1 server"),
                        ({"servers": 300}, "in 256 partitions .* so at most 256 servers"),
                        ({}, "nothing to scale"),
                        ({"servers": 3, "workers": 3}, "this job makes no checkpoints")]:
            with pytest.raises(ScaleError, match=msg):
                bosen.scale(run, **kw)
        lines: list[str] = []
        bosen.scale(run, servers=2, out=lines.append)
        assert lines == ["nothing to do: the job already has that shape"]  # still its 2 servers
        assert p.poll() is None  # refused requests leave the job running
    finally:
        _stop(p)


@pytest.mark.timeout(120)
def test_a_request_in_the_jobs_last_clocks_is_refused_and_the_job_ends_exact(tmp_path):
    """An LDA job whose training ends at clock 20 (18 iterations after 2 opening clocks), worker 1 held
    before its CLOCK(19) ($BOSEN_FAULT=hold-before-clock): any boundary the scaler could propose now is
    20 or later (a scale-in's is the checkpoint boundary 20), where no tick runs after the move and
    a worker reads no plan past it (a leaver would wait there for a release, a joiner for hand-offs,
    that never come). So a scale-in (the command) and a scale-out (``bosen.scale``) are refused at once,
    saying the job ends first and nothing moved; released, the job ends with its 2 workers, every
    checkpoint and the final table exactly the counts of their assignments."""
    iterations, every = 18, 10
    path, cfg = _lda_job(tmp_path, iterations, every=every)
    run = (tmp_path / "run").resolve()
    release = tmp_path / "release"
    p = _launch(path, run, env={"BOSEN_FAULT": f"hold-before-clock:1:{iterations + 1}:{release}"})
    try:
        _until(p, run, (tmp_path / "release.held").exists, "worker 1 did not hold before its CLOCK(19)")
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "bosen", "scale", str(run), "--workers", "1"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode != 0, r.stdout + r.stderr
        said = r.stdout + r.stderr
        b = re.search(r"training ends at clock 20 \(worker \d\), at or before clock (\d+), the earliest", said)
        assert b and int(b.group(1)) >= 20, said  # 2 past the newest clock seen (the closing barrier's 21: 30)
        assert "too few clocks remain; nothing moved" in said, said
        with pytest.raises(ScaleError, match="the job's training ends at clock 20 .* too few clocks remain"):
            bosen.scale(run, workers=3)
        assert not (run / "tasks" / "plan.json").exists()  # nothing was proposed, no joiner started
        print(f"refused in {time.monotonic() - t0:.1f}s")
        release.write_text("go")
        out = _output(p, run, 90)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    assert "scale:" not in out  # no step began
    _every_checkpoint_and_the_end_exact(run, cfg, iterations)


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_joined_server_killed_after_its_checkpoint_is_replaced_and_the_counts_stay_exact(tmp_path):
    """Servers 2 -> 3 in a running LDA job; once a checkpoint holds the third server's part (saved under
    the new partition map), SIGKILL it: the launcher starts a replacement that takes the job's servers
    and map from a running server and restores that part, the workers resend, and the job ends with
    the word-topic table exactly the counts of its final assignments."""
    iterations = 300
    path, cfg = _lda_job(tmp_path, iterations)
    run = (tmp_path / "run").resolve()
    go = tmp_path / "go"  # both workers hold before CLOCK(4) until the joined server has both (a quiet
    # machine once ran the whole job before the server started: a finished rank never joins it)
    p = _launch(path, run, env={"BOSEN_FAULT": f"hold-before-clock:0:4:{go};hold-before-clock:1:4:{go}"})
    _, failed, step = _scale_thread(run, servers=3)
    try:
        _until(p, run, (tmp_path / "go.held").exists, "the workers did not hold before CLOCK(4)")
        step.start()
        log = run / "logs" / "server-2.log"
        _until(p, run, lambda: log.exists() and "joined (2/2)" in log.read_text(), "the joined server lacks a client")
        go.write_text("go")
        step.join(timeout=120)
        assert not step.is_alive() and not failed, failed
        deadline = time.monotonic() + 60
        while True:  # a complete checkpoint made by the three servers
            made = [c for c in checkpoint.clocks(run / "checkpoints")
                    if checkpoint.recorded_servers(checkpoint.clock_dir(run / "checkpoints", c)) == 3
                    and (checkpoint.clock_dir(run / "checkpoints", c) / checkpoint.part_name("server", 2)
                         / checkpoint.META).exists()]
            if made:
                break
            assert time.monotonic() < deadline and p.poll() is None, "no checkpoint of three servers"
            time.sleep(0.05)
        joined = [c for c, cl in descendants(p.pid) if "bosen.server" in cl and "--join" in cl]
        assert len(joined) == 1, joined
        joined[0].kill()
        out = _output(p, run, 120)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    assert "server-2.1 replaces server-2" in out, out[-3000:]
    last = checkpoint.clocks(run / "checkpoints")[0]
    final, counts, _ = _final_counts(run, cfg, checkpoint.check_complete(run / "checkpoints", last, 2, 2, None))
    np.testing.assert_array_equal(final, counts)


@pytest.mark.timeout(150)
def test_a_server_joins_after_a_worker_finished_and_the_launcher_answers_while_the_move_is_held(tmp_path):
    """Servers 2 -> 3 in an LDA job whose training ends at clock 300, both workers held before their last
    clock (301, the closing barrier's, no checkpoint boundary) and the launcher's partition move held
    before its plan ($BOSEN_FAULT=hold-move): the joined server counted both ranks (server 0's STATUS
    when it started). Meanwhile the launcher answers a status request (the step in its move phase) and
    refuses a second scale request, saying one is in progress; worker 1 is let go, ends its training,
    says BYE to servers 0 and 1 and exits, without ever connecting to the new server. The launcher tells
    every server, the joined one too, that rank 1 left (LEFT), so the move no longer waits for its
    PAUSED there (it used to wait until it timed out, and the job's last BYE to that server with it):
    it completes with worker 0 alone, and the job ends with the final table exactly the counts of the
    final assignments (read from the three servers) and every checkpoint exact."""
    iterations = 298  # training ends at 300, a checkpoint boundary; 301 is not: worker 1's BYE is not held
    path, cfg = _lda_job(tmp_path, iterations)
    run = (tmp_path / "run").resolve()
    go0, go1, move = tmp_path / "go0", tmp_path / "go1", tmp_path / "move"
    p = _launch(path, run, env={"BOSEN_FAULT": f"hold-before-clock:0:301:{go0};hold-before-clock:1:301:{go1};"
                                               f"hold-move:{move}"})
    lines, failed, step = _scale_thread(run, servers=3)
    try:
        _until(p, run, lambda: (tmp_path / "go0.held").exists() and (tmp_path / "go1.held").exists(),
               "the workers did not hold before their last clock")
        step.start()
        _until(p, run, (tmp_path / "move.held").exists, "the partition move did not hold before its plan")
        said = launcher_status(run)  # answered while the step's move is under way
        assert said["scaling"]["phase"] == "move" and said["servers"] == 3 and said["running"] == [0, 1], said
        assert "to 3 servers" in said["scaling"]["what"], said
        with pytest.raises(ScaleError, match=r"a scale is in progress \(step \d+: to 3 servers, move\)"):
            bosen.scale(run, workers=3)
        go1.write_text("go")  # worker 1 finishes: BYE to servers 0 and 1, never connected to server 2
        _until(p, run, lambda: launcher_status(run)["running"] == [0], "worker 1 did not finish")
        move.write_text("go")
        step.join(timeout=120)
        assert not step.is_alive() and not failed, failed
        assert "the job runs on 3 servers" in lines[-1], lines
        assert launcher_status(run)["scaling"] is None
        go0.write_text("go")
        out = _output(p, run, 90)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    joined = (run / "logs" / "server-2.log").read_text()
    assert "worker ranks [1] left the job" in joined, joined[-2000:]
    _every_checkpoint_and_the_end_exact(run, cfg, iterations)


@pytest.mark.timeout(150)
def test_a_failed_servers_step_stops_its_joined_server_and_the_job_runs_on_exact(tmp_path):
    """Servers 2 -> 3 whose partition move fails before its plan ($BOSEN_FAULT=hold-move, its file
    saying ``fail``; worker 0 held before clock 31 meanwhile): the step's error names the joined
    server as stopped, and the launcher's status shows 2 servers again. A second step 2 -> 3 fails
    after every server took the new map (the file says ``fail-after-map``): the launcher keeps the
    joined server and says the move took effect, and its status shows 3 servers. Killed once a
    checkpoint holds its part (worker 0 held before clock 37), the joined server is replaced under the
    job's new servers and map. Then servers 3 -> 2, failing after the map too: the step took effect as
    well, the leaving server (the replacement, server-2.2) leaves and exits, status shows 2 servers; server 1,
    killed at once, is replaced under the 2-server map of the move (not the config's), and the job
    finishes with every checkpoint and the end exact."""
    iterations = 40
    path, cfg = _lda_job(tmp_path, iterations)
    run = (tmp_path / "run").resolve()
    go, move = tmp_path / "go", tmp_path / "move"
    go2 = tmp_path / "go2"  # worker 0 holds again before clock 37, the joined server then killed
    p = _launch(path, run, env={"BOSEN_FAULT": f"hold-before-clock:0:31:{go};hold-before-clock:0:37:{go2};"
                                               f"hold-move:{move}"})
    lines, failed, step = _scale_thread(run, servers=3)
    try:
        _wait_clock(p, run, 3)
        step.start()
        _until(p, run, (tmp_path / "move.held").exists, "the partition move did not hold before its plan")
        assert launcher_status(run)["servers"] == 3
        move.write_text("fail")
        step.join(timeout=60)
        assert not step.is_alive() and len(failed) == 1, (failed, lines)
        assert re.search(r"failed on purpose.*server-2 stopped, back to 2 servers", str(failed[0])), failed
        said = launcher_status(run)
        assert said["servers"] == 2 and said["scaling"] is None, said
        _took_effect_after_failing(run, move, 3)
        said = launcher_status(run)
        assert said["servers"] == 3 and said["scaling"] is None, said
        go.write_text("go")
        ck = run / "checkpoints"
        _until(p, run, lambda: (checkpoint.clock_dir(ck, 36) / checkpoint.part_name("server", 2) / checkpoint.META)
               .exists() and 36 in checkpoint.clocks(ck), "no checkpoint at clock 36 with the joined server's part")
        joined = [c for c, cl in descendants(p.pid) if "bosen.server" in cl and "--join" in cl]
        assert len(joined) == 1, joined
        joined[0].kill()  # replaced with the job's 3 servers and new map (--shape-from), not the config's 2
        _until(p, run, lambda: "replaces server-2" in _log(run).read_text(), "the joined server was not replaced")
        lines, failed, step = _scale_thread(run, servers=2)  # the file still says fail-after-map
        step.start()
        step.join(timeout=90)
        assert not step.is_alive() and not failed, (failed, lines)
        assert re.search(r"the move took effect: the job runs on 2 servers .*failed on purpose after its map"
                         r".*; server-2\.2 exited$", lines[-1]), lines  # the joined one's replacement
        said = launcher_status(run)
        assert said["servers"] == 2 and said["scaling"] is None, said
        servers = [cl for _, cl in descendants(p.pid) if "bosen.server" in cl]
        assert len(servers) == 2 and not any("--join" in cl or "--shape-from" in cl for cl in servers), servers
        _kill_server_1(p, run)  # its replacement takes the job's servers and map from server 0
        go2.write_text("go")
        out = _output(p, run, 90)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    _every_checkpoint_and_the_end_exact(run, cfg, iterations)


@pytest.mark.timeout(120)
def test_a_servers_step_cut_off_mid_map_stops_the_job_naming_the_maps(tmp_path):
    """Servers 2 -> 3 whose partition move fails once server 0 took the new map and before any other
    server was sent it ($BOSEN_FAULT=hold-move, its file saying ``fail-mid-map``): the clients wait
    for a MAP from every server, which the others never send, so the job cannot go on. The launcher
    stops it (exit 1, no hang) with an error that says the step failed part-way and names each map
    version's servers, and every process of the job has ended."""
    path, _ = _lda_job(tmp_path, 100_000, checkpoints=False)  # runs until stopped
    run = (tmp_path / "run").resolve()
    move = tmp_path / "move"
    move.write_text("fail-mid-map")  # no hold before the plan: the move fails in its map
    p = _launch(path, run, env={"BOSEN_FAULT": f"hold-move:{move}"})
    lines, failed, step = _scale_thread(run, servers=3)
    try:
        _wait_clock(p, run, 3)
        seen: dict[int, tuple[psutil.Process, list[str]]] = {}
        step.start()
        deadline = time.monotonic() + 90
        while p.poll() is None and time.monotonic() < deadline:  # every process of the job, the joined server too
            seen.update((c.pid, (c, cl)) for c, cl in descendants(p.pid) if cl)  # [] while a fork starts
            time.sleep(0.05)
        out = _output(p, run, 1)
        step.join(timeout=30)
    finally:
        _stop(p)
    assert p.returncode == 1, out[-3000:]
    a0, a1 = config_mod.load(run / "config.yaml").cluster.servers
    found = re.search(r"job failed: a servers scale step failed part-way: --servers 3: the partition move failed on "
                      r"purpose with server 0 alone on the new map .*; then servers follow different partition maps "
                      rf"\(version (\d+): {re.escape(a1)}, (\S+); version (\d+): {re.escape(a0)}\)", out)
    assert found and int(found[3]) == int(found[1]) + 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert not step.is_alive() and len(failed) == 1, (failed, lines)
    assert re.search(r"different partition maps|the job ended", str(failed[0])), failed
    assert any("bosen.server" in cl and "--join" in cl for _, cl in seen.values()), seen
    alive = []
    for c, cl in seen.values():
        with contextlib.suppress(psutil.Error):
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE:
                alive.append(cl)
    assert not alive, alive  # servers (the joined one too) and workers


@pytest.mark.timeout(120)
def test_a_launcher_stopped_while_its_partition_move_is_held_stops_cleanly(tmp_path):
    """SIGTERM to a launcher whose servers step is held before its plan ($BOSEN_FAULT=hold-move): the
    move on its own thread is given up, the launcher stops every process and exits 130 saying so, with
    no traceback (a REP control socket once raised "Operation cannot be accomplished in current state"
    on the way out), and ``bosen scale`` says the job ended."""
    path, _ = _lda_job(tmp_path, 100_000, checkpoints=False)  # runs until stopped
    run = (tmp_path / "run").resolve()
    move = tmp_path / "move"
    p = _launch(path, run, env={"BOSEN_FAULT": f"hold-move:{move}"})
    lines, failed, step = _scale_thread(run, servers=3)
    try:
        _wait_clock(p, run, 3)
        step.start()
        _until(p, run, (tmp_path / "move.held").exists, "the partition move did not hold before its plan")
        assert launcher_status(run)["scaling"]["phase"] == "move"
        p.send_signal(signal.SIGTERM)
        out = _output(p, run, 60)
        step.join(timeout=30)
    finally:
        _stop(p)
    assert p.returncode == 130, out[-3000:]
    assert "stopped the job; all processes stopped" in out and "Traceback" not in out, out[-3000:]
    assert not step.is_alive() and len(failed) == 1 and "the job ended" in str(failed[0]), (failed, lines)


class _Worker:
    def __init__(self, returncode: int | None) -> None:
        self.returncode = returncode


class _Host:
    """The launcher as the scaler sees it (``Host``), for its control socket alone: a job whose workers
    have all finished."""

    def __init__(self, run: Path) -> None:
        self.config = build({"cluster": {"servers": ["127.0.0.1:1", "127.0.0.1:2"], "workers": 2},
                             "tables": {"t": {"rows": 4, "cols": 1}}, "checkpoint": {"every_clocks": 10},
                             "app": {"module": "bosen.apps.lda", "args": {"micro_tasks": 8}}})
        self.run_dir = run
        self.workers = [_Worker(0), _Worker(0)]
        self.cluster = type("Cluster", (), {"addresses": list(self.config.cluster.servers)})()
        self.dropped: set[int] = set()
        self.servers_changed = False
        self.security = None
        self.merger = None
        self.ray_job = None

    def say(self, msg: str) -> None:
        pass

    def start_joiner(self, rank: int) -> None:
        raise AssertionError("nothing starts in a finished job")


def _ask(address: str, req: dict) -> dict:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.REQ)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(json.dumps(req).encode())
        assert sock.poll(5000), f"no answer to {req}"
        return json.loads(sock.recv())
    finally:
        sock.close(0)
        ctx.term()


def test_the_control_socket_survives_a_cut_off_answer_and_a_finished_job_refuses_to_scale(tmp_path, monkeypatch):
    """The launcher's control socket is a ROUTER: a request whose answer was cut off (the launcher
    stopping inside it: a REP socket was then left mid-lockstep and its next poll raised ZeroMQ's
    "Operation cannot be accomplished in current state") leaves the next request answered and the
    poll raising nothing, also once closed. In a job whose workers have all finished, a scale request
    is refused, saying the job has finished and nothing moved."""
    scaler = Scaler(_Host(tmp_path))  # type: ignore[arg-type]
    address = json.loads((tmp_path / "control.json").read_text())["address"]
    answer = scaler._answer
    try:
        def stopped(req: dict) -> dict:
            raise KeyboardInterrupt  # as SIGINT inside an answer

        monkeypatch.setattr(scaler, "_answer", stopped)
        cut = zmq.Context()
        lost = cut.socket(zmq.REQ)
        lost.setsockopt(zmq.LINGER, 0)
        lost.connect(address)
        lost.send(json.dumps({"op": "status"}).encode())
        deadline = time.monotonic() + 5
        with pytest.raises(KeyboardInterrupt):
            while time.monotonic() < deadline:
                scaler.poll()
                time.sleep(0.01)
        lost.close(0)
        cut.term()
        monkeypatch.setattr(scaler, "_answer", answer)
        got: list[dict] = []
        t = threading.Thread(target=lambda: got.extend([_ask(address, {"op": "status"}),
                                                        _ask(address, {"op": "scale", "servers": 3}),
                                                        _ask(address, {"op": "scale", "workers": 1})]), daemon=True)
        t.start()
        while t.is_alive():
            scaler.poll()  # raises nothing
            time.sleep(0.01)
        assert got[0]["ok"] and got[0]["running"] == [] and got[0]["scaling"] is None, got
        for reply, what in zip(got[1:], ("--servers 3", "--workers 1"), strict=True):
            assert not reply["ok"] and reply["error"] == (f"{what}: the job has finished (every worker ended its "
                                                           "training): nothing moved"), reply
    finally:
        scaler.close()
    scaler.poll()  # closed: nothing to answer, nothing raised
    assert not (tmp_path / "control.json").exists()


def _server(p: subprocess.Popen, rank: int) -> psutil.Process:
    """The launcher's server process of config rank ``rank`` (not one joined by ``bosen scale``)."""
    found = [c for c, cl in descendants(p.pid)
             if "bosen.server" in cl and "--rank" in cl and cl[cl.index("--rank") + 1] == str(rank)]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.slow
@pytest.mark.timeout(150)
def test_a_server_killed_after_a_worker_joined_is_replaced_and_the_counts_stay_exact(tmp_path):
    """Workers 2 -> 3 in a running LDA job (integer counts, managed communication), then at once SIGKILL
    of server 1 (most often before its next part: checkpoints every 100 clocks): the launcher starts a
    replacement that takes the job's worker ranks (rank 2, and the clock it joined at) from server 0's
    STATUS and restores its newest part; every worker, the joined one too, resends what it sent server
    1 since that part, and the job ends with the word-topic table exactly the counts of its final
    assignments, as is every checkpoint's."""
    iterations = 998  # long enough for the joiner to start under load; its last checkpoint is at its end (+2)
    path, cfg = _lda_job(tmp_path, iterations, every=100)
    run = (tmp_path / "run").resolve()
    p = _launch(path, run)
    try:
        _wait_clock(p, run, 3)
        bosen.scale(run, workers=3, out=None)
        _server(p, 1).kill()
        out = _output(p, run, 120)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    assert "server-1.1 replaces server-1" in out, out[-3000:]
    _every_checkpoint_and_the_end_exact(run, cfg, iterations)
    log = (run / "logs" / "server-1.1.log").read_text()
    print("the replacement:", re.findall(r"resumed from .*|replacing server .*", log))


def test_a_scale_in_boundary_is_a_checkpoint_boundary_where_the_job_makes_checkpoints():
    """Leavers leave at the next checkpoint boundary at or after the clock asked (the servers' part
    there holds all they sent); a step without leavers, or a job without checkpoints, keeps it."""
    base = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 3}, "tables": {"t": {"rows": 4, "cols": 1}}}
    ck = build({**base, "checkpoint": {"every_clocks": 10}})
    assert [leave_boundary(c, ck, True) for c in (7, 10, 11)] == [10, 10, 20]
    assert leave_boundary(7, ck, False) == 7 and leave_boundary(7, build(base), True) == 7


@pytest.mark.timeout(120)
def test_a_server_killed_after_a_worker_left_is_replaced_and_the_counts_stay_exact(tmp_path):
    """Workers 3 -> 2 in a running LDA job with checkpoints under a time rule (``every_s`` of an hour:
    rank 0 picks no boundary; integer counts, managed communication): the boundary B where rank 2 leaves
    is a checkpoint boundary, the launcher asks every server for a part there (SAVE), and rank 2 says
    BYE only once every server's part of B is on disk, so that part holds every update it made; meanwhile it has
    ended its clocks at B (BYE "fc"), so the others run on without waiting for it. SIGKILL
    of server 1 right after the step: its replacement restores the part of B (which the leaver needs no
    resend for, where it used to be refused), and the job ends with the word-topic table exactly the
    counts of its final assignments (the workers' parts of the last clock: workers save every boundary),
    as the part of B's is."""
    iterations, every = 98, 10  # the workers' last parts at the end (+2 opening clocks)
    path, cfg = _lda_job(tmp_path, iterations, every=every, workers=3, every_s=3600.0)
    run = (tmp_path / "run").resolve()
    p = _launch(path, run)
    try:
        _wait_clock(p, run, 3)
        lines: list[str] = []
        bosen.scale(run, workers=2, out=lines.append)
        _server(p, 1).kill()
        out = _output(p, run, 100)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    b = int(re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines))[0])
    assert b % every == 0, lines
    said = f"every server's checkpoint part of clock {b} is on disk: worker(s) [2] leave"
    assert any(said in x for x in lines), lines
    for i in (0, 1):  # while it waited for that, its clock held nobody back (it had ended its clocks at B)
        log = (run / "logs" / f"server-{i}.log").read_text()
        assert f"client rank 2 ends its clocks at {b}:" in log, log[-2000:]
    assert "server-1.1 replaces server-1" in out, out[-3000:]
    restored = re.findall(r"resumed from \S+ at clock (\d+)", (run / "logs" / "server-1.1.log").read_text())
    assert restored and int(restored[0]) == b, (restored, b)  # a part the leaver needs no resend for
    base = run / "checkpoints"
    table, counts = _part_counts(cfg, checkpoint.check_complete(base, b, 2, None, None))
    np.testing.assert_array_equal(table, counts)
    last = checkpoint.clock_dir(base, iterations + 2)
    final, counts, _ = _final_counts(run, cfg, {f"worker-{r}": checkpoint.read_part(last / f"worker-{r}")
                                                for r in range(2)})
    np.testing.assert_array_equal(final, counts)



@pytest.mark.timeout(150)
def test_a_worker_lost_below_a_replaced_servers_take_back_floor_restarts_the_job_and_the_counts_stay_exact(tmp_path):
    """Workers 3 -> 2 at B = 20 in a running LDA job (checkpoints every 10 clocks; integer counts,
    managed communication), worker 0 writing no checkpoint part from 20 on ($BOSEN_FAULT=no-parts-from),
    so the newest complete checkpoint stays at C = 10. SIGKILL of server 1 after the step: rank 2 left
    after C, so its replacement restores its own part of B (S = 20), and the updates of ticks 10..19 are
    in its values, not in its take-back log. Worker 0 is then SIGKILLed: a replacement restarted from C
    would have its ticks 10..19 counted twice on server 1, so the launcher restarts the whole job from
    C instead (every process stopped, all resumed from C, as ``bosen launch --resume`` does), and every
    checkpoint and the final table are exactly the counts of their assignments. Held by
    $BOSEN_FAULT=hold-before-clock: every worker before CLOCK(11) while the step is agreed, worker 1
    before CLOCK(25) until the restart (so the servers stay below 25 and no part past S exists), worker 0
    killed once it has reported a clock worker 1 has not: no progress line sums that clock over worker 0
    alone (before, the launcher printed the clocks not every worker had reported as it restarted:
    `clock 26 | objective -3834.6` against about -46000, one worker's part), and every objective printed
    is in line with the run's."""
    iterations, every = 48, 10  # the last checkpoint at the end (+2)
    path, cfg = _lda_job(tmp_path, iterations, every=every, workers=3)
    run = (tmp_path / "run").resolve()
    go = tmp_path / "go"
    fault = ";".join([f"no-parts-from:0:{2 * every}", f"hold-before-clock:1:{2 * every + 5}:{go}",
                      *(f"hold-before-clock:{r}:{every + 1}:{tmp_path / f'start{r}'}" for r in range(3))])
    p = _launch(path, run, env={"BOSEN_FAULT": fault})
    lines, failed, step = _scale_thread(run, workers=2)
    try:
        _scale_while_held(p, run, tmp_path, step)
        step.join(timeout=120)
        assert not failed and not step.is_alive(), (failed, lines)
        assert any(f"checkpoint part of clock {2 * every} is on disk: worker(s) [2] leave" in x for x in lines), lines
        _kill_server_1(p, run)
        # worker 0 has reported a clock that worker 1, held, has not (and will not before the restart): the
        # restart redoes it, and a record of it summed over worker 0 alone would carry part of the objective
        _until(p, run, lambda: go.with_name("go.held").exists() and _newest_record(run, 0) > _newest_record(run, 1),
               "worker 0 did not get ahead of held worker 1")
        complete = _newest_record(run, 1)
        first_worker(p.pid, 0).kill()
        _until(p, run, lambda: "restarting the whole job" in _log(run).read_text(), "the job was not restarted")
        go.write_text("go")
        out = _output(p, run, 120)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    said = (f"worker-0 was killed by SIGKILL: server 1 cannot take back its updates of ticks {every}..{2 * every - 1}"
            f" (its take-back log starts at clock {2 * every}); restarting the whole job from its newest complete "
            "checkpoint")
    assert said in out, out[-3000:]
    # every clock printed is one every worker reported: none past worker 1's before the restart, and each
    # objective in line with the run's at that clock (a restarted clock's trajectory differs by a few %,
    # one worker's part of it by 5-95 %: rank 0 scores most words)
    progress = r"clock +(\d+) \| objective (-?[\d.]+)"
    assert max(int(c) for c, _ in re.findall(progress, out.split(said)[0])) <= complete, out.split(said)[0][-2000:]
    records = {r["clock"]: r for r in read_metrics(run) if r["kind"] == "clock"}
    assert {r["workers"] for r in records.values()} == {3}, records
    printed = [(int(c), float(o)) for c, o in re.findall(progress, out)]
    off = [(c, o, records[c]["objective"]) for c, o in printed if abs(o / records[c]["objective"] - 1) > 0.05]
    assert printed and not off, off
    replacement = (run / "logs" / "server-1.1.log").read_text()
    assert f"server 1 restores its newest part (clock {2 * every})" in replacement, replacement[-3000:]
    _every_checkpoint_and_the_end_exact(run, cfg, iterations)
    assert f"resuming from the checkpoint at clock {every} " in out.split(said)[1], out[-3000:]
    assert "worker-0.1" not in out, out[-3000:]  # no replacement: the whole job resumed


def _newest_record(run: Path, rank: int) -> int:
    """The newest clock worker ``rank`` reported (-1: none yet)."""
    try:
        lines = (run / "workers" / f"{rank}.jsonl").read_text().splitlines()
    except OSError:
        return -1
    return max((json.loads(x)["clock"] for x in lines if x.endswith("}")), default=-1)


@pytest.mark.timeout(150)
def test_a_worker_lost_after_a_partition_move_restarts_the_job_and_the_counts_stay_exact(tmp_path):
    """Servers 2 -> 3 in a running LDA job (checkpoints every 10 clocks; integer counts, managed
    communication). The server joins at J = 12 (both workers held before CLOCK(13)): it holds none of
    the job's updates before J, so it takes back none from an older checkpoint (STATUS take_back_from =
    J, above the others'). Its partition move is held before the plan ($BOSEN_FAULT=hold-move) until
    the checkpoint at C = 20 is complete and worker 1 holds before CLOCK(25); the move then happens at
    a server clock X >= C. Worker 0 is SIGKILLed after it, before a newer complete checkpoint. Its
    updates of ticks C..X went to the partitions' old owners, whose take-back logs hold rows they no
    longer own, and the new owner's log has none of them: no server can take them back from C, each
    says a clock past the move (take_back_from), and the launcher restarts the whole job from C. Every
    checkpoint and the final table are exactly the counts of their assignments. (Before, worker 0 was
    replaced from 20 and the take-back was wrong: docs/recovery.md, "A worker lost after a partition
    move".)"""
    iterations, every = 48, 10  # the last checkpoint at the end (+2)
    path, cfg = _lda_job_on_12_partitions(tmp_path, iterations, every)
    run = (tmp_path / "run").resolve()
    go, move = tmp_path / "go", tmp_path / "move"
    fault = ";".join([f"hold-move:{move}", f"hold-before-clock:1:{2 * every + 5}:{go}",
                      *(f"hold-before-clock:{r}:13:{tmp_path / f'start{r}'}" for r in range(2))])
    p = _launch(path, run, env={"BOSEN_FAULT": fault})
    lines, failed, step = _scale_thread(run, servers=3)
    try:
        _until(p, run, lambda: all((tmp_path / f"start{r}.held").exists() for r in range(2)),
               "the workers did not hold before CLOCK(13)")
        addresses = config_mod.load(run / "config.yaml").cluster.servers
        # their CLOCK(12) applied (sent before they held, it may still be on its way): the join is at 12
        _until(p, run, lambda: status_mod.query(addresses[0], timeout=10.0)["clock"] == 12, "server 0 is not at 12")
        step.start()
        _until(p, run, (tmp_path / "move.held").exists, "the partition move did not hold before its plan")
        joined = [cl[cl.index("--join") + 1] for _, cl in descendants(p.pid) if "bosen.server" in cl and "--join" in cl]
        assert len(joined) == 1, joined
        addresses = [*addresses, joined[0]]

        def reach() -> list[int]:
            return [status_mod.query(a, timeout=10.0)["take_back_from"] for a in addresses]

        before = reach()
        assert before[2] == 12 and max(before[:2]) < 12, before  # the joined server's clock at its start
        for r in range(2):
            (tmp_path / f"start{r}").write_text("go")
        _until(p, run, (tmp_path / "go.held").exists, "worker 1 did not hold before CLOCK(25)")
        # C = 20 complete; with worker 1 below 25 no newer one can be
        _until(p, run, lambda: _newest_complete(run) == 2 * every, f"the checkpoint at {2 * every} did not complete")
        move.write_text("go")
        step.join(timeout=120)
        assert not failed and not step.is_alive(), (failed, lines)
        assert "the job runs on 3 servers" in lines[-1], lines
        after = reach()
        assert all(r > 2 * every for r in after), after  # past the move: none takes back from C
        first_worker(p.pid, 0).kill()
        go.write_text("go")
        out = _output(p, run, 120)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    _every_checkpoint_and_the_end_exact(run, cfg, iterations)
    said = re.search(r"worker-0 was killed by SIGKILL: (.*); restarting the whole job from its newest complete "
                     "checkpoint", out)
    assert said, out[-3000:]
    for i in range(3):  # the joined server among them
        assert f"server {i} cannot take back its updates of ticks {2 * every}.." in said.group(1), said.group(1)
    assert f"resuming from the checkpoint at clock {2 * every} " in out[said.end():], out[-3000:]
    assert "worker-0.1" not in out, out[-3000:]  # no replacement: the whole job resumed


@pytest.mark.timeout(150)
def test_a_worker_lost_after_a_partition_move_and_a_newer_checkpoint_is_replaced_under_the_new_map(tmp_path):
    """Servers 2 -> 3 in a running LDA job (12 partitions, checkpoints every 10 clocks) while both
    workers hold before CLOCK(13): the partitions move at clock 12, so every server takes back from
    13 on. Worker 1 then holds before CLOCK(25), and once the checkpoint at 20 is complete worker 0 is
    SIGKILLed: it is replaced from 20 (no restart: every update since 20 went under the new map to
    the server that owns its row), its replacement follows the servers' map (before, it refused it:
    `WELCOME: partition map version 1, but this client follows 0`, and the job failed), and every
    checkpoint and the final table are exactly the counts of their assignments."""
    iterations, every = 38, 10  # the last checkpoint at the end (+2)
    path, cfg = _lda_job_on_12_partitions(tmp_path, iterations, every)
    run = (tmp_path / "run").resolve()
    go = tmp_path / "go"
    fault = ";".join([f"hold-before-clock:1:{2 * every + 5}:{go}",
                      *(f"hold-before-clock:{r}:13:{tmp_path / f'start{r}'}" for r in range(2))])
    p = _launch(path, run, env={"BOSEN_FAULT": fault})
    lines, failed, step = _scale_thread(run, servers=3)
    try:
        _until(p, run, lambda: all((tmp_path / f"start{r}.held").exists() for r in range(2)),
               "the workers did not hold before CLOCK(13)")
        step.start()
        step.join(timeout=120)
        assert not failed and not step.is_alive(), (failed, lines)
        assert "the job runs on 3 servers" in lines[-1], lines
        for r in range(2):
            (tmp_path / f"start{r}").write_text("go")
        _until(p, run, (tmp_path / "go.held").exists, "worker 1 did not hold before CLOCK(25)")
        _until(p, run, lambda: _newest_complete(run) == 2 * every, f"the checkpoint at {2 * every} did not complete")
        first_worker(p.pid, 0).kill()
        go.write_text("go")
        out = _output(p, run, 120)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    assert f"worker-0.1 replaces worker-0: it redoes clocks from {2 * every} on" in out, out[-3000:]
    assert "restarting the whole job" not in out, out[-3000:]
    _every_checkpoint_and_the_end_exact(run, cfg, iterations)
    for i in range(3):  # taken back whole on each server, the joined one too
        log = (run / "logs" / f"server-{i}.log").read_text()
        assert f"row updates of lost worker rank 0 since clock {2 * every}" in log, log[-3000:]
        assert "cannot take back" not in log and "not in its log" not in log, log[-3000:]


def _lda_job_on_12_partitions(tmp_path: Path, iterations: int, every: int) -> tuple[Path, dict]:
    """``_lda_job`` on 12 partitions: a move to 3 servers gives the joined one rows (of the default 256,
    the partitions above each server's share, which move, hold none of the 150 rows)."""
    path, cfg = _lda_job(tmp_path, iterations, every=every)
    cfg["cluster"]["partitions"] = 12
    path.write_text(json.dumps(cfg))
    return path, cfg


def _newest_complete(run: Path) -> int:
    """The clock of the job's newest complete checkpoint (0: none yet)."""
    try:
        return checkpoint.newest_complete(run / "checkpoints", 2, None, None, verify=False)[0]
    except checkpoint.CheckpointError:
        return 0


def _took_effect_after_failing(run: Path, move: Path, servers: int) -> list[str]:
    """A servers step to ``servers`` whose move fails once every server took the new map (``move``, the
    hold-move fault's file, says ``fail-after-map``): the step says it took effect. Its lines."""
    move.write_text("fail-after-map")
    lines, failed, step = _scale_thread(run, servers=servers)
    step.start()
    step.join(timeout=90)
    assert not step.is_alive() and not failed, (failed, lines)
    assert re.search(rf"the move took effect: the job runs on {servers} servers .*failed on purpose after its map",
                     lines[-1]), lines
    return lines


def _kill_server_1(p: subprocess.Popen, run: Path) -> None:
    """SIGKILL server 1 of the launched job and wait until the launcher has started its replacement."""
    _server(p, 1).kill()
    _until(p, run, lambda: "server-1.1 replaces server-1" in _log(run).read_text(), "server 1 was not replaced")


def _scale_thread(run: Path, **shape: int) -> tuple[list[str], list[BaseException], threading.Thread]:
    """A thread (not started) that scales the job at ``run`` to ``shape`` (workers=, servers=): the
    scaler's lines, its exceptions (the test reports them), the thread."""
    lines: list[str] = []
    failed: list[BaseException] = []

    def scale() -> None:
        try:
            bosen.scale(run, out=lines.append, **shape)
        except BaseException as e:  # noqa: BLE001 - the test thread reports it
            failed.append(e)

    return lines, failed, threading.Thread(target=scale, daemon=True)


def _held_scale_in(tmp_path: Path, iterations: int, every: int, rank: int, job: tuple[Path, dict] | None = None,
                   start: int | None = None):
    """A 3-worker LDA job (or ``job``: its config file and data) launched with worker ``rank`` held before
    its CLOCK of a scale-in's boundary (``$BOSEN_FAULT``), and a thread (not started) that scales it to
    2 workers: (cfg, run, release, held, launcher, the scaler's lines, its exceptions, the thread).
    ``start``: every worker also holds before CLOCK(start) until :func:`_scale_while_held` lets it go."""
    path, cfg = job if job is not None else _lda_job(tmp_path, iterations, every=every, workers=3)
    run = (tmp_path / "run").resolve()
    release = tmp_path / "release"
    held = tmp_path / "release.held"
    fault = f"hold-before-leave:{rank}:{release}"
    if start is not None:
        fault += "".join(f";hold-before-clock:{r}:{start}:{tmp_path / f'start{r}'}" for r in range(3))
    p = _launch(path, run, env={"BOSEN_FAULT": fault})
    lines, failed, step = _scale_thread(run, workers=2)
    return cfg, run, release, held, p, lines, failed, step


def _scale_while_held(p: subprocess.Popen, run: Path, tmp_path: Path, step: threading.Thread) -> None:
    """With every worker held before CLOCK(start) (:func:`_held_scale_in`), start the scale-in and let them
    go once it is committed: a short job cannot end before the boundary is agreed (a run at load once
    did, the proposals overtaken by the workers until too few clocks remained)."""
    _until(p, run, lambda: all((tmp_path / f"start{r}.held").exists() for r in range(3)),
           "the workers did not hold before their start clock")
    step.start()

    def committed() -> bool:
        try:
            return json.loads((run / "tasks" / "plan.json").read_text()).get("state") == "committed"
        except (OSError, ValueError):
            return False

    _until(p, run, committed, "the scale-in was not committed while the workers held")
    for r in range(3):
        (tmp_path / f"start{r}").write_text("go")


def _release_and_finish(p, run, release, step, timeout: float) -> str:
    """Let worker 1 go on to B (the hold's file says go) and return the launcher's output once the job
    ends, the scale step's thread joined."""
    release.write_text("go")
    out = _output(p, run, timeout)
    step.join(timeout=30)
    return out


def _leaver_waiting_for_release(p, run, tmp_path, step, held) -> int:
    """Scale 3 -> 2 while worker 1 holds before its CLOCK of the boundary B; once worker 2 (the leaver)
    has ended its clocks at B on every server and waits for a release that no part of B allows yet,
    return B."""
    _scale_while_held(p, run, tmp_path, step)
    _until(p, run, lambda: _held_at(run, held) is not None, "worker 1 did not hold before a committed boundary")
    b = _held_at(run, held)
    addresses = config_mod.load(run / "config.yaml").cluster.servers
    _until(p, run, lambda: all(status_mod.query(a, timeout=10.0)["final_clocks"][2] == b for a in addresses),
           f"worker 2 did not end its clocks at {b} on every server")
    assert not list((run / "tasks").glob("left-*.json"))  # not released: no server has a part of B
    return b


def _held_at(run: Path, held: Path) -> int | None:
    """B where the fault's rank holds, once the scaler committed it (a proposal withdrawn because another
    worker was past it lets the rank go on, and it holds again at the next one)."""
    try:
        b = json.loads(held.read_text())["clock"]
        plan = json.loads((run / "tasks" / "plan.json").read_text())
    except (OSError, ValueError, KeyError):
        return None
    return b if plan.get("clock") == b and plan.get("state") == "committed" else None


def _until(p: subprocess.Popen, run: Path, what, why: str, timeout: float = 90) -> None:
    """Until ``what()`` holds, the job still running."""
    deadline = time.monotonic() + timeout
    while not what():
        assert p.poll() is None, f"the job ended before: {why}\n{_log(run).read_text()[-3000:]}"
        assert time.monotonic() < deadline, why
        time.sleep(0.02)


@pytest.mark.timeout(150)
def test_a_worker_lost_at_a_scale_in_boundary_is_replaced_and_the_deferred_part_is_exact(tmp_path):
    """Workers 3 -> 2 in a running LDA job (integer counts, managed communication): the leaver, worker 2,
    holds before its CLOCK of the boundary B (the fault $BOSEN_FAULT=hold-before-leave, bosen/faults.py),
    so the servers stay below B while worker 0 reaches B, takes the task worker 1 hands it there and
    runs its first tick with it; worker 0 is then SIGKILLed, at B + 1. Once every server knows it is
    lost, worker 2 goes on (CLOCK(B), hands its tasks to worker 1, ends its clocks): the servers reach B
    with rank 0 lost, so they defer their parts of B (saved then, they would hold the updates the
    replacement's take-back removes). The replacement, restarted from a checkpoint before B, redoes its
    ticks, takes worker 1's task again from the hand-off file of B (kept for it: the giver has gone on)
    and sends CLOCK(B); the parts of B are saved then, worker 2 is let go, and every checkpoint, B's
    too, and the final table are exactly the counts of their assignments."""
    iterations, every = 98, 10  # B mid-run (in the last clocks it is refused); last parts at the end
    cfg, run, release, held, p, lines, failed, step = _held_scale_in(tmp_path, iterations, every, 2, start=every + 1)
    try:
        _scale_while_held(p, run, tmp_path, step)
        _until(p, run, lambda: _held_at(run, held) is not None, "worker 2 did not hold before a committed boundary")
        b = _held_at(run, held)
        addresses = config_mod.load(run / "config.yaml").cluster.servers

        def stats() -> list[dict]:
            return [status_mod.query(a, timeout=10.0) for a in addresses]

        # worker 0's record of tick B: it took its task at B and ran a tick with it (it goes no further
        # than CLOCK(B + 1), which the servers hold while worker 2 holds them below B)
        _wait_clock(p, run, b)
        _until(p, run, lambda: all(isinstance(c := st["client_clocks"][0], int) and c >= b for st in stats()),
               f"worker 0's CLOCK({b}) did not reach every server")
        assert all(st["clock"] < b for st in stats())
        first_worker(p.pid, 0).kill()

        def known_lost() -> bool:
            logs = [(run / "logs" / f"server-{i}.log").read_text() for i in range(2)]
            return all("client rank 0 was lost at clock" in x or "a replacement for worker rank 0 joined" in x
                       for x in logs)

        _until(p, run, known_lost, "the servers did not notice worker 0's loss")
        release.write_text("go")  # worker 2 goes on to B
        out = _output(p, run, 120)
        step.join(timeout=30)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    assert not failed, failed
    assert "worker-0.1 replaces worker-0" in out, out[-3000:]
    assert f"committed: micro-tasks move at clock {b}" in "\n".join(lines), lines
    assert any(f"every server's checkpoint part of clock {b} is on disk: worker(s) [2] leave" in x for x in lines)
    for i in (0, 1):
        log = (run / "logs" / f"server-{i}.log").read_text()
        assert f"checkpoint part at clock {b} deferred" in log, log[-3000:]
        assert f"checkpoint part at clock {b} saved: the lost workers' replacements redid" in log, log[-3000:]
    restarted = re.findall(r"worker-0\.1 replaces worker-0: it redoes clocks from (\d+)", out)
    assert restarted and int(restarted[0]) < b, out[-3000:]  # it redid ticks up to B and took its tasks again
    assert b in _every_checkpoint_and_the_end_exact(run, cfg, iterations, redone=True)


@pytest.mark.timeout(150)
def test_a_joiner_lost_after_its_boundary_is_replaced_from_before_it_joined_and_the_counts_stay_exact(tmp_path):
    """Workers 2 -> 3 in a running LDA job (checkpoints every 10 clocks), and the joiner, worker 2,
    SIGKILLed after it took its tasks at B and ran ticks with them, before any checkpoint at or past
    B: the riskier loss of a scale-out, since no complete checkpoint knows rank 2 (a giver's
    replacement restarts from its own part, as a scale-in's does, tested above). Held by
    $BOSEN_FAULT=hold-before-clock: workers 0 and 1 before their CLOCK(11) while the step is agreed (so
    B is 12, answered by the fault: a worker blocked in a read, behind a held one, reads no plan), then
    worker 2 before its CLOCK(16), where it is killed. Its
    replacement restarts from the checkpoint at 10, owning nothing until B (the plan holds from B),
    takes its tasks again from B's hand-off files, the servers having taken back what the lost
    process sent since it joined; the job finishes, every checkpoint and the final word-topic table
    exactly the counts of their assignments."""
    iterations, every = 98, 10
    path, cfg = _lda_job(tmp_path, iterations, every=every)
    run = (tmp_path / "run").resolve()
    go0, go2 = tmp_path / "go0", tmp_path / "go2"
    p = _launch(path, run, env={"BOSEN_FAULT": f"hold-before-clock:0:11:{go0};hold-before-clock:1:11:{go0};"
                                               f"hold-before-clock:2:16:{go2}"})
    lines, failed, step = _scale_thread(run, workers=3)
    try:
        _until(p, run, (tmp_path / "go0.held").exists, "workers 0, 1 did not hold before their CLOCK(11)")
        step.start()

        def committed() -> int | None:
            try:
                plan = json.loads((run / "tasks" / "plan.json").read_text())
            except (OSError, ValueError):
                return None
            return plan["clock"] if plan.get("state") == "committed" else None

        _until(p, run, lambda: committed() is not None, "the scale-out was not committed while workers 0, 1 held")
        b = committed()
        assert b == 12, b  # 2 past clock 10, where worker 0 holds
        go0.write_text("go")
        _until(p, run, (tmp_path / "go2.held").exists, "worker 2 did not hold before its CLOCK(16)")
        assert checkpoint.clocks(run / "checkpoints")[0] == 10  # nothing at or past B on disk
        first_worker(p.pid, 2).kill()
        go2.write_text("go")  # for its replacement, which passes 16 again
        out = _output(p, run, 120)
        step.join(timeout=30)
    finally:
        _stop(p)
    assert p.returncode == 0, (out[-3000:], lines)
    assert not failed, failed
    assert f"committed: micro-tasks move at clock {b}" in "\n".join(lines), lines
    assert "worker-2.1 replaces worker-2: it redoes clocks from 10 on" in out, out[-3000:]
    _every_checkpoint_and_the_end_exact(run, cfg, iterations, redone=True)


@pytest.mark.timeout(150)
def test_a_server_killed_while_a_leaver_waits_for_its_release_is_replaced_and_the_counts_stay_exact(tmp_path):
    """Workers 3 -> 2 in a running LDA job: worker 1 holds before its CLOCK of the boundary B
    ($BOSEN_FAULT=hold-before-leave), so no server has its part of B; the leaver, worker 2, reaches B,
    hands its tasks off and ends its clocks there (BYE "fc", on every server) and waits for its
    release. Server 1 is SIGKILLed then: its replacement restores an older part, the leaver (still
    connected) resends what it sent since and says "fc" again in its HELLO, and the replacement is
    asked for a part of B. Worker 1 goes on once the replacement serves: every server saves B, only
    then is the leaver let go, and B's checkpoint, every other and the final table are exactly the
    counts of their assignments."""
    iterations, every = 98, 10  # B mid-run (in the last clocks it is refused); last parts at the end
    cfg, run, release, held, p, lines, failed, step = _held_scale_in(tmp_path, iterations, every, 1, start=every + 1)
    try:
        # B past the first part: a replacement restores one before B
        b = _leaver_waiting_for_release(p, run, tmp_path, step, held)
        _server(p, 1).kill()
        replacement = run / "logs" / "server-1.1.log"
        heard = f"client rank 2 ends its clocks at {b}"
        _until(p, run, lambda: replacement.exists() and heard in replacement.read_text(),
               "server 1's replacement did not hear the leaver's fc")  # in its HELLO: the replacement serves
        out = _release_and_finish(p, run, release, step, 120)
    finally:
        _stop(p)
    assert p.returncode == 0, (out[-3000:], lines)
    assert not failed, failed
    assert "server-1.1 replaces server-1" in out, out[-3000:]
    restored = re.findall(r"resumed from \S+ at clock (\d+)", replacement.read_text())
    assert restored and int(restored[0]) < b, (restored, b)  # a part without the leaver's last ticks
    assert f"committed: micro-tasks move at clock {b}" in "\n".join(lines), lines
    assert any(f"every server's checkpoint part of clock {b} is on disk: worker(s) [2] leave" in x for x in lines)
    _every_checkpoint_and_the_end_exact(run, cfg, iterations)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_leaver_killed_while_it_waits_for_its_release_is_replaced_and_the_counts_stay_exact(tmp_path):
    """Workers 3 -> 2 as above (worker 1 held before its CLOCK of B, so no release comes): the leaver,
    worker 2, hands its tasks off at B, ends its clocks and waits for its release, and is SIGKILLed
    there. Its replacement redoes from the newest complete checkpoint before B, adopts its own
    hand-offs at B, leaves again, and the job ends with every checkpoint and the final table exactly
    the counts of their assignments."""
    iterations, every = 98, 10
    cfg, run, release, held, p, lines, failed, step = _held_scale_in(tmp_path, iterations, every, 1, start=every + 1)
    try:
        b = _leaver_waiting_for_release(p, run, tmp_path, step, held)
        first_worker(p.pid, 2).kill()
        _until(p, run, lambda: (run / "logs" / "worker-2.1.log").exists(), "worker 2 was not replaced")
        out = _release_and_finish(p, run, release, step, 150)
    finally:
        _stop(p)
    assert p.returncode == 0, (out[-3000:], lines)
    assert f"committed: micro-tasks move at clock {b}" in "\n".join(lines), lines
    assert any(f"every server's checkpoint part of clock {b} is on disk: worker(s) [2] leave" in x for x in lines)
    assert "handed off at clock" in (run / "logs" / "worker-2.1.log").read_text()  # its own hand-offs, adopted
    assert not failed, failed
    _every_checkpoint_and_the_end_exact(run, cfg, iterations)


def _part_counts(cfg: dict, parts: dict) -> tuple[np.ndarray, np.ndarray]:
    """A checkpoint's word-topic table (its server parts) and the counts of its workers' assignments."""
    args = from_dict(LDAArgs, cfg["app"]["args"], "app.args")
    corpus = load_corpus(args)
    table = np.zeros((args.synth_vocab, args.K), dtype=np.int64)
    for name, part in parts.items():
        if name.startswith("server-"):
            arrays = part.load()
            table[arrays["t0.rows"]] += arrays["t0.values"]
    states = {k: v for name, part in parts.items() if name.startswith("worker-")
              for k, v in part.load().items() if k.startswith("task.")}
    z = np.concatenate([states[M.key(t, "z")] for t in range(M.saved_tasks(states))])
    counts = np.zeros(table.shape, dtype=np.int64)
    np.add.at(counts, (corpus.words, z), 1)
    return table, counts


def test_a_synchronous_table_scales_only_where_the_apps_synchronous_path_reads_the_plan(tmp_path):
    """A table with backup (any mode) scales only with an app whose synchronous path reads the task plan
    at every clock (``SYNC_ELASTIC``: MLR); another app's is refused, naming it, before anything starts."""
    from types import SimpleNamespace

    from bosen.jobs.scale import Scaler

    cfg = build({"cluster": {"servers": ["127.0.0.1:0"], "workers": 2}, "checkpoint": {"every_clocks": 10},
                 "tables": {"G": {"rows": 2, "cols": 3, "dtype": "float64", "backup": {"mode": "dynamic"}}},
                 "app": {"module": "bosen.apps.lda"}})
    host = SimpleNamespace(run_dir=tmp_path, workers=[None, None], config=cfg, cluster=None, ray_job=None)
    scaler = Scaler(host)  # type: ignore[arg-type]
    try:
        with pytest.raises(ScaleError, match="bosen.apps.lda: its synchronous path .tables.G has backup. does not"):
            scaler.checks["workers"](3)
    finally:
        scaler.close()


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_a_dynamic_k_mlr_job_scaled_2_3_2_keeps_one_k_per_iteration(tmp_path):
    """DBW's dynamic k (gradients dropped, every worker draws from the whole data set; its micro-tasks
    say who is in the job) scaled 2 -> 3 -> 2 workers: a worker whose gradient was dropped clocks up to
    the newer iteration through the boundaries too. Every iteration stepped once with k_t of its
    workers (2 before B1, 2-3 until B2, 2 after), each from distinct ranks of the job then (rank 2 only
    in [B1, B2)), and k ends at 2 (dynamic: k >= 2, at most the workers)."""
    cfg = {"cluster": {"servers": ["127.0.0.1:0"], "workers": 2},
           "checkpoint": {"every_clocks": 50, "keep": 100},
           "tables": {"W": {"rows": 10, "cols": 65, "dtype": "float64", "init": {"zeros": True},
                            "backup": {"mode": "dynamic", "lr": 0.5}}},
           "app": {"module": "bosen.apps.mlr", "args": {"data": "digits", "holdout": 0.1, "batch_size": 7,
                                                         "micro_tasks": 6, "epochs": 1_000_000, "eval_every": 0}}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(cfg))
    run = (tmp_path / "run").resolve()
    p = _launch(path, run)
    try:
        _wait_clock(p, run, 5)
        lines: list[str] = []
        bosen.scale(run, workers=3, out=lines.append)
        bosen.scale(run, workers=2, out=lines.append)
        b1, b2 = (int(m) for m in re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines)))
        deadline = time.monotonic() + 60
        parts = None
        c = b2 + 100 - b2 % 50
        while parts is None:  # a checkpoint well past B2, complete
            assert p.poll() is None and time.monotonic() < deadline, lines
            time.sleep(0.05)
            try:
                parts = checkpoint.check_complete(run / "checkpoints", c, 1, None, None)
            except checkpoint.CheckpointError:
                pass
    finally:
        _stop(p)
    server = parts["server-0"].load()
    assert int(server["p0.iteration"][0]) == c
    k_hist = server["p0.k_history"].tolist()
    applied = np.split(server["p0.applied_ranks"], np.cumsum(server["p0.applied_lens"])[:-1])
    assert len(k_hist) == len(applied) == min(c, 1000)  # one k_t per iteration
    start = c - len(k_hist)
    for t, (k, ranks) in enumerate(zip(k_hist, applied, strict=True), start):
        members = {0, 1, 2} if b1 <= t < b2 else {0, 1}
        assert 2 <= k <= len(members) and len(ranks) == k and set(ranks.tolist()) <= members, (t, k, ranks, b1, b2)
    assert int(server["p0.k"][0]) == 2


def _sync_replay(cfg: dict, b1: int, b2: int, c: int) -> tuple[np.ndarray, dict[int, dict[str, np.ndarray]]]:
    """Synchronous MLR's w_c where ranks 0-2 ran iterations [b1, b2) and ranks 0-1 the others, and each
    task's sampler state then: each task draws its share of its owner's minibatch, the step is the mean
    at lr."""
    from bosen.apps.mlr import kernels as K
    from bosen.apps.mlr.worker import MLRArgs, load_data

    a = from_dict(MLRArgs, cfg["app"]["args"], "app.args")
    train, _ = load_data(a, 10, 64)
    tasks = {t: M.Draws(train.n, [t], 6, a.seed) for t in range(6)}
    W = np.zeros((10, 65))
    for it in range(c):
        ranks = [0, 1, 2] if b1 <= it < b2 else [0, 1]
        owners = M.assign(6, ranks)
        grads = []
        for r in ranks:
            mine = M.owned(owners, r)
            cuts = np.diff(np.linspace(0, a.batch_size, mine.size + 1).round().astype(np.int64))
            batch = np.concatenate([tasks[int(t)].draw(int(n)) for t, n in zip(mine, cuts, strict=True)])
            _, G = K.loss_grad(train.indptr, train.indices, train.values, train.labels, batch, W)
            G /= a.batch_size
            G[:, :64] += a.reg * W[:, :64]
            grads.append(G)
        W = W - 0.5 * np.mean(grads, axis=0)
    return W, {t: tasks[t].state(t) for t in range(6)}


def _sync_matches(parts: dict, W: np.ndarray, samplers: dict, want_k: list[int], at: str) -> None:
    """A synchronous MLR checkpoint (``parts``, 2 servers) is the replay's: every server's iterations
    applied ``want_k`` gradients (none dropped), every task's sampler and the table are the replay's
    (the table to 1e-9: a server sums each step's gradients in arrival order)."""
    got = np.zeros((10, 65))
    for i in (0, 1):
        server = parts[f"server-{i}"].load()
        k_hist = server["p0.k_history"].tolist()
        assert k_hist == want_k[-len(k_hist):] and len(k_hist) == min(len(want_k), 1000), (at, i)
        assert server["p0.counts"][1:3].tolist() == [0, 0], (at, i)  # dropped late, repeat
        got[server["t0.rows"]] = server["t0.values"]
    states = {k: v for name, part in parts.items() if name.startswith("worker-") for k, v in part.load().items()
              if k.startswith("task.")}
    for t in range(6):
        for name in ("order", "pos", "rng"):
            np.testing.assert_array_equal(states[M.key(t, name)], samplers[t][name], err_msg=f"{at}: task {t} {name}")
    np.testing.assert_allclose(got, W, rtol=0, atol=1e-9, err_msg=at)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_synchronous_mlr_job_scaled_2_3_2_equals_its_replay(tmp_path):
    """Synchronous MLR (static k = the workers, 6 micro-tasks, 2 servers) scaled 2 -> 3 workers, server 1
    killed and replaced (SCAR: restored from its newest part, every worker resends its gradients since,
    the joined one those since it joined), then 3 -> 2 workers. At a checkpoint past both boundaries:
    every iteration applied exactly the job's workers' gradients (2, then 3 from B1, then 2 from B2; none
    dropped), the leaver ended its clocks at B2 on every server (BYE "fc") before it waited for its
    release, every task's sampler (its pass's order and place) is where a replay that moves the tasks
    at B1 and B2 has it, and the table equals that replay's w_c up to the order the servers summed each
    step's gradients in (float64, 1e-9). Past B2 worker 1 is SIGKILLed a few clocks (or more: the clocks
    are fast) after a complete checkpoint C: its replacement restores C, clocks up to the servers' T > C
    without gradients and draws and drops its lost process's mini-batch of each (otherwise its samplers
    and most of the table differ), so c is C + 50. Then the job resumed from the checkpoint of B2 (made
    by ranks 0-2) with the config's 2 workers ends at c with the same tables."""
    cfg = {"cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 2},
           "checkpoint": {"every_clocks": 50, "keep": 100},
           "tables": {"W": {"rows": 10, "cols": 65, "dtype": "float64", "init": {"zeros": True},
                            "backup": {"mode": "static", "k": 2, "lr": 0.5}}},
           "app": {"module": "bosen.apps.mlr", "args": {"data": "digits", "holdout": 0.1, "batch_size": 7,
                                                         "micro_tasks": 6, "epochs": 1_000_000, "eval_every": 0}}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(cfg))
    run = (tmp_path / "run").resolve()
    p = _launch(path, run)
    base = run / "checkpoints"
    try:
        _wait_clock(p, run, 5)
        lines: list[str] = []
        bosen.scale(run, workers=3, out=lines.append)
        _server(p, 1).kill()
        killed_at = json.loads((run / "workers" / "0.jsonl").read_text().splitlines()[-1])["clock"]
        _wait_clock(p, run, killed_at + 20)  # a synchronous job goes on only once the replacement serves
        bosen.scale(run, workers=2, out=lines.append)
        b1, b2 = (int(m) for m in re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines)))
        c1 = b2 + 50 - b2 % 50  # the first checkpoint past B2; worker 1 is lost a few clocks after it

        def lost_after_c1() -> bool:
            with contextlib.suppress(OSError, ValueError, IndexError, checkpoint.CheckpointError):
                if json.loads((run / "workers" / "1.jsonl").read_text().splitlines()[-1])["clock"] >= c1 + 3:
                    checkpoint.check_complete(base, c1, 2, None, None)
                    return True
            return False

        lost = first_worker(p.pid, 1)
        _until(p, run, lost_after_c1, f"worker 1 did not pass the complete checkpoint {c1}")
        lost.kill()  # its replacement restores C and clocks up to the servers' T > C without a gradient
        lost_at = json.loads((run / "workers" / "1.jsonl").read_text().splitlines()[-1])["clock"]
        replaced = re.compile(r"worker-1\.1 replaces worker-1: it redoes clocks from (\d+) on")
        _until(p, run, lambda: replaced.search(_log(run).read_text()) is not None, "worker 1 was not replaced")
        C = int(replaced.search(_log(run).read_text()).group(1))  # type: ignore[union-attr]
        # the clocks are fast: the lost process may have passed C + 50 too, whose part the replacement
        # then writes again as it catches up (after its draw of C + 49)
        c = C + 50
        deadline = time.monotonic() + 120
        parts = None
        while parts is None:  # a checkpoint past the replacement's restart, complete
            assert p.poll() is None and time.monotonic() < deadline, lines
            time.sleep(0.05)
            try:
                parts = checkpoint.check_complete(base, c, 2, None, None)
            except checkpoint.CheckpointError:
                pass
    finally:
        _stop(p)
    assert c1 <= C < lost_at, (c1, C, lost_at)  # the replacement caught up: its T >= lost_at > C
    out = _log(run).read_text()
    assert "server-1.1 replaces server-1" in out, out[-3000:]
    for name in ("server-0", "server-1.1"):  # the leaver ended its clocks at B2: nobody's step waited on it
        log = (run / "logs" / f"{name}.log").read_text()
        assert f"client rank 2 ends its clocks at {b2}:" in log, log[-2000:]
    W, samplers = _sync_replay(cfg, b1, b2, c)
    want_k = [2] * b1 + [3] * (b2 - b1) + [2] * (c - b2)
    _sync_matches(parts, W, samplers, want_k, f"the scaled job at {c}")
    # resumed from B2's checkpoint (ranks 0-2 made it) with 2 workers, to the end at c: the same tables
    assert checkpoint.checkpoint_ranks(checkpoint.clock_dir(base, b2)) == [0, 1, 2]
    for x in checkpoint.clocks(base):
        if x > b2:
            shutil.rmtree(checkpoint.clock_dir(base, x))
    cfg["app"]["args"]["epochs"] = c  # one iteration an epoch: the job ends at c
    path.write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "bosen", "launch", str(path), "--resume", str(run), "--no-plot"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and f"resuming from the checkpoint at clock {b2}" in r.stdout, r.stdout[-3000:] + r.stderr
    _sync_matches(checkpoint.check_complete(base, c, 2, None, None), W, samplers, want_k, f"resumed from {b2}")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_server_killed_while_a_synchronous_leaver_waits_is_replaced_and_the_job_equals_its_replay(tmp_path):
    """Synchronous MLR (static k = the workers, 2 servers) scaled 3 -> 2 workers: worker 1 holds before its
    CLOCK of B, so no server has its part of B, while the leaver, worker 2, ends its clocks at B (BYE
    "fc") and waits for its release. Server 1 is SIGKILLed then: its replacement restores an older part,
    hears the leaver's "fc" again in its HELLO (the leaver is one of n up to iteration B - 1, whose
    gradients it resends, and not from B on) and the job goes on once worker 1 does: a checkpoint
    past B is the replay's (k_t 3 up to B, then 2; nothing dropped; samplers and table)."""
    cfg = {"cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 3},
           "checkpoint": {"every_clocks": 50, "keep": 100},
           "tables": {"W": {"rows": 10, "cols": 65, "dtype": "float64", "init": {"zeros": True},
                            "backup": {"mode": "static", "k": 3, "lr": 0.5}}},
           "app": {"module": "bosen.apps.mlr", "args": {"data": "digits", "holdout": 0.1, "batch_size": 7,
                                                         "micro_tasks": 6, "epochs": 1_000_000, "eval_every": 0}}}
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(cfg))
    _, run, release, held, p, lines, failed, step = _held_scale_in(tmp_path, 0, 50, 1, (path, cfg))
    base = run / "checkpoints"
    try:
        _wait_clock(p, run, 60)  # B past the first part: the replacement restores one before B
        step.start()
        _until(p, run, lambda: _held_at(run, held) is not None, "worker 1 did not hold before a committed boundary")
        b = _held_at(run, held)
        addresses = config_mod.load(run / "config.yaml").cluster.servers
        _until(p, run, lambda: all(status_mod.query(a, timeout=10.0)["final_clocks"][2] == b for a in addresses),
               f"worker 2 did not end its clocks at {b} on every server")
        _server(p, 1).kill()
        replacement = run / "logs" / "server-1.1.log"
        heard = f"client rank 2 ends its clocks at {b}"
        _until(p, run, lambda: replacement.exists() and heard in replacement.read_text(),
               "server 1's replacement did not hear the leaver's fc")
        release.write_text("go")  # worker 1 goes on to B
        c = b + 50
        parts = None
        deadline = time.monotonic() + 120
        while parts is None:  # a checkpoint past B, complete
            assert p.poll() is None and time.monotonic() < deadline, (lines, _log(run).read_text()[-3000:])
            time.sleep(0.05)
            try:
                parts = checkpoint.check_complete(base, c, 2, None, None)
            except checkpoint.CheckpointError:
                pass
        step.join(timeout=30)
    finally:
        _stop(p)
    assert not failed, failed
    restored = re.findall(r"resumed from \S+ at clock (\d+)", replacement.read_text())
    assert restored and int(restored[0]) < b, (restored, b)  # a part without the leaver's last gradients
    W, samplers = _sync_replay(cfg, 0, b, c)  # ranks 0-2 up to B, 0-1 after
    _sync_matches(parts, W, samplers, [3] * b + [2] * (c - b), f"the scaled job at {c}")


def test_leavers_wait_while_the_servers_say_a_part_of_their_boundary_is_coming(tmp_path, monkeypatch):
    """The scaler lets the leavers of B go (``left-<id>.json``) once every server's part of B is on disk.
    While a server defers that part (a worker lost at B, its replacement redoing its ticks) or awaits a
    lost worker's replacement, they wait however long that takes (no fixed fallback); only where no
    part is on disk nor coming do they go after DURABLE_WAIT_S."""
    from types import SimpleNamespace

    from bosen.jobs import scale as scale_mod
    from bosen.jobs.scale import Scaler, _Step

    monkeypatch.setattr(scale_mod, "DURABLE_WAIT_S", 0.0)
    cfg = build({"cluster": {"servers": ["127.0.0.1:0", "127.0.0.1:0"], "workers": 3},
                 "checkpoint": {"every_clocks": 10}, "tables": {"t": {"rows": 4, "cols": 1}}})
    said: list[str] = []
    host = SimpleNamespace(run_dir=tmp_path, workers=[None] * 3, config=cfg, ray_job=None, security=None,
                           cluster=SimpleNamespace(addresses=["127.0.0.1:1", "127.0.0.1:2"]), say=said.append)
    scaler = Scaler(host)  # type: ignore[arg-type]
    try:
        scaler.folder.mkdir(parents=True)
        release = scaler.folder / f"left-{scaler._plan_ids}.json"

        def stats(durable: int, deferred: int | None = None, awaiting: tuple[int, ...] = ()) -> dict:
            return {"clock": 20, "uptime_s": 1e6, "awaiting_replacement": list(awaiting),
                    "checkpoints": {"durable": durable, "deferred": deferred}}

        step = _Step(1, 2, time.time(), clock=20, leavers=[2], durable=True)
        for coming in ([stats(20), stats(10, deferred=20)], [stats(10, awaiting=(0,)), stats(20)]):
            scaler._release(step, coming)
            time.sleep(0.01)
            scaler._release(step, coming)
            assert not release.exists(), coming
        scaler._release(step, [stats(20), stats(20)])
        assert json.loads(release.read_text()) == {"clock": 20, "durable": True}
        assert "every server's checkpoint part of clock 20 is on disk: worker(s) [2] leave" in said[-1]
        release.unlink()
        step = _Step(2, 2, time.time(), clock=20, leavers=[2], durable=True)
        scaler._release(step, [stats(10), stats(20)])  # none coming: the fallback (0 s here)
        assert json.loads(release.read_text()) == {"clock": 20, "durable": False}
    finally:
        scaler.close()


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_giver_lost_after_its_hand_off_is_replaced_exactly_and_a_resume_skips_the_stale_checkpoints(tmp_path):
    """Workers 3 -> 2 in a running LDA job (integer counts, managed communication): at the boundary B,
    worker 1 hands task 3 to worker 0 (and takes worker 2's); worker 0 takes it and runs on. Worker 1
    writes no checkpoint part from clock 20 <= B on ($BOSEN_FAULT=no-parts-from, bosen/faults.py), so
    no checkpoint at or past B is complete when it is SIGKILLed, once the servers have their parts of B:
    its replacement restarts before B and redoes task 3's ticks below B, which end in other topics than
    the lost process's; at B it adopts the hand-off worker 0 took (the file stays) and corrects the
    counts by the difference. The job ends with the final table exactly the counts of the final
    assignments, as every checkpoint the take-back left exact. The servers' parts of B were saved
    before the take-back (corrections beside them): a resume of the whole job skips those checkpoints,
    naming why, starts from the older exact one, sets the newer ones aside (checkpoints/superseded-*,
    saying so) and ends exact too, with server 1 SIGKILLed once the resumed job has written B again: its
    replacement restores its new part of B. (Before, the old correction stayed beside the new part, the
    replacement took it out of a part that never held it, and the job failed: `server 1 came back from
    its checkpoint at clock 10, but this client kept its updates only from clock 30 on`.)"""
    iterations, every = 148, 10  # the kill comes well before the end; the last checkpoint at the end (+2)
    path, cfg = _lda_job(tmp_path, iterations, every=every, workers=3)
    run = (tmp_path / "run").resolve()
    base = run / "checkpoints"
    p = _launch(path, run, env={"BOSEN_FAULT": f"no-parts-from:1:{2 * every}"})
    lines, failed, step = _scale_thread(run, workers=2)
    try:
        _wait_clock(p, run, every + 1)  # B >= 2 * every: worker 1 writes no part there, the replacement
        step.start()                    # restarts from one before
        committed: list[int] = []

        def moved() -> bool:
            committed[:] = [int(m) for m in re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines))]
            return bool(committed)

        _until(p, run, moved, "the scale-in was not committed")
        b = committed[0]
        assert b >= 2 * every, b
        _wait_clock(p, run, b + 1)  # worker 0 took task 3 at B and ran on with it
        _until(p, run, lambda: all((checkpoint.clock_dir(base, b) / checkpoint.part_name("server", i)
                                    / checkpoint.META).exists() for i in (0, 1)), f"no server parts of {b}")
        assert not (checkpoint.clock_dir(base, b) / checkpoint.part_name("worker", 1)).exists()
        first_worker(p.pid, 1).kill()
        out = _output(p, run, 150)
        step.join(timeout=30)
    finally:
        _stop(p)
    assert p.returncode == 0, out[-3000:]
    assert not failed, failed
    restarted = re.findall(r"worker-1\.1 replaces worker-1: it redoes clocks from (\d+)", out)
    assert restarted and int(restarted[0]) < b, out[-3000:]
    adopted = f"micro-task(s) [3] were handed off at clock {b} already"
    assert adopted in (run / "logs" / "worker-1.1.log").read_text()
    stale = [c for c in checkpoint.clocks(base) if checkpoint.taken_back(checkpoint.clock_dir(base, c))]
    assert b in stale, stale  # the servers' parts of B hold the lost process's ticks below B
    checked = _every_checkpoint_and_the_end_exact(run, cfg, iterations, redone=True)
    assert [c for c in checked if c > max(stale)], (checked, stale)  # those after the redo among them
    table, counts = _part_counts(cfg, checkpoint.check_complete(base, b, 2, None, None))
    assert (table != counts).any()  # B's server parts: the lost ticks of tasks 4, 5; its worker part: the redo's
    # a resume of the whole job from the run as it was right after the redo: the stale checkpoints are
    # skipped (their server parts hold the lost ticks, their worker part the redo's), an older one is used
    for c in checkpoint.clocks(base):
        if c > max(stale):
            shutil.rmtree(checkpoint.clock_dir(base, c))
    (run / "word_topic.npy").unlink()
    assert (checkpoint.clock_dir(base, b) / "redo.server-1.rank-1.npz").exists()
    # the resumed job writes B again; once its new parts of B are all on disk (both workers held before
    # CLOCK(B + 1)), server 1 is SIGKILLed: its replacement restores its new part of B. Were the old
    # correction of B still beside it, it would take the lost process's batches out of a part that
    # never held them, and every count after would be off
    held = [tmp_path / f"resumed{r}" for r in (0, 1)]
    fault = ";".join(f"hold-before-clock:{r}:{b + 1}:{held[r]}" for r in (0, 1))
    resumed = time.time()
    q = subprocess.Popen([sys.executable, "-m", "bosen", "launch", str(path), "--resume", str(run), "--workers", "2",
                          "--no-plot"], stdout=_log(run).open("w"), stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, env={**os.environ, "BOSEN_FAULT": fault})

    def rewritten() -> bool:  # every part of B written by the resumed job
        try:
            parts = checkpoint.check_complete(base, b, 2, None, None, verify=False)
        except checkpoint.CheckpointError:
            return False
        return all(part.meta["written"] > resumed for part in parts.values())

    try:
        _until(q, run, lambda: all(h.with_name(h.name + ".held").exists() for h in held), "the workers did not hold")
        _until(q, run, rewritten, f"the resumed job did not write checkpoint {b} again")
        _server(q, 1).kill()
        _until(q, run, lambda: "server-1.1 replaces server-1" in _log(run).read_text(), "server 1 was not replaced")
        for h in held:
            h.write_text("go")
        out = _output(q, run, 150)
    finally:
        _stop(q)
    assert q.returncode == 0, out[-3000:]
    for c in stale:
        assert f"skipping checkpoint clock {c}: its server parts hold a lost worker's updates" in out, out
    used = int(re.findall(r"resuming from the checkpoint at clock (\d+)", out)[0])
    assert used < min(stale) and not checkpoint.taken_back(checkpoint.clock_dir(base, used)), out
    _every_checkpoint_and_the_end_exact(run, cfg, iterations)  # those the resumed job wrote again too
    aside = re.findall(r"set aside (.*) \(the job starts again from clock (\d+) .* in (\S+)", out)
    assert aside and int(aside[0][1]) == used, out[-3000:]
    names = sorted(checkpoint.clock_dir(base, c).name for c in checkpoint.clocks(Path(aside[0][2])))
    assert aside[0][0] == ", ".join(names) and b in checkpoint.clocks(Path(aside[0][2])), (aside, names)
    assert (Path(aside[0][2]) / checkpoint.clock_dir(base, b).name / "redo.server-1.rank-1.npz").exists()
    assert not checkpoint.taken_back(checkpoint.clock_dir(base, b))


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("parts_until", [30, 20])
def test_a_scale_out_giver_lost_after_a_second_step_takes_its_checkpoints_tasks_and_the_counts_stay_exact(
        tmp_path, parts_until):
    """Workers 2 -> 3 at B1 = 12, then 3 -> 4 at B2 = 32 in a running LDA job (8 micro-tasks,
    checkpoints every 10 clocks), steps agreed while every worker holds before a CLOCK
    ($BOSEN_FAULT=hold-before-clock). Worker 2, which joined at B1, writes no checkpoint part from
    ``parts_until`` on (no-parts-from); at B2 it hands tasks 6, 7 to the joiner, worker 3, and is
    SIGKILLed once worker 3 ran ticks 32 and 33 with them. With parts until 30, its replacement
    restarts from 20, between the steps: it must run the tasks 20's worker parts give rank 2 (6, 7:
    the first step's owners), not plan.json's (the second step's) nor the config's (2 workers: none).
    With parts until 20, it restarts from 10, before both: it owns nothing, takes 6, 7 at B1 from the
    plan the scaler kept (plan.json holds B2's) and their hand-off files. Either way it redoes their
    ticks, adopts the hand-offs of B2 that worker 3 took (a giver lost during a scale-out) and takes
    tasks 4, 5 from worker 1's files, and the job ends with every checkpoint the take-back left exact
    and the final word-topic table exactly the counts of their assignments."""
    iterations, every = 98, 10
    path, cfg = _lda_job(tmp_path, iterations, every=every)
    run = (tmp_path / "run").resolve()
    go = {n: tmp_path / n for n in ("go0", "go1", "go3")}
    fault = ";".join([*(f"hold-before-clock:{r}:11:{go['go0']}" for r in (0, 1)),
                      *(f"hold-before-clock:{r}:31:{go['go1']}" for r in (0, 1, 2)),
                      f"hold-before-clock:3:34:{go['go3']}", f"no-parts-from:2:{parts_until}"])
    p = _launch(path, run, env={"BOSEN_FAULT": fault})

    def committed(b: int) -> bool:
        try:
            plan = json.loads((run / "tasks" / "plan.json").read_text())
        except (OSError, ValueError):
            return False
        return plan.get("clock") == b and plan.get("state") == "committed"

    lines: list[str] = []
    failed: list[BaseException] = []
    try:
        for n, b, target in (("go0", 12, 3), ("go1", 32, 4)):
            _until(p, run, (tmp_path / f"{n}.held").exists, f"the workers did not hold ({n})")
            got, failed, step = _scale_thread(run, workers=target)
            step.start()
            _until(p, run, lambda b=b: committed(b), f"no step committed at {b} while the workers held",
                   timeout=120)
            go[n].write_text("go")
            step.join(timeout=120)
            assert not step.is_alive() and not failed, (failed, got)
            lines += got
        _until(p, run, (tmp_path / "go3.held").exists, "worker 3 did not hold before its CLOCK(34)")
        assert checkpoint.clocks(run / "checkpoints")[0] >= 30  # the servers' parts of 30: incomplete
        first_worker(p.pid, 2).kill()
        go["go3"].write_text("go")
        out = _output(p, run, 150)
    finally:
        _stop(p)
    assert p.returncode == 0, (out[-3000:], lines)
    assert re.findall(r"committed: micro-tasks move at clock (\d+)", "\n".join(lines)) == ["12", "32"], lines
    assert f"worker-2.1 replaces worker-2: it redoes clocks from {parts_until - every} on" in out, out[-3000:]
    _every_checkpoint_and_the_end_exact(run, cfg, iterations, redone=True)
    log = (run / "logs" / "worker-2.1.log").read_text()
    assert "micro-task(s) [6, 7] were handed off at clock 32 already" in log, log[-3000:]
