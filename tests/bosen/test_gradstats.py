"""bosen/gradstats.py: the gradient statistics DBW (and later Pollux) read, against direct computation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from bosen.gradstats import Moments, Window, smoothness


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
