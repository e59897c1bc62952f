"""Evaluation statistics: the project's single implementation of Pass@k, mean@n, Maj@n,
population Jensen-Shannon diversity and bootstrap confidence intervals.

Everything here is a pure function of numbers already extracted from rollouts, so table
rules and tests can share it without loading models.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

__all__ = [
    "pass_at_k",
    "pass_at_k_curve",
    "mean_at_n",
    "majority_vote",
    "maj_at_n",
    "bernoulli_entropy",
    "bernoulli_js_divergence",
    "population_js_diversity",
    "bootstrap_ci",
    "bootstrap_ci_grouped",
]


# --------------------------------------------------------------------------- pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k estimator 1 - C(n-c, k) / C(n, k) from ``c`` correct out of ``n`` samples.

    Computed as ``1 - prod_{i=n-c+1}^{n} (1 - k / i)``: the binomial coefficients overflow
    floats for n in the hundreds, while the product of terms in (0, 1] does not.
    """
    for name, v in (("n", n), ("c", c), ("k", k)):
        if int(v) != v or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")
    n, c, k = int(n), int(c), int(k)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if k > n:
        raise ValueError(f"k={k} exceeds the number of samples n={n}")
    if c > n:
        raise ValueError(f"c={c} exceeds the number of samples n={n}")
    if n - c < k:
        # every k-subset contains at least one correct sample
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def pass_at_k_curve(counts: Sequence[int], n: int, ks: Iterable[int]) -> dict[int, float]:
    """Mean over prompts of :func:`pass_at_k` for every k in ``ks`` (``counts``: correct per prompt)."""
    counts = [int(c) for c in counts]
    if not counts:
        raise ValueError("counts is empty")
    return {int(k): float(np.mean([pass_at_k(n, c, int(k)) for c in counts])) for k in ks}


def mean_at_n(counts: Sequence[int], n: int) -> float:
    """Mean@n (= Pass@1 estimate): mean over prompts of the fraction of the ``n`` samples that are correct."""
    arr = np.asarray(counts, dtype=np.float64)
    if arr.size == 0:
        raise ValueError("counts is empty")
    if n < 1 or np.any(arr < 0) or np.any(arr > n):
        raise ValueError(f"counts must lie in [0, n] with n >= 1 (n={n})")
    return float(np.mean(arr / n))


# --------------------------------------------------------------------------- majority vote


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """Most frequent non-None answer; ties go to the answer that occurred first. None if there is none.

    Answers are compared as exact strings: normalise them (e.g. with the task's extractor)
    before voting.
    """
    counts: dict[str, int] = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1  # dicts keep first-occurrence order
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a, c in counts.items() if c == best)


def maj_at_n(per_prompt: Sequence[Sequence[tuple[str | None, bool]]]) -> float:
    """Maj@n: fraction of prompts whose majority-vote answer is correct.

    ``per_prompt[i]`` lists ``(extracted_answer, is_correct)`` for each of prompt i's samples.
    The voted answer counts as correct when any sample carrying that exact answer string was
    graded correct (the grader is a function of the answer, so these agree in practice).
    A prompt with no extracted answer counts as incorrect.
    """
    if len(per_prompt) == 0:
        raise ValueError("per_prompt is empty")
    hits = 0
    for samples in per_prompt:
        winner = majority_vote([a for a, _ in samples])
        if winner is not None and any(ok for a, ok in samples if a == winner):
            hits += 1
    return hits / len(per_prompt)


# --------------------------------------------------------------------------- JS diversity


def bernoulli_entropy(p: np.ndarray | Sequence[float]) -> np.ndarray:
    """Entropy in nats of Bernoulli(p), elementwise, with 0 log 0 = 0."""
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    q = 1.0 - p
    with np.errstate(divide="ignore", invalid="ignore"):
        h = -(
            np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)
            + np.where(q > 0, q * np.log(np.where(q > 0, q, 1.0)), 0.0)
        )
    return h


def bernoulli_js_divergence(p: np.ndarray | Sequence[float]) -> float:
    """Generalised (equal-weight) Jensen-Shannon divergence of N Bernoulli(p_i), in nats.

    JS = H(mean_i p_i) - mean_i H(p_i); 0 when all members agree, at most ln 2.
    """
    p = np.asarray(p, dtype=np.float64).ravel()
    if p.size == 0:
        raise ValueError("p is empty")
    if np.any((p < 0) | (p > 1)) or np.any(~np.isfinite(p)):
        raise ValueError("success probabilities must lie in [0, 1]")
    js = float(bernoulli_entropy(p.mean()) - bernoulli_entropy(p).mean())
    return max(js, 0.0)  # concavity makes it >= 0; clip rounding noise


def population_js_diversity(success: np.ndarray) -> float:
    """Verifier-projected population diversity: mean over prompts of the members' Bernoulli JS.

    ``success`` is ``[members, prompts]``: member i's success rate on prompt j.
    """
    s = np.asarray(success, dtype=np.float64)
    if s.ndim != 2 or s.size == 0:
        raise ValueError(f"success must be a non-empty [members, prompts] array, got shape {s.shape}")
    if np.any((s < 0) | (s > 1)) or np.any(~np.isfinite(s)):
        raise ValueError("success rates must lie in [0, 1]")
    js = bernoulli_entropy(s.mean(axis=0)) - bernoulli_entropy(s).mean(axis=0)
    return float(np.mean(np.maximum(js, 0.0)))


# --------------------------------------------------------------------------- bootstrap

# cap on the number of resample indices held at once (memory, not accuracy)
_CHUNK_ELEMS = 4_000_000


def _percentiles(stats: np.ndarray, alpha: float) -> tuple[float, float]:
    lo, hi = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _check_alpha(alpha: float, n_boot: int) -> None:
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")


def bootstrap_ci(
    values: Sequence[float] | np.ndarray, n_boot: int = 2000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float, float]:
    """Percentile-bootstrap CI of the mean: returns ``(mean, lo, hi)`` at level 1 - alpha.

    Constant data (including a single value) gives exactly ``(v, v, v)``.
    """
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        raise ValueError("values is empty")
    if not np.all(np.isfinite(x)):
        raise ValueError("values contain NaN or inf")
    _check_alpha(alpha, n_boot)
    mean = float(x.mean())
    if np.ptp(x) == 0:
        # every resample has the same mean; short-circuit so rounding cannot widen the CI
        v = float(x[0])
        return v, v, v
    rng = np.random.default_rng(seed)
    n = x.size
    stats = np.empty(n_boot)
    rows = max(1, _CHUNK_ELEMS // n)
    for start in range(0, n_boot, rows):
        stop = min(n_boot, start + rows)
        idx = rng.integers(0, n, size=(stop - start, n))
        stats[start:stop] = x[idx].mean(axis=1)
    lo, hi = _percentiles(stats, alpha)
    return mean, lo, hi


def bootstrap_ci_grouped(
    df: pd.DataFrame,
    value: str,
    groups: Sequence[str] = ("seed", "prompt"),
    n_boot: int = 2000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Hierarchical percentile bootstrap of a mean: ``(mean, lo, hi)``.

    Rows are first averaged into cells (one per unique combination of ``groups``), so each
    (seed, prompt) cell weighs the same whatever its number of samples. With two levels, each
    replicate resamples the outer units (e.g. training seeds) with replacement and then, within
    every drawn outer unit independently, its inner units (e.g. prompts); the statistic is the
    mean of the drawn cells. With one level it is the plain bootstrap over cells. The point
    estimate is the mean of all cells.
    """
    groups = list(groups)
    if len(groups) not in (1, 2):
        raise ValueError(f"groups must name one or two levels, got {groups}")
    missing = [c for c in [value, *groups] if c not in df.columns]
    if missing:
        raise KeyError(f"columns missing from df: {missing}")
    if df.empty:
        raise ValueError("df is empty")
    _check_alpha(alpha, n_boot)
    cells = df.groupby(groups, sort=True, dropna=False)[value].mean()
    if not np.all(np.isfinite(cells.to_numpy(dtype=np.float64))):
        raise ValueError(f"{value!r} contains NaN or inf")
    if len(groups) == 1:
        return bootstrap_ci(cells.to_numpy(dtype=np.float64), n_boot=n_boot, alpha=alpha, seed=seed)

    outer = [g.to_numpy(dtype=np.float64) for _, g in cells.groupby(level=0, sort=True)]
    all_cells = np.concatenate(outer)
    mean = float(all_cells.mean())
    if np.ptp(all_cells) == 0:
        v = float(all_cells[0])
        return v, v, v
    rng = np.random.default_rng(seed)
    n_outer = len(outer)
    sizes = np.array([len(o) for o in outer])
    # one row per replicate: which outer unit fills each of the n_outer slots
    draws = rng.integers(0, n_outer, size=(n_boot, n_outer))
    sums = np.zeros(n_boot)
    for j in range(n_outer):
        for s in range(n_outer):
            reps = np.flatnonzero(draws[:, j] == s)
            if reps.size == 0:
                continue
            cells_s, m = outer[s], sizes[s]
            rows = max(1, _CHUNK_ELEMS // m)
            for start in range(0, reps.size, rows):
                r = reps[start : start + rows]
                idx = rng.integers(0, m, size=(r.size, m))
                sums[r] += cells_s[idx].sum(axis=1)
    stats = sums / sizes[draws].sum(axis=1)
    lo, hi = _percentiles(stats, alpha)
    return mean, lo, hi


def barrier_height(lams: Sequence[float], accs: Sequence[float]) -> float:
    """Loss barrier in accuracy units along an interpolation path.

    ``max`` over the interior points of (linear interpolation between the two endpoint
    accuracies - accuracy), clipped at 0: positive means accuracy dips below the straight
    line joining the endpoints. Points are sorted by lam; fewer than three points give 0.
    """
    x = np.asarray(lams, dtype=np.float64).ravel()
    y = np.asarray(accs, dtype=np.float64).ravel()
    if x.shape != y.shape:
        raise ValueError("lams and accs differ in length")
    if x.size < 3:
        return 0.0
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
    if x[-1] == x[0]:
        raise ValueError("lams must span an interval")
    line = y[0] + (x - x[0]) / (x[-1] - x[0]) * (y[-1] - y[0])
    return float(max(0.0, np.max(line[1:-1] - y[1:-1])))
