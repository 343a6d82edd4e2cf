"""Jobs (bosen.jobs.job): the config builder, and a whole job run through ``bosen launch`` with its
metrics read back, as the benchmarks run theirs."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from conftest import child_env

from bosen import config as config_mod
from bosen.jobs.job import JobFailed, MetricsMerger, job_config, read_metrics, run_job, write_config

pytestmark = pytest.mark.timeout(150)


def launch_job(tmp_path: Path, **args) -> Path:
    cfg = job_config(["127.0.0.1:0"], workers=2, staleness=0, tables={"W": {"rows": 6, "cols": 2, "dtype": "int64"}},
                     app={"module": "launch_worker", "args": args})
    return write_config(tmp_path / "job.yaml", cfg)


def test_job_config_is_valid_config_data(tmp_path: Path) -> None:
    cfg = job_config(["127.0.0.1:7000"], workers=3, comm={"enabled": True})
    assert cfg["cluster"] == {"servers": ["127.0.0.1:7000"], "workers": 3}
    loaded = config_mod.load(write_config(tmp_path / "c.yaml", cfg))
    assert loaded.cluster.workers == 3 and loaded.comm.enabled and [t.name for t in loaded.tables] == ["W"]
    assert yaml.safe_load((tmp_path / "c.yaml").read_text()) == cfg


@pytest.mark.slow
def test_run_job_runs_bosen_launch_and_reads_its_metrics(tmp_path: Path) -> None:
    env = {"PYTHONPATH": child_env()["PYTHONPATH"]}  # launch_worker lives in tests/workers
    job = run_job(launch_job(tmp_path), tmp_path / "run", sets={"app.args.ticks": 3}, workers=2, timeout=100,
                  env=env)
    assert job.ok, job.output()
    assert job.records == read_metrics(tmp_path / "run")
    assert [r["clock"] for r in job.kind("clock")] == [0, 1, 2]
    assert all(r["workers"] == 2 and r["objective"] == 3.0 for r in job.kind("clock"))
    assert len(job.kind("worker")) == 6 and len(job.kind("server")) == 1
    assert job.kind("summary")[0]["clocks"] == 3 and job.seconds > 0
    assert job.check() is job


@pytest.mark.slow
def test_a_failed_job_is_returned_and_check_says_why(tmp_path: Path) -> None:
    env = {"PYTHONPATH": child_env()["PYTHONPATH"]}
    job = run_job(launch_job(tmp_path), tmp_path / "run", sets=["app.args.bogus=1"], timeout=100, env=env)
    assert job.returncode == 1 and not job.ok
    assert "app.args.bogus: unknown key" in job.output()
    with pytest.raises(JobFailed, match=r"bosen launch exited with status 1(.|\n)*app.args.bogus: unknown key"):
        job.check()


def test_the_merger_sums_a_clock_once_every_worker_reported(tmp_path: Path) -> None:
    (tmp_path / "workers").mkdir()
    out = io.StringIO()
    m = MetricsMerger(tmp_path, 2, out)
    with open(tmp_path / "workers" / "0.jsonl", "w") as f:
        f.write(json.dumps({"rank": 0, "clock": 0, "time": 1.0, "samples": 5}) + "\n")
    assert m.poll() == []
    with open(tmp_path / "workers" / "1.jsonl", "w") as f:
        f.write(json.dumps({"rank": 1, "clock": 0, "time": 2.0, "samples": 7}) + "\n")
        f.write('{"rank": 1, "clock": 1')  # half a line: not read yet
    assert m.poll() == [{"kind": "clock", "clock": 0, "workers": 2, "time": 2.0, "samples": 12}]
    assert m.finish() == []


def test_the_merger_derives_heldout_measures_from_the_workers_sums(tmp_path: Path) -> None:
    (tmp_path / "workers").mkdir()
    m = MetricsMerger(tmp_path, 2, io.StringIO())
    for rank, (se, n, ll, tok, ok) in enumerate([(8.0, 10, -30.0, 10, 3), (10.0, 10, -50.0, 30, 0)]):
        rec = {"rank": rank, "clock": 0, "heldout_se": se, "heldout_count": n, "heldout_ll": ll,
               "heldout_tokens": tok, "heldout_correct": ok, "heldout_total": 4 if rank == 0 else 0}
        (tmp_path / "workers" / f"{rank}.jsonl").write_text(json.dumps(rec) + "\n")
    (rec,) = m.poll()
    assert rec["heldout_rmse"] == pytest.approx((18.0 / 20) ** 0.5)  # over all ratings, not a mean of RMSEs
    assert rec["heldout_ll_per_token"] == pytest.approx(-80.0 / 40)
    assert rec["heldout_accuracy"] == pytest.approx(3 / 4)


def test_the_merger_counts_a_replaced_workers_first_records_of_the_clocks_it_redoes(tmp_path: Path) -> None:
    """Worker 1 reported clocks 0..2 (clock 2 twice: one process may report a clock twice) and was
    replaced; its replacement's records of clocks 1 and 2 are kind ``redo`` and not summed, its clock
    3 counts."""
    (tmp_path / "workers").mkdir()
    out = io.StringIO()
    m = MetricsMerger(tmp_path, 2, out)
    rec = lambda r, c, n: json.dumps({"rank": r, "clock": c, "time": 1.0, "samples": n}) + "\n"  # noqa: E731
    (tmp_path / "workers" / "0.jsonl").write_text("".join(rec(0, c, 1) for c in range(4)))
    (tmp_path / "workers" / "1.jsonl").write_text(rec(1, 0, 10) + rec(1, 1, 10) + rec(1, 2, 10) + rec(1, 2, 5))
    assert [r["samples"] for r in m.replaced(1)] == [11, 11, 16]
    with open(tmp_path / "workers" / "1.jsonl", "a") as f:
        f.write(rec(1, 1, 100) + rec(1, 2, 100) + rec(1, 3, 10))
    assert [(r["clock"], r["samples"]) for r in m.poll()] == [(3, 11)]
    kinds = [json.loads(x)["kind"] for x in out.getvalue().splitlines()]
    assert kinds.count("redo") == 2
