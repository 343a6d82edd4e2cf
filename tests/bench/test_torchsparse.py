"""bench.torchsparse (DLRM on a 100M-row sparse embedding table): a short run of both cases through
``bosen launch``, and what its records say."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.common import REPO, repo_env


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_a_short_run_stores_only_the_rows_touched_and_reports_both_tables():
    out = subprocess.run([sys.executable, "-m", "bench.torchsparse", "--quick", "--samples", "20480"], cwd=REPO,
                         env=repo_env(), capture_output=True, text=True, timeout=280, check=True)
    recs = {(r["case"], r["metric"]): r for r in map(json.loads, out.stdout.splitlines())}
    touched = recs["sparse", "rows_touched_per_worker"]["ours"]
    stored = recs["sparse", "rows_stored"]["ours"]
    # the servers store the rows some worker touched (and rank 0's held-out rows), never the 100M
    assert max(touched) < stored < sum(touched) + 10_000 * 26 and stored < 10**6, (stored, touched)
    assert recs["sparse", "rows_stored"]["table_rows"] == 100_000_000
    assert recs["dense", "rows_stored"]["ours"] == 1_000_000  # a dense table stores every row
    assert len(recs["sparse", "worker_rss_mb"]["ours"]) == 2 and len(recs["sparse", "server_rss_mb"]["ours"]) == 2
    assert recs["sparse", "step_ms"]["ours"] > 0
    auc = recs["sparse-vs-dense", "heldout_auc"]
    # 10 steps a worker learn next to nothing: the records, not the model, are under test here
    assert 0.3 < auc["ours"] < 0.7 and auc["ratio"] == pytest.approx(auc["ours"] / auc["baseline"], rel=1e-3)


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_the_cpu_case_times_both_paths_and_gives_their_ratio():
    out = subprocess.run([sys.executable, "-m", "bench.torchsparse", "--cases", "cpu", "--rounds", "1"], cwd=REPO,
                         env=repo_env(), capture_output=True, text=True, timeout=280, check=True)
    recs = {r["case"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert set(recs) == {"cpu-dense", "cpu-sparse", "cpu-sparse-vs-dense"}
    assert recs["cpu-dense"]["ours"] > 0 and recs["cpu-sparse"]["ours"] > 0
    assert recs["cpu-sparse-vs-dense"]["ours"] == pytest.approx(recs["cpu-sparse"]["ours"] / recs["cpu-dense"]["ours"],
                                                                rel=1e-3)
