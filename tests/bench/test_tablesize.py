"""bench.tablesize (memory and throughput against table size): its argument parsing, a short run
through real servers and a client subprocess, and the shard and stored parts at a small size."""

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


def test_unknown_parts_and_storages_are_named(capsys):
    for args, named in ((["--only", "jobs,disk"], "--only takes jobs, shard, stored, got ['disk']"),
                        (["--storage", "hashed"], "--storage takes dense and/or sparse, got ['hashed']")):
        with pytest.raises(SystemExit):
            tablesize.main(args)
        assert named in capsys.readouterr().err


def test_a_short_run_holds_the_dense_table_on_the_servers_and_reports_its_rate():
    out = subprocess.run([sys.executable, "-m", "bench.tablesize", "--only", "jobs", "--sizes", "200k",
                          "--storage", "dense", "--touch", "500", "--clocks", "3"], cwd=REPO, env=repo_env(),
                         capture_output=True, text=True, timeout=240, check=True)
    recs = {r["case"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(recs) == {"client-held-MB", "server-held-per-stored-byte", "touch-rows-per-s"}
    # a dense 200k x 16 float32 table is 12.8 MB of values on the servers together
    assert 0.9 <= recs["server-held-per-stored-byte"]["ours"] <= 3.0, recs
    assert recs["server-held-per-stored-byte"]["stored_rows"] == 200_000
    assert recs["touch-rows-per-s"]["ours"] > 0 and recs["touch-rows-per-s"]["first_clock_s"] > 0


def test_the_shard_and_stored_parts_compare_sparse_with_dense_and_count_what_a_sparse_shard_holds():
    out = subprocess.run([sys.executable, "-m", "bench.tablesize", "--only", "shard,stored", "--sizes", "50k",
                          "--shard-touched", "5k", "--shard-rounds", "2"], cwd=REPO, env=repo_env(),
                         capture_output=True, text=True, timeout=240, check=True)
    recs = {(r["case"], r["storage"]): r for r in map(json.loads, out.stdout.splitlines())}
    assert set(recs) == {(f"shard-{op}-rows-per-s", k) for op in ("inc", "read") for k in ("dense", "sparse")} | {
        ("sparse-stored-bytes-per-row-byte", "sparse")}
    for op in ("inc", "read"):
        dense, sparse = recs[f"shard-{op}-rows-per-s", "dense"], recs[f"shard-{op}-rows-per-s", "sparse"]
        assert dense["min"] <= dense["ours"] <= dense["max"] and "ratio" not in dense
        assert sparse["baseline"] == dense["ours"] and sparse["ratio_min"] <= sparse["ratio"] <= sparse["ratio_max"]
        assert sparse["touched"] == 5000 and sparse["batch"] == 1000 and sparse["rounds"] == 2
    stored = recs["sparse-stored-bytes-per-row-byte", "sparse"]
    # 50k rows of 16 float32 and an 8-byte id: the map and per-row metadata add a quarter to a half
    assert stored["stored_rows"] == 50_000 and stored["row_MB"] == 3.6
    assert 1.0 <= stored["nbytes_ratio"] <= 2.0 and stored["rss_growth_MB"] > 0, stored
