"""bosen/gradstats.py: the gradient statistics DBW (and later Pollux) read, against direct computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bosen.gradstats import Ema, Moments, NoiseScale, Window, adam_preconditioner, differenced, moments, smoothness


def _moments(g: np.ndarray) -> Moments:
    mean = g.mean(axis=0)
    return Moments(g.shape[0], float((g * g).sum(axis=1).mean()), float(mean @ mean))


def test_moments_equal_the_direct_estimators() -> None:
    g = np.random.default_rng(0).standard_normal((5, 40)) + 0.3
    m = _moments(g)
    mean = g.mean(axis=0)
    assert m.variance == pytest.approx(((g - mean) ** 2).sum() / 4)  # eq. 10
    assert m.sqnorm == pytest.approx(mean @ mean - m.variance / 5)  # eq. 11


def test_moments_recover_mean_and_noise() -> None:
    rng = np.random.default_rng(1)
    mu = rng.standard_normal(200)
    sigma = 0.7
    m = _moments(mu + sigma * rng.standard_normal((400, 200)))
    assert m.variance == pytest.approx(200 * sigma**2, rel=0.02)
    assert m.sqnorm == pytest.approx(float(mu @ mu), rel=0.05)
    assert m.noise_scale == pytest.approx(m.variance / m.sqnorm)


def test_one_gradient_has_no_variance() -> None:
    m = Moments(1, 2.0, 2.0)
    assert not m.defined and math.isnan(m.variance) and math.isnan(m.sqnorm)
    w = Window(3)
    for v in (1.0, math.nan, 2.0, 3.0, 4.0):
        w.add(v)
    assert len(w) == 3 and w.full and w.mean() == 3.0  # the nan left out, the oldest dropped


def test_smoothness_is_exact_on_a_quadratic_without_noise() -> None:
    # F = L/2 |w|^2: the gradient is L w; one step of size eta, gradients exact (two equal workers)
    L, eta = 3.0, 0.1
    w0 = np.array([1.0, -2.0, 0.5])
    g0 = L * w0
    g1 = L * (w0 - eta * g0)
    prev = Moments(2, float(g0 @ g0), float(g0 @ g0))
    assert smoothness(prev, float(g1 @ g0), eta) == pytest.approx(L)


def test_smoothness_averages_to_the_curvature_along_noisy_steps() -> None:
    # F = 1/2 w'Hw, H = diag(h), noisy gradients: the estimate is E[g'Hg]/E|g|^2 of the steps taken
    rng = np.random.default_rng(2)
    h = np.linspace(0.5, 2.0, 50)
    eta, k, sigma = 0.2, 4, 0.3
    est, curv_num, curv_den = [], 0.0, 0.0
    for _ in range(3000):
        w = rng.standard_normal(50)
        g0 = h * w + sigma * rng.standard_normal((k, 50))
        step = g0.mean(axis=0)
        g1 = h * (w - eta * step) + sigma * rng.standard_normal((k, 50))
        est.append(smoothness(_moments(g0), float(g1.mean(axis=0) @ step), eta))
        curv_num += step @ (h * step)
        curv_den += step @ step
    assert np.mean(est) == pytest.approx(curv_num / curv_den, rel=0.05)


# ------------------------------------------------------------------------------------------------
# Pollux's reading: per example, smoothed


def test_moments_of_an_array_equal_the_sums_and_phi_is_per_example() -> None:
    rng = np.random.default_rng(2)
    g = rng.standard_normal((6, 3, 5))
    m = moments(g)
    ref = _moments(g.reshape(6, -1))
    assert (m.k, m.local, m.total) == (6, pytest.approx(ref.local), pytest.approx(ref.total))
    assert m.trace(8) == pytest.approx(8 * m.variance)
    assert m.phi(8) == pytest.approx(8 * m.variance / m.sqnorm)
    assert m.sqnorm_raw == pytest.approx((6 * m.total - m.local) / 5)
    with pytest.raises(ValueError, match="k >= 1"):
        moments(np.zeros((0, 4)))


def test_micro_batches_and_workers_estimate_the_per_example_trace_and_phi() -> None:
    """Examples drawn with known mean G and covariance σ²I (tr Σ = dσ²): k gradients of b examples,
    from workers or from micro-batches alike, give tr Σ and φ = tr Σ/‖G‖² after smoothing."""
    rng = np.random.default_rng(3)
    d, sigma = 50, 2.0
    mu = rng.standard_normal(d) * 0.5
    exact_phi = d * sigma**2 / float(mu @ mu)
    for k, b in ((4, 16), (2, 64)):  # 4 workers of 16, or one worker's 128 in two micro-batches
        ns = NoiseScale(m0=32, smoothing=0.99)
        for _ in range(300):
            ex = mu + sigma * rng.standard_normal((k, b, d))
            ns.update(moments(ex.mean(axis=1)), b)
        assert ns.trace == pytest.approx(d * sigma**2, rel=0.05)
        assert ns.phi == pytest.approx(exact_phi, rel=0.15), (k, b)


def test_adam_preconditioner_is_the_divisor_of_torch_adams_step() -> None:
    """With β1 = 0 Adam steps each coordinate by lr·g/(√v̂ + ε) exactly: the preconditioner read from
    its state after the step is lr·g/|Δw|."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    w = torch.nn.Parameter(torch.from_numpy(rng.standard_normal(7)))
    opt = torch.optim.Adam([w], lr=0.01, betas=(0.0, 0.9), eps=1e-3)
    for _ in range(3):
        g = torch.from_numpy(rng.standard_normal(7) * np.arange(1, 8))
        before = w.detach().clone()
        w.grad = g
        opt.step()
        st = opt.state[w]
        pinv = adam_preconditioner(st["exp_avg_sq"].numpy(), int(st["step"]), 0.9, 1e-3)
        assert np.allclose(pinv, 0.01 * g.numpy() / (before - w.detach()).numpy())
    with pytest.raises(ValueError, match="step >= 1"):
        adam_preconditioner(np.ones(3), 0, 0.9, 1e-8)


def test_preconditioned_phi_matches_the_exact_value_on_least_squares() -> None:
    """Pollux's φ for Adam, tr(PΣPᵀ)/‖PG‖² with P = diag(1/(√v̂ + ε)) (eq. 5), on least squares over
    400 examples whose features differ in scale by 100x: the exact φ from every example's gradient,
    against the estimate from two micro-batches a step (``moments(grads, pinv)``, smoothed). P here
    is what Adam holds after 20 full-batch steps; plain φ (P = I) is far from it, so the test tells
    the two apart."""
    rng = np.random.default_rng(7)
    n, d = 400, 8
    x = rng.standard_normal((n, d)) * np.geomspace(0.1, 10.0, d)
    y = x @ rng.standard_normal(d) + rng.standard_normal(n)
    w = np.zeros(d)
    per_example = x * (x @ w - y)[:, None]  # ∇ of (x·w − y)²/2 for each example
    v = np.zeros(d)
    for t in range(1, 21):  # Adam's second moment along full-batch steps (β2 = 0.999)
        g = per_example.mean(axis=0)
        v = 0.999 * v + 0.001 * g * g
        w = w - 0.01 * g / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
        per_example = x * (x @ w - y)[:, None]
    pinv = adam_preconditioner(v, 20, 0.999, 1e-8)
    big_g = per_example.mean(axis=0)
    var = per_example.var(axis=0)  # Σ's diagonal (uniform draws of one example)
    exact = float(np.sum(var / pinv**2) / np.sum((big_g / pinv) ** 2))
    plain = float(np.sum(var) / (big_g @ big_g))
    assert not 0.5 < plain / exact < 2.0, (plain, exact)  # the preconditioner matters here
    ns = NoiseScale(m0=256, smoothing=0.999)
    b = 128  # M = 256, about φ: the estimate's noise stays small (docs/evaluation.md)
    for _ in range(3000):
        idx = rng.integers(0, n, (2, b))  # two micro-batches of b examples, drawn with replacement
        ns.update(moments(per_example[idx].mean(axis=1), pinv), b)
    assert ns.phi == pytest.approx(exact, rel=0.2), (ns.phi, exact, plain)  # 6 seeds: 0.93-1.11
    with pytest.raises(ValueError, match="pinv must hold 8 values"):
        moments(per_example[:2], np.ones(3))


def test_ema_is_bias_corrected_and_the_factor_follows_the_batch() -> None:
    e = Ema()
    assert math.isnan(e.value)
    e.add(5.0, 0.9)
    assert e.value == pytest.approx(5.0)  # no pull towards the initial 0
    e.add(1.0, 0.9)
    assert e.value == pytest.approx((0.9 * 0.1 * 5 + 0.1 * 1) / (0.9 * 0.1 + 0.1))
    with pytest.raises(ValueError, match="factor"):
        e.add(1.0, 1.0)
    # a step of 4·M0 decays the past like four steps of M0
    a, b = NoiseScale(m0=8, smoothing=0.9), NoiseScale(m0=8, smoothing=0.9)
    a.update(Moments(2, 2.0, 1.0), 4)
    b.update(Moments(2, 2.0, 1.0), 4)
    a.update(Moments(2, 4.0, 1.0), 16)  # M = 32 = 4·M0
    for _ in range(4):
        b.update(Moments(2, 4.0, 1.0), 4)
    assert a.sqnorm == pytest.approx(b.sqnorm) and a.steps == 2 and b.steps == 5
    ns = NoiseScale(m0=8)
    ns.update(Moments(1, 1.0, 1.0), 4)  # one gradient: nothing measurable, skipped
    assert ns.steps == 0 and math.isnan(ns.phi)
    with pytest.raises(ValueError, match="m0"):
        NoiseScale(m0=0)


def test_differenced_takes_two_consecutive_gradients_as_samples() -> None:
    a, b = np.array([1.0, 2.0]), np.array([3.0, 0.0])
    m = differenced(a, b)
    assert m.k == 2 and m.variance == pytest.approx(float(((a - b) ** 2).sum()) / 2)
