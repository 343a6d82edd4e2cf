"""bosen/goodput.py: Pollux's goodput model against answers worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bosen.goodput import POWER_MIN, Throughput, best_config, efficiency, fit_grad, fit_throughput, lr_gain, sync_seed


def test_efficiency_is_one_at_m0_and_follows_eq_6() -> None:
    assert efficiency(100.0, 32, 32) == 1.0
    assert efficiency(100.0, 32, 128) == pytest.approx(132 / 228)
    assert efficiency(0.0, 32, 320) == pytest.approx(0.1)  # no noise: a 10x batch is 10x the work
    assert efficiency(math.inf, 32, 320) == 1.0
    np.testing.assert_allclose(efficiency(32.0, 32, np.array([32.0, 96.0])), [1.0, 0.5])
    with pytest.raises(ValueError, match="phi"):
        efficiency(-1.0, 32, 64)


def test_efficiency_under_the_square_root_rule_is_the_root_of_eq_6() -> None:
    # no noise: a 16x batch at 4x the rate makes 4x a step's progress for 16x the examples
    assert efficiency(0.0, 64, 1024.0, "sqrt") == pytest.approx(0.25)
    assert efficiency(100.0, 32, 128, "sqrt") == pytest.approx(math.sqrt(132 / 228))
    assert efficiency(math.inf, 32, 320, "sqrt") == 1.0 and efficiency(100.0, 32, 32, "sqrt") == 1.0
    with pytest.raises(ValueError, match="rule"):
        efficiency(1.0, 32, 64, "cubic")


def test_adascale_gain_is_the_repo_formula_and_the_other_rules() -> None:
    var, sqr, m0, big = 3.0, 0.5, 16, 64  # AdaptDL's var is tr Σ / M0, so φ = M0·var/sqr
    phi = m0 * var / sqr
    scale = big / m0
    assert lr_gain("adascale", phi, m0, big) == pytest.approx((var + sqr) / (var / scale + sqr))
    assert lr_gain("adascale", phi, m0, m0) == pytest.approx(1.0)
    assert lr_gain("sqrt", phi, m0, big) == 2.0 and lr_gain("linear", phi, m0, big) == 4.0
    with pytest.raises(ValueError, match="rule"):
        lr_gain("lars", phi, m0, big)
    with pytest.raises(ValueError, match="below m0"):
        lr_gain("sqrt", phi, m0, 8)


def test_t_iter_sums_maxes_and_accumulates() -> None:
    th = Throughput(alpha_grad=0.1, beta_grad=0.01, alpha_sync=0.5, beta_sync=0.1, gamma=1.0)
    # T_grad(10) = 0.2, T_sync(3) = 0.5 + 0.2 = 0.7; γ = 1 adds; two accumulation steps add 2·0.2
    assert float(th.t_iter(10, 0, 3)) == pytest.approx(0.9)
    assert float(th.t_iter(10, 2, 3)) == pytest.approx(1.3)
    assert float(th.t_iter(10, 0, 1)) == pytest.approx(0.7)  # a PS syncs with one worker too
    over = Throughput(0.1, 0.01, 0.5, 0.1, gamma=10.0)  # near-perfect overlap: about the max
    assert float(over.t_iter(10, 0, 3)) == pytest.approx(0.7, rel=1e-4)
    assert float(th.throughput(10, 2, 3)) == pytest.approx(90 / 1.3)
    assert sync_seed(1e6, 200.0) == pytest.approx(0.04)  # 8 Mbit at 200 Mbit/s
    with pytest.raises(ValueError, match="gamma"):
        Throughput(0.1, 0.01, 0.5, 0.0, gamma=0.5)


def test_fit_recovers_a_known_model_and_predicts_held_out_points() -> None:
    true = Throughput(alpha_grad=0.02, beta_grad=0.001, alpha_sync=0.05, beta_sync=0.01, gamma=2.0)
    rng = np.random.default_rng(0)
    grid = [(m, s, k) for m in (16, 64, 256, 1024) for s in (0, 1) for k in (1, 2, 4, 8)]
    m, s, k = (np.array(x, float) for x in zip(*grid, strict=True))
    t = true.t_iter(m, s, k) * np.exp(rng.normal(0, 0.05, m.size))  # 5% log noise
    train = rng.random(m.size) < 0.7
    fit = fit_throughput(m[train], s[train], k[train], t[train])
    pred = fit.t_iter(m[~train], s[~train], k[~train])
    err = np.abs(pred / true.t_iter(m[~train], s[~train], k[~train]) - 1)
    assert err.mean() < 0.05, (fit, err)


def test_fit_holds_what_the_data_cannot_show_at_the_prior() -> None:
    prior = Throughput(0.01, 0.001, 0.2, 0.0, 1.0)
    fit = fit_throughput([32, 64, 128], [0, 0, 0], [1, 1, 1], [0.3, 0.3, 0.3], prior=prior)
    assert fit.alpha_sync == pytest.approx(0.2) and fit.gamma == 1.0  # one worker count seen
    assert fit.beta_sync == pytest.approx(0.0, abs=1e-7)
    assert float(fit.t_iter(64, 0, 1)) == pytest.approx(0.3, rel=0.02)
    with pytest.raises(ValueError, match="seconds > 0"):
        fit_throughput([32], [0], [1], [0.0])


def test_fit_grad_recovers_a_curve_from_three_sizes_and_a_line_from_two() -> None:
    m = np.array([32.0, 128.0, 512.0])
    t = 0.004 + 0.003 * m**0.6  # exact points of a known curve: α, β and p come back
    alpha, beta, p = fit_grad(m, t)
    assert (alpha, beta, p) == pytest.approx((0.004, 0.003, 0.6), rel=1e-5)
    # two sizes fix a line: p = 1, the line through both
    assert fit_grad([32.0, 128.0], [0.1, 0.25]) == pytest.approx((0.05, 0.0015625, 1.0))
    # a line measured at three sizes stays a line
    assert fit_grad([16.0, 64.0, 256.0], [0.01 + 1e-3 * x for x in (16, 64, 256)]) == pytest.approx((0.01, 1e-3, 1.0))
    # a curve that wants α < 0 is held at α = 0, and p at POWER_MIN where the data would go below it
    a0, b0, p0 = fit_grad(m, [0.038, 0.116, 0.280])
    assert a0 == 0.0 and b0 > 0 and 0.6 < p0 < 0.8
    assert fit_grad([10.0, 1000.0, 100000.0], [1.0, 1.01, 1.02])[2] == pytest.approx(POWER_MIN)
    with pytest.raises(ValueError, match="two distinct batch sizes"):
        fit_grad([64.0, 64.0], [0.1, 0.2])
    with pytest.raises(ValueError, match="seconds > 0"):
        fit_grad([32.0, 64.0], [0.1, -0.2])


def test_the_curved_form_predicts_and_fit_throughput_finds_it_from_three_sizes_when_asked() -> None:
    curve = Throughput(alpha_grad=0.01, beta_grad=0.004, alpha_sync=0.02, power=0.5)
    assert float(curve.t_iter(400, 0, 1)) == pytest.approx(0.01 + 0.004 * 20 + 0.02)
    with pytest.raises(ValueError, match="power"):
        Throughput(0.1, 0.01, 0.5, power=1.5)
    m = np.array([16.0, 64.0, 256.0, 1024.0, 16.0, 64.0, 256.0, 1024.0])
    k = np.array([1.0] * 4 + [2.0] * 4)
    true = Throughput(alpha_grad=0.005, beta_grad=0.002, alpha_sync=0.01, beta_sync=0.004, gamma=1.0, power=0.6)
    t = true.t_iter(m, 0, k)
    fit = fit_throughput(m, np.zeros(m.size), k, t, curved=True)
    assert fit.power == pytest.approx(0.6, abs=0.02)
    assert np.allclose(fit.t_iter(4096.0, 0, 1), true.t_iter(4096.0, 0, 1), rtol=0.02)
    line = fit_throughput(m, np.zeros(m.size), k, t)
    assert line.power == 1.0  # eq. 8's line, the default: it misses the large batch's time
    assert abs(float(line.t_iter(4096.0, 0, 1) / true.t_iter(4096.0, 0, 1)) - 1) > 0.1
    two = fit_throughput(m[m <= 64], np.zeros(4), k[m <= 64], t[m <= 64], curved=True)
    assert two.power == 1.0  # two sizes: linear


def test_the_choice_grows_the_batch_with_phi_and_with_the_sync_cost() -> None:
    th = Throughput(alpha_grad=0.0, beta_grad=0.001, alpha_sync=0.05, beta_sync=0.0, gamma=1.0)
    small = best_config(th, phi=10.0, m0=32, workers=2, max_batch=4096, max_local=512)
    large = best_config(th, phi=5000.0, m0=32, workers=2, max_batch=4096, max_local=512)
    assert 32 <= small.batch < large.batch
    # worked answer: goodput(M) = M/(0.001·M/2 + 0.05) · (φ+32)/(φ+M) peaks at M = sqrt(100·φ·...)
    grid = np.arange(32, 4097)
    good = grid / (0.001 * grid / 2 + 0.05) * (5000 + 32) / (5000 + grid)
    assert large.batch == pytest.approx(grid[np.argmax(good)], rel=0.1)
    slow = Throughput(0.0, 0.001, 0.5, 0.0, 1.0)  # a tighter bandwidth budget: a dearer push/pull
    assert best_config(slow, 500.0, 32, 2, 4096, 512).batch > best_config(th, 500.0, 32, 2, 4096, 512).batch
    mem = best_config(th, phi=5000.0, m0=32, workers=2, max_batch=4096, max_local=64)
    assert mem.m <= 64 and mem.s >= 1 and mem.batch == 2 * mem.m * (mem.s + 1)
    with pytest.raises(ValueError, match="max_batch"):
        best_config(th, 10.0, 32, 2, 16, 64)
