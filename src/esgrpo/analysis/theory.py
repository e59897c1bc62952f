"""Norm theory of the ES update and a least-squares check of it against logged norms.

With z-scored fitness the step is ``alpha / N * sum_n z_n eps_n`` and ``sum_n z_n^2 = N``, so
each step has expected squared norm ``alpha^2 d / N``; steps are nearly orthogonal in high
dimension, so ``E ||theta_T - theta_0||^2 ~= alpha^2 T d / N`` grows linearly in T. It holds for any
one-sided weights with ``sum_n w_n^2 = N``: z-scores, and rank / raw weights only under
``ESConfig.unit_rms_weights`` (unscaled ranks give ``N(N+1) / (12(N-1))``, raw fitness its level); the
report checks it on z-scored one-sided runs (``esgrpo.report.planning.ZSCORE_ONE_SIDED``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["expected_es_sq_norm", "expected_es_norm", "fit_sq_norm_vs_t"]


def expected_es_sq_norm(
    alpha: float, n_members: int, d: int | float, t: float | np.ndarray
) -> float | np.ndarray:
    """Expected ``||theta_t - theta_0||^2 = alpha^2 * t * d / n_members`` for z-scored ES."""
    if n_members <= 0:
        raise ValueError(f"n_members must be positive, got {n_members}")
    out = alpha**2 * np.asarray(t, dtype=np.float64) * d / n_members
    return float(out) if out.ndim == 0 else out


def expected_es_norm(alpha: float, n_members: int, d: int | float, t: float) -> float:
    """Expected update norm ``alpha * sqrt(t * d / n_members)``."""
    return math.sqrt(float(expected_es_sq_norm(alpha, n_members, d, t)))


def fit_sq_norm_vs_t(
    t: Sequence[float] | np.ndarray,
    sq_norm: Sequence[float] | np.ndarray,
    alpha: float | None = None,
    n_members: int | None = None,
    d: int | float | None = None,
) -> dict[str, float]:
    """Least-squares line ``sq_norm = slope * t + intercept`` (numpy.polyfit): the one fit of the norm
    theory, of an ES run's logged norms (pipeline.theory) and of the paper tables (report.frames).

    Returns slope, intercept, r2 and ``slope_ratio_to_theory`` = slope / (alpha^2 d / N),
    which is NaN unless alpha, n_members and d are all given (1.0 means the theory holds).
    """
    x = np.asarray(t, dtype=np.float64).ravel()
    y = np.asarray(sq_norm, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError(f"t and sq_norm differ in length: {x.size} vs {y.size}")
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("need at least two distinct t values")
    slope, intercept = (float(v) for v in np.polyfit(x, y, 1))
    ym = y.mean()
    ss_res = float(((y - (slope * x + intercept)) ** 2).sum())
    ss_tot = float(((y - ym) ** 2).sum())
    if ss_tot > 0:
        r2 = 1.0 - ss_res / ss_tot
    else:  # flat data: a perfect fit if the line reproduces it exactly
        r2 = 1.0 if ss_res == 0 else math.nan
    if alpha is not None and n_members is not None and d is not None:
        ratio = slope / float(expected_es_sq_norm(alpha, n_members, d, 1.0))
    else:
        ratio = math.nan
    return {"slope": slope, "intercept": intercept, "r2": r2, "slope_ratio_to_theory": ratio}
