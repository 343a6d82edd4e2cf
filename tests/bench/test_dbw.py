"""bench.dbw: the virtual-clock DBW experiment in miniature (4 workers, 2 seeds): its JSON lines, and
the two properties the full run reports (DBW near the best static k; k_t at n/2 after the slowdown)."""

from __future__ import annotations

import json

import pytest

from bench.dbw.__main__ import main
from bench.dbw.sim import simulate
from bosen.apps.delays import DelayArgs
from bosen.apps.mlr import data as D
from bosen.config import BackupConfig


def test_a_simulated_run_is_deterministic_and_equal_times_take_everyone():
    ds = D.digits()
    delay = DelayArgs(mean_s=1.0, alpha=0.0, seed=3)
    a = simulate(ds, BackupConfig(mode="dynamic", lr=1.0), 4, 16, delay, 0.5, 500.0)
    b = simulate(ds, BackupConfig(mode="dynamic", lr=1.0), 4, 16, delay, 0.5, 500.0)
    assert a == b and a.time_to_target < 500
    assert set(a.k) == {4}  # deterministic equal round trips: waiting for everyone costs nothing
    assert a.time_to_target == a.steps  # one time unit per step


def test_quick_run_reports_each_method_and_the_summaries(capsys: pytest.CaptureFixture[str]):
    main(["--quick", "--seeds", "2", "--alphas", "1.0"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    runs = [r for r in lines if r.get("experiment") == "alpha" and "method" in r]
    assert [r["method"] for r in runs] == ["static1", "static2", "static3", "static4", "dynamic", "blind"]
    assert all({"bench", "case", "metric", "unit", "ours"} <= r.keys() for r in lines[:-1])
    best, blind = [r for r in lines if r.get("experiment") == "alpha" and r.get("summary")]
    assert best["baseline_name"].startswith("static") and blind["baseline_name"] == "blind"
    assert best["within_10pct"] and best["ratio"] >= 1 / 1.1, best
    assert best["ratio"] == pytest.approx(best["baseline"] / best["ours"], rel=1e-3)
    (slow,) = [r for r in lines if r.get("experiment") == "slowdown" and r.get("summary")]
    assert slow["ours"] <= 2.5, slow  # k_t 20-40 iterations after: n/2 = 2 for 4 workers
    assert lines[-1]["done"] is True


def test_the_processes_run_is_seed_major_and_skips_the_jobs_of_an_earlier_run(tmp_path):
    from argparse import Namespace

    from bench.dbw.__main__ import methods
    from bench.dbw.processes import check_same, load, plan

    a = Namespace(seeds=3, alphas=[0.0, 1.0], experiments=["alpha", "slowdown"], slow_seeds=2)
    jobs = plan(a, methods(2, ["static2", "dynamic"]))
    assert [(j.experiment, j.seed, j.alpha, j.method) for j in jobs[:6]] == [
        ("slowdown", 0, 0.0, "dynamic"), ("alpha", 0, 0.0, "static2"), ("alpha", 0, 0.0, "dynamic"),
        ("alpha", 0, 1.0, "static2"), ("alpha", 0, 1.0, "dynamic"), ("slowdown", 1, 0.0, "dynamic")]
    assert len(jobs) == 3 * 4 + 2
    earlier = tmp_path / "run.jsonl"
    earlier.write_text("not json\n" + json.dumps({"bench": "dbw", "case": "alpha=0 static2"}) + "\n" +
                       json.dumps({"job": True, "experiment": "alpha", "seed": 0, "alpha": 1, "method": "dynamic",
                                   "time_to_target": None, "workers": 2, "unit_s": 0.05, "lr": 1.0, "batch": 16,
                                   "target": 0.4, "cap": 150.0}) + "\n")
    done = load([str(earlier)])
    assert list(done) == [jobs[4].key] and done[jobs[4].key]["time_to_target"] is None
    same = Namespace(workers=2, unit_s=0.05, lr=1.0, batch=16, target=0.4, cap=150)
    check_same(done, same)
    with pytest.raises(ValueError, match="unit_s = 0.05, this run has 0.1"):
        check_same(done, Namespace(**{**vars(same), "unit_s": 0.1}))
