"""Unit tests of esgrpo.analysis.theory: the fitted slope and simulated ES steps."""

import math

import numpy as np
import pytest

from esgrpo.analysis.theory import expected_es_norm, expected_es_sq_norm, fit_sq_norm_vs_t

# ------------------------------------------------------------------ theory


def test_theory_fit_recovers_slope():
    alpha, n, d = 5e-4, 30, 1_000_000
    t = np.arange(1, 11)
    sq = expected_es_sq_norm(alpha, n, d, t)
    fit = fit_sq_norm_vs_t(t, sq, alpha=alpha, n_members=n, d=d)
    assert fit["slope"] == pytest.approx(alpha**2 * d / n)
    assert fit["intercept"] == pytest.approx(0.0, abs=1e-12)
    assert fit["r2"] == pytest.approx(1.0)
    assert fit["slope_ratio_to_theory"] == pytest.approx(1.0)
    assert math.isnan(fit_sq_norm_vs_t(t, 2 * t + 1)["slope_ratio_to_theory"])
    assert expected_es_norm(alpha, n, d, 4) == pytest.approx(alpha * math.sqrt(4 * d / n))
    with pytest.raises(ValueError):
        fit_sq_norm_vs_t([1, 1], [2, 3])


def test_theory_matches_simulated_es_steps():
    # simulate z-scored ES steps in d dims: ||sum of steps||^2 should follow alpha^2 T d / N
    rng = np.random.default_rng(0)
    alpha, n, d, steps = 0.01, 8, 5000, 20
    theta, sq = np.zeros(d), []
    for _ in range(steps):
        eps = rng.standard_normal((n, d))
        f = rng.standard_normal(n)
        z = (f - f.mean()) / f.std()
        theta += alpha / n * z @ eps
        sq.append(theta @ theta)
    fit = fit_sq_norm_vs_t(np.arange(1, steps + 1), sq, alpha=alpha, n_members=n, d=d)
    assert fit["slope_ratio_to_theory"] == pytest.approx(1.0, rel=0.15)
