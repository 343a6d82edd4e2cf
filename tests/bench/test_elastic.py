"""bench.elastic: partitions moved between the servers of a running job while two workers train;
its result lines measure the pause and the stall (real processes)."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.common import REPO, repo_env


def test_the_move_bench_reports_the_pause_and_the_stall_of_each_move():
    r = subprocess.run([sys.executable, "-m", "bench.elastic", "--mb", "2", "--moves", "1", "--joins", "1"],
                       cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    got = [json.loads(x) for x in r.stdout.splitlines()]
    assert {(d["case"], d["metric"]) for d in got} == {(c, m) for c in ("move-2MB", "server-join-2MB",
                                                                         "server-leave-2MB")
                                                       for m in ("pause_s", "stall_s")}
    for d in got:
        if d["case"] != "move-2MB" and d["metric"] == "pause_s":  # a third of the table each way
            assert d["moves"] == 1 and 0.8e6 < d["bytes_moved"] < 2e6 and 0 < d["ours"] < 60, d  # one join, one leave
    lines = {d["metric"]: d for d in got if d["case"] == "move-2MB"}
    pause = lines["pause_s"]
    assert pause["moves"] == 1 and pause["spread"]["reps"] == 1
    assert 1.5e6 < pause["bytes_moved"] < 3e6  # half the table: about --mb MB
    assert 0 < pause["ours"] < 60 and pause["export_s"] > 0 and pause["map_s"] > 0
    assert lines["stall_s"]["clock_gap_typical_s"] > 0


def test_litz_ideal_is_the_first_runs_time_to_the_boundary_plus_the_seconds_from_it():
    from bench.elastic.litz import ideal

    half = {c: 10.0 + 2.0 * c for c in range(11)}  # 2 s a clock, first record at 10 s
    full = {c: 5.0 + 1.0 * c for c in range(11)}  # 1 s a clock
    assert ideal(half, full, 3) == 6.0 + 7.0  # 3 clocks at half, 7 at full
    assert ideal(full, half, 7) == 7.0 + 6.0
    assert ideal(half, full, 0) == 10.0 and ideal(half, full, 10) == 20.0


def test_litz_jobs_checkpoint_often_enough_that_a_scale_in_boundary_is_near_the_asked_clock(tmp_path):
    """A scale-in waits for the next checkpoint boundary: the bench's jobs save every passes // 50
    clocks (at least 1), so it lands within 2% of the work past the asked point."""
    from bench.elastic.litz import write_job

    for passes, every in ((20, 1), (100, 2), (300, 6)):
        cfg = json.loads(write_job("lda", tmp_path / "job.yaml", 2, passes).read_text())
        assert cfg["checkpoint"]["every_clocks"] == every and every - 1 <= 0.02 * passes, cfg["checkpoint"]


def test_the_move_bench_moves_a_backup_table_with_its_gradient_buffers():
    """``--backup``: table E has backup workers (static k = n = 2), so a moved row carries the step's
    float64 buffers of both ranks beside its float32 values: several times the bytes of a plain move."""
    r = subprocess.run([sys.executable, "-m", "bench.elastic", "--mb", "1", "--moves", "1", "--joins", "0",
                        "--backup"], cwd=REPO, env=repo_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    got = {d["metric"]: d for d in (json.loads(x) for x in r.stdout.splitlines())}
    assert set(got) == {"pause_s", "stall_s"} and got["pause_s"]["case"] == "move-1MB-backup"
    assert got["pause_s"]["moves"] == 1 and 0 < got["pause_s"]["ours"] < 60
    assert got["pause_s"]["bytes_moved"] > 4e6  # 1 MB of float32 rows and 2 ranks' float64 buffers, and more
