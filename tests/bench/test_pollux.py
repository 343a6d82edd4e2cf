"""bench.pollux: φ on MLR against its exact value, in miniature (digits, one seed, few steps): the exact
statistics against a direct per-example computation, and the estimate near the exact value."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.pollux.__main__ import main
from bench.pollux.phi import ExactStats
from bosen.apps.mlr import data as D
from bosen.apps.mlr.kernels import loss_grad


def test_exact_statistics_equal_the_per_example_gradients() -> None:
    ds = D.digits().take(np.arange(200))
    W = np.random.default_rng(0).normal(0, 0.1, (ds.classes, ds.features + 1))
    per = np.stack([loss_grad(ds.indptr, ds.indices, ds.values, ds.labels, np.array([i]), W)[1].ravel()
                    for i in range(ds.n)])
    G = per.mean(axis=0)
    e = ExactStats(ds).at(W)
    assert e.sqnorm == pytest.approx(float(G @ G), rel=1e-6)
    assert e.trace == pytest.approx(float(((per - G) ** 2).sum(axis=1).mean()), rel=1e-6)


def test_quick_run_puts_phi_within_20pct_where_the_estimator_has_warmed_up(
        capsys: pytest.CaptureFixture[str]) -> None:
    main(["--quick", "--seeds", "1", "--points", "20", "--warmup", "200", "--steps", "120", "--every", "20"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert all({"bench", "metric", "unit"} <= r.keys() for r in lines[:-1]) and lines[-1]["done"] is True
    summ = {(r["experiment"], r["estimator"]): r for r in lines if r.get("summary")}
    assert set(summ) == {("fixed", "workers"), ("fixed", "micro"), ("fixed", "differenced"),
                         ("along", "workers"), ("along", "differenced")}
    for key in (("fixed", "workers"), ("fixed", "micro"), ("along", "workers")):
        assert 0.8 <= summ[key]["ours"] <= 1.2, summ[key]


def test_held_out_error_is_small_where_the_times_follow_the_model() -> None:
    from bench.pollux.steps import held_out_errors, in_sample_errors
    from bosen.goodput import Throughput

    true = Throughput(alpha_grad=2e-4, beta_grad=3e-6, alpha_sync=1e-3, beta_sync=5e-4, gamma=1.5)
    ms, ks = [32, 256, 2048] * 3, [1] * 3 + [2] * 3 + [3] * 3
    secs = [float(true.t_iter(m, 0, k)) for m, k in zip(ms, ks, strict=True)]
    errs = held_out_errors(ms, ks, secs)
    assert len(errs) == 9 and max(errs) < 0.05, errs
    assert max(in_sample_errors(ms, ks, secs)) < 0.01


def test_noise_floor_predicts_each_round_from_the_others() -> None:
    from bench.pollux.steps import noise_floor

    assert noise_floor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]) == [0.0] * 6
    assert noise_floor([[1.0, 2.0, 4.0]]) == pytest.approx([2.0, 0.25, 0.625])
    assert noise_floor([[1.0]]) == []


def test_adaptive_run_summary_helpers() -> None:
    from bench.pollux.adaptive import Plan, Run, config, grows

    r = Run(Plan("adaptive", 40), 9.0, evals=[(0.0, 0, 2.3, 0.1), (1.0, 20, 0.6, 0.8), (2.0, 40, 0.5, 0.85)])
    assert r.time_to(0.55) == 2.0 and r.time_to(0.1) == float("inf") and r.best_acc == 0.85
    assert grows([64, 100, 120, 300, 400]) == {"first_half": 120, "second_half": 400, "ratio": 400 / 120}
    big = config(Plan("fixed-large", 40, bandwidth_mbps=20.0))
    assert big["app"]["args"]["batch_size"] == 512 and big["app"]["args"]["goodput"]["adapt"] is False
    assert big["comm"]["client_bandwidth_mbps"] == 20.0 and big["tables"]["W"]["dtype"] == "float32"
    cnn = config(Plan("fixed-large", 40, app="cnn", large=8))  # the model's table comes from app.tables
    assert cnn["app"]["args"]["batch_size"] == 256 and cnn["app"]["args"]["backup"] == {"mode": "static", "k": 2}
    assert list(cnn["tables"]) == ["goodput"] and cnn["app"]["tables"].endswith("cnn:tables")
    with pytest.raises(ValueError, match="without budgets or injected delays"):
        config(Plan("adaptive", 40, app="cnn", delay_s=0.05))


@pytest.mark.slow
def test_quick_adaptive_job_records_its_choices(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    main(["--quick", "--experiments", "adaptive", "--modes", "adaptive", "--adaptive-plot", str(tmp_path / "a.png")])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    (one,) = [r for r in lines if r.get("experiment") == "adaptive" and r.get("rep") == 0]
    assert len(one["batches"]) == 3 and one["batches"][0] == 64 and min(one["batches"]) >= 64
    assert one["ours"] is not None and one["best_acc"] > 0.8, one  # digits reaches the quick target
    assert (tmp_path / "a.png").stat().st_size > 0 and lines[-1]["done"] is True


def test_a_shaped_loopback_namespace_sends_at_its_rate() -> None:
    """``--links``: 250 KB between two processes in the namespace take about 0.4 s at 5 Mbit/s (under
    10 ms on the host's loopback): the job there pays the link's rate."""
    import os
    import shutil
    import subprocess
    import sys

    from bench.pollux.adaptive import shaped_loopback

    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        pytest.skip("needs root and iproute2 (ip, tc) for a network namespace")
    code = ("import socket, threading, time\n"
            "srv = socket.create_server(('127.0.0.1', 0)); port = srv.getsockname()[1]\n"
            "def sink():\n    c, _ = srv.accept()\n    while c.recv(65536): pass\n"
            "t = threading.Thread(target=sink); t.start()\n"
            "s = socket.create_connection(('127.0.0.1', port)); t0 = time.monotonic()\n"
            "s.sendall(b'x' * 250_000); s.close(); t.join(); print(time.monotonic() - t0)\n")
    with shaped_loopback(5) as ns:
        out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=30)
    assert out.returncode == 0, out.stderr
    assert 0.25 < float(out.stdout) < 5.0


def test_adam_efficiency_of_one_coordinate_is_eq6_and_reach_interpolates() -> None:
    from bench.pollux.adamstat import Curve, adam_efficiency, sqrt_rule_efficiency
    from bosen.goodput import efficiency

    # one coordinate: appendix A.1's Adam form reduces to (φ + M0)/(φ + M) with φ = σ²/G²
    sqr, var = np.array([0.01]), np.array([2.0])
    assert adam_efficiency(sqr, var, 64, 1024) == pytest.approx(float(efficiency(200.0, 64, 1024.0)), rel=1e-9)
    # and the square-root rule's own to its root: coordinates alike (one φ = 200) give the same
    for s_, v_ in ((sqr, var), (np.array([0.01, 0.04, 0.0]), np.array([2.0, 8.0, 0.0]))):
        assert sqrt_rule_efficiency(s_, v_, 64, 1024) == pytest.approx(
            float(efficiency(200.0, 64, 1024.0, "sqrt")), rel=1e-9)
    c = Curve(64, examples=[0, 1000, 4000], loss=[2.0, 1.0, 0.5])
    assert c.reach(1.0) == pytest.approx(1000.0)
    assert 1000.0 < c.reach(0.75) < 4000.0 and c.reach(0.1) == float("inf")


def test_adam_efficiency_experiment_reports_measured_and_predicted(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--experiments", "adam-efficiency", "--seeds", "1", "--adam-batches", "64", "128",
          "--adam-examples", "2048", "--adam-every", "256", "--adam-targets", "2.1"])
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    summ = [r for r in lines if r.get("summary")]
    assert len(summ) == 1 and summ[0]["batch"] == 128 and set(summ[0]["predicted"]) == {
        "after", "before", "plain", "half", "adam", "rule", "sqrt-plain", "sqrt-after", "sqrt-half"}
    pred = summ[0]["predicted"]
    assert 0 < pred["plain"]["median"] <= 1
    # the square-root rule's efficiency of a φ is the root of eq. 6's per step: its harmonic mean over the steps
    # is at least the root of eq. 6's harmonic mean (Cauchy-Schwarz), and at most 1
    assert math.sqrt(pred["plain"]["median"]) - 1e-3 <= pred["sqrt-plain"]["median"] <= 1
