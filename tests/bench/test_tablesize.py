"""bench.tablesize (memory and throughput against table size): its argument parsing and a short run
through real servers and a client subprocess."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from bench.common import REPO, repo_env
from bench.tablesize import __main__ as tablesize


def test_counts_take_k_and_m_suffixes_and_name_bad_input():
    assert tablesize.parse_count("20M") == 20_000_000
    assert tablesize.parse_count("10k") == 10_000
    assert tablesize.parse_count("500") == 500
    assert tablesize.count_name(20_000_000) == "20M" and tablesize.count_name(1500) == "1500"
    with pytest.raises(argparse.ArgumentTypeError, match="not a count: 'lots'"):
        tablesize.parse_count("lots")


def test_a_short_run_holds_the_dense_table_on_the_servers_and_reports_its_rate():
    out = subprocess.run([sys.executable, "-m", "bench.tablesize", "--sizes", "200k", "--storage", "dense",
                          "--touch", "500", "--clocks", "3"], cwd=REPO, env=repo_env(), capture_output=True,
                         text=True, timeout=240, check=True)
    recs = {r["case"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(recs) == {"client-held-MB", "server-held-per-stored-byte", "touch-rows-per-s"}
    # a dense 200k x 16 float32 table is 12.8 MB of values on the servers together
    assert 0.9 <= recs["server-held-per-stored-byte"]["ours"] <= 3.0, recs
    assert recs["server-held-per-stored-byte"]["stored_rows"] == 200_000
    assert recs["touch-rows-per-s"]["ours"] > 0 and recs["touch-rows-per-s"]["first_clock_s"] > 0
