"""bench.torchsparse (DLRM on a 100M-row sparse embedding table): a short run of both cases through
``bosen launch``, and what its records say."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench.common import REPO, repo_env


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_a_short_run_stores_only_the_rows_touched_reports_both_tables_and_times_both_cpu_paths():
    """One run of the sparse, dense and cpu cases (one bench process: its start and data once); 5 steps
    a worker, the dense table and the cpu case's tables of 50,000 rows, the cpu case 24 steps (4 timed):
    the records are under test here, and none of them depends on these sizes."""
    out = subprocess.run([sys.executable, "-m", "bench.torchsparse", "--quick", "--samples", "10240",
                          "--cases", "sparse,dense,cpu", "--rounds", "1", "--dense-rows", "50000",
                          "--steps", "24"], cwd=REPO,
                         env=repo_env(), capture_output=True, text=True, timeout=380, check=True)
    lines = [json.loads(x) for x in out.stdout.splitlines()]
    recs = {(r["case"], r["metric"]): r for r in lines}
    touched = recs["sparse", "rows_touched_per_worker"]["ours"]
    stored = recs["sparse", "rows_stored"]["ours"]
    # the servers store the rows some worker touched (and rank 0's held-out rows), never the 100M
    assert max(touched) < stored < sum(touched) + 10_000 * 26 and stored < 10**6, (stored, touched)
    assert recs["sparse", "rows_stored"]["table_rows"] == 100_000_000
    assert recs["dense", "rows_stored"]["ours"] == 50_000  # a dense table stores every row
    assert len(recs["sparse", "worker_rss_mb"]["ours"]) == 2 and len(recs["sparse", "server_rss_mb"]["ours"]) == 2
    assert recs["sparse", "step_ms"]["ours"] > 0
    auc = recs["sparse-vs-dense", "heldout_auc"]
    # 5 steps a worker learn next to nothing: the records, not the model, are under test here
    assert 0.3 < auc["ours"] < 0.7 and auc["ratio"] == pytest.approx(auc["ours"] / auc["baseline"], rel=1e-3)
    cpu = {r["case"]: r for r in lines if r["case"].startswith("cpu")}
    assert set(cpu) == {"cpu-dense", "cpu-sparse", "cpu-sparse-vs-dense"}
    assert cpu["cpu-dense"]["ours"] > 0 and cpu["cpu-sparse"]["ours"] > 0
    assert cpu["cpu-sparse-vs-dense"]["ours"] == pytest.approx(cpu["cpu-sparse"]["ours"] / cpu["cpu-dense"]["ours"],
                                                               rel=1e-3)
