"""bench.elastic: partitions moved between the servers of a running job while two workers train;
its result lines measure the pause and the stall (real processes)."""

from __future__ import annotations

import json
import subprocess
import sys

from bench.common import REPO, repo_env


def test_the_move_bench_reports_the_pause_and_the_stall_of_each_move():
    r = subprocess.run([sys.executable, "-m", "bench.elastic", "--mb", "2", "--moves", "2"], cwd=REPO,
                       env=repo_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = {d["metric"]: d for d in map(json.loads, r.stdout.splitlines())}
    assert set(lines) == {"pause_s", "stall_s"}
    pause = lines["pause_s"]
    assert pause["moves"] == 2 and pause["spread"]["reps"] == 2
    assert 1.5e6 < pause["bytes_moved"] < 3e6  # half the table: about --mb MB
    assert 0 < pause["ours"] < 60 and pause["export_s"] > 0 and pause["map_s"] > 0
    assert lines["stall_s"]["clock_gap_typical_s"] > 0
