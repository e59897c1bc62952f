"""Statistics of every paper table: confidence intervals, pairing and budget matching.

- a cell is a mean with a 95% percentile-bootstrap CI. Test metrics resample training seeds
  and, within each, prompts (``bootstrap_ci_grouped(groups=("seed", "prompt"))``); the seed is
  the run name's (the base model is one unit). Training-curve values resample seeds and logged
  iterations; analysis values (norms, cosines, KL) resample runs. A single unit (one seed, one
  run) has no interval: its bounds are NaN (shown without brackets), and a claim resting on it
  is "inconclusive". What the interval covers: another training run of the same config on these
  test prompts (every seed is tested on the same prompts, so a prompt effect shared by the seeds is
  held fixed; tests/test_hierarchical_bootstrap.py measures ~0.97 coverage of that target with 8
  seeds, ~0.72 with 3, where a percentile bootstrap over 3 units is too narrow, and ~0.69 of the
  mean over new prompts of the task). With 3 seeds, read an interval as roughly [lowest, highest
  seed mean];
- a training-curve value (train reward, entropy) is never one logged step, which is one noisy
  batch (GRPO's reward of 16 prompts x 8 completions), but the mean over a window of each run's
  logged steps ending at the chosen step (the last, or the matched budget's), with the 95% CI
  resampling seeds then the window's iterations (``ci_curve``: with one seed, the spread over the
  window). The window holds ``window_size(T)`` of a run's T logged steps: the last 10% (``TAIL``),
  at least ``MIN_WINDOW``, at most half the run (so a first and a last window never overlap), fewer
  when the chosen step has fewer before it; the ``window`` column names its steps;
- a difference between two checkpoints is paired: per (seed, prompt) when both have the seed,
  per prompt against the base model.

Budgets (ES-vs-GRPO comparisons carry a ``budget`` column):

- ``iterations``: final checkpoints, i.e. the ES iterations and GRPO steps as configured;
- ``rollouts`` / ``generated_tokens``: a training-curve value (train reward, entropy) of each
  method in the window ending at the last logged step whose cumulative rollouts (generated tokens)
  are at most the smaller of the two methods' totals; ``matched_at`` says at how many, ``at_step``
  which step. Test metrics exist for final checkpoints only, so these rows report the curve from
  ``metrics.jsonl``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from esgrpo.estimators import bootstrap_ci, bootstrap_ci_grouped

N_BOOT = 2000
TAIL = 0.1  # a training-curve window: the first / last 10% of a run's logged steps ...
MIN_WINDOW = 3  # ... but at least this many (one GRPO step is one noisy batch)
BUDGETS = ("rollouts", "generated_tokens")
NAN3 = (math.nan, math.nan, math.nan)


def grouped_ci(df: pd.DataFrame, value: str, groups: tuple[str, str]) -> tuple[float, float, float]:
    """bootstrap_ci_grouped over `groups`; one unit only (a single cell) has no CI: (mean, NaN, NaN)."""
    d = df[[*groups, value]].dropna()
    if d.empty:
        return NAN3
    if len(d.drop_duplicates(list(groups))) < 2:
        return float(d[value].mean()), math.nan, math.nan
    return bootstrap_ci_grouped(d, value, groups=groups, n_boot=N_BOOT)


def ci_prompts(df: pd.DataFrame, value: str) -> tuple[float, float, float]:
    """Mean and 95% CI, resampling seeds then prompts within each seed."""
    return grouped_ci(df, value, ("seed", "prompt"))


def ci_values(values: Iterable[float]) -> tuple[float, float, float]:
    """Mean and 95% CI of independent units (runs, seeds); a single unit has no CI (NaN bounds)."""
    x = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if x.size == 0:
        return NAN3
    if x.size == 1:
        return float(x[0]), math.nan, math.nan
    return bootstrap_ci(x, n_boot=N_BOOT)


def ci_curve(df: pd.DataFrame, value: str) -> tuple[float, float, float]:
    """Mean and 95% CI of training-curve values, resampling seeds then logged iterations."""
    return grouped_ci(df, value, ("seed", "iteration"))


def paired(a: pd.DataFrame, b: pd.DataFrame, value: str, unit: str = "prompt") -> pd.DataFrame:
    """Rows of ``a - b`` on `value`, matched on (seed, unit) when b has a's seeds, else on unit
    alone with b averaged over its seeds (e.g. against the base model). Column ``diff``."""
    if a.empty or b.empty:
        return pd.DataFrame(columns=["seed", unit, "diff"])
    a = a.groupby(["seed", unit], as_index=False)[value].mean()
    b = b.groupby(["seed", unit], as_index=False)[value].mean()
    if set(a["seed"]) & set(b["seed"]) and not (b["seed"] < 0).all():
        matched = a.merge(b, on=["seed", unit], suffixes=("_a", "_b"))
    else:
        matched = a.merge(b.groupby(unit, as_index=False)[value].mean(), on=unit, suffixes=("_a", "_b"))
    return matched.assign(diff=matched[f"{value}_a"] - matched[f"{value}_b"])[["seed", unit, "diff"]]


def paired_ci(a: pd.DataFrame, b: pd.DataFrame, value: str, unit: str = "prompt") -> tuple[float, float, float]:
    """Mean and 95% CI of the paired difference ``a - b`` (:func:`paired`), resampling seeds then units."""
    return grouped_ci(paired(a, b, value, unit), "diff", ("seed", unit))


def ratio_ci(a: pd.DataFrame, b: pd.DataFrame, value: str) -> tuple[float, float, float]:
    """a / b of `value` (ES / GRPO): per shared seed when possible (CI over seeds), else of the means."""
    shared = sorted(set(a["seed"]) & set(b["seed"]))
    if shared:
        per_seed_a = a.groupby("seed")[value].mean()
        per_seed_b = b.groupby("seed")[value].mean()
        return ci_values([per_seed_a[s] / per_seed_b[s] for s in shared if per_seed_b[s] > 0])
    if a.empty or b.empty or b[value].mean() <= 0:
        return NAN3
    return a[value].mean() / b[value].mean(), math.nan, math.nan


def norm_ratio_over_tensors(a_sq: Sequence[float], b_sq: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """sqrt(sum a_sq) / sqrt(sum b_sq) of two updates' per-tensor squared L2 (the same tensors, paired),
    with a 95% bootstrap CI resampling tensors: the within-run interval of a one-seed norm ratio."""
    a, b = np.asarray(a_sq, float), np.asarray(b_sq, float)
    if a.size == 0 or b.sum() <= 0:
        return NAN3
    ratio = float(np.sqrt(a.sum() / b.sum()))
    if a.size < 2:
        return ratio, math.nan, math.nan
    idx = np.random.default_rng(seed).integers(0, a.size, size=(N_BOOT, a.size))
    den = b[idx].sum(axis=1)
    ok = den > 0
    lo, hi = np.quantile(np.sqrt(a[idx].sum(axis=1)[ok] / den[ok]), [0.025, 0.975])
    return ratio, float(lo), float(hi)


def stat(keys: dict, triple: tuple[float, float, float], **extra) -> dict:
    """A table row: `keys`, `extra` columns, then value / value_lo / value_hi."""
    mean, lo, hi = triple
    return {**keys, **extra, "value": mean, "value_lo": lo, "value_hi": hi}


def saturated(value: float, lo: float, hi: float, tol: float = 1e-9) -> bool:
    """A Pass@k cell at its ceiling with no spread, 1.000 [1.000, 1.000] (every test prompt solved in
    every seed): it cannot tell two methods apart, so tables mark it and comparison counts leave out a
    comparison of two such cells."""
    return all(v is not None and not pd.isna(v) and v >= 1 - tol for v in (value, lo, hi))


def passk_display_ks(ks: Sequence[int]) -> list[int]:
    """Pass@1 and the two largest ks (16 and 32 when n = 32, as in paper B)."""
    big = sorted(k for k in ks if k > 1)[-2:]
    return [1, *big]


def common_ks(setup: dict) -> list[int]:
    """ks every model has (the smallest set, so pooled claims compare like with like)."""
    sets = [set(v) for v in setup["ks"].values()] or [{1}]
    return sorted(set.intersection(*sets))


def window_size(logged: int, frac: float = TAIL) -> int:
    """Logged steps in a window of a T-step curve: ceil(frac * T), at least MIN_WINDOW, at most T // 2
    (a first and a last window never overlap), at least 1."""
    return max(1, min(max(MIN_WINDOW, math.ceil(frac * logged)), logged // 2))


def curve_window(run: pd.DataFrame, end: float | None = None) -> pd.DataFrame:
    """One run's window ending at logged step `end` (default its last): the ``window_size(T)`` logged
    steps up to and including it, T the run's logged steps (fewer if `end` has fewer before it)."""
    run = run.sort_values("iteration")
    upto = run if end is None else run[run["iteration"] <= end]
    return upto.tail(window_size(len(run)))


def tail(df: pd.DataFrame, first: bool = False) -> pd.DataFrame:
    """The last (first) window of every run's curve (:func:`window_size` logged steps)."""
    out = []
    for _, g in df.groupby("run", sort=False):
        out.append(g.sort_values("iteration").head(window_size(len(g))) if first else curve_window(g))
    return pd.concat(out) if out else df.iloc[0:0]


def window_label(windows: pd.DataFrame) -> str:
    """The steps a window spans, e.g. "steps 37-40" (per distinct span when runs differ)."""
    spans = sorted({(int(g["iteration"].min()), int(g["iteration"].max())) for _, g in windows.groupby("run")})
    return "; ".join(f"steps {a}-{b}" if a != b else f"step {a}" for a, b in spans)


def main_variants(frame: pd.DataFrame) -> list[str]:
    """The variants of the main ES and GRPO runs (kinds ``es`` and ``grpo``) in `frame`."""
    if frame.empty:
        return []
    return sorted(set(frame.loc[frame["kind"].isin(["es", "grpo"]), "variant"]))


def matched_rows(metrics: pd.DataFrame, variants: Sequence[str], column: str = "rollouts") -> pd.DataFrame:
    """Rows of a budget-matched comparison of `variants` (run names without seed).

    Per (model, task) where at least two of the variants ran: the budget is the smallest final
    cumulative `column` over their runs; each run contributes its last logged step with `column`
    at most that budget (a run whose first step already exceeds it contributes nothing). Adds
    ``matched_at`` (the budget).
    """
    cols = list(metrics.columns) + ["matched_at"]
    if metrics.empty or column not in metrics:
        return pd.DataFrame(columns=cols)
    out = []
    sub = metrics[metrics["variant"].isin(variants)].dropna(subset=[column])
    for _, g in sub.groupby(["model", "task"], sort=True):
        if g["variant"].nunique() < 2:
            continue
        budget = g.groupby("run")[column].max().min()
        for _, run in g.groupby("run", sort=True):
            within = run[run[column] <= budget]
            if not within.empty:
                out.append(within.loc[[within["iteration"].idxmax()]].assign(matched_at=budget))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=cols)


def _steps(iterations: Iterable[float]) -> str:
    return "/".join(str(int(i)) for i in sorted(set(iterations)))


def _final_step_rows(curves: pd.DataFrame, value: str, metric: str, keys: Sequence[str]) -> list[dict]:
    rows = []
    for key, g in curves.groupby([*keys, "variant"], sort=True):
        windows = tail(g)
        rows.append(stat(dict(zip([*keys, "variant"], key, strict=True)), ci_curve(windows, value),
                         method=g["method"].iloc[0], budget="iterations", matched_at="final step",
                         at_step=_steps(g.groupby("run")["iteration"].max()), window=window_label(windows),
                         metric=metric, n_seeds=g["seed"].nunique()))
    return rows


def _matched_budget_rows(curves: pd.DataFrame, variants: Sequence[str], value: str, metric: str,
                         keys: Sequence[str], column: str) -> list[dict]:
    rows = []
    chosen_all = matched_rows(curves, variants, column)
    for key, g in curves.dropna(subset=[column]).groupby(list(keys), sort=True):
        if g["variant"].nunique() < 2:
            continue
        budget = g.groupby("run")[column].max().min()
        for variant, gv in g.groupby("variant", sort=True):
            chosen = chosen_all[(chosen_all["variant"] == variant)
                                & np.logical_and.reduce([chosen_all[k] == v for k, v in zip(keys, key, strict=True)])]
            base = {**dict(zip(keys, key, strict=True)), "variant": variant}
            common = {"method": gv["method"].iloc[0], "budget": column, "matched_at": f"{column} <= {int(budget)}",
                      "metric": metric, "n_seeds": gv["seed"].nunique()}
            if chosen.empty:
                rows.append(stat(base, NAN3, **common, at_step=f"none: first step uses {int(gv[column].min())}",
                                 window=None))
                continue
            windows = pd.concat([curve_window(gv[gv["run"] == run], end)
                                 for run, end in zip(chosen["run"], chosen["iteration"], strict=True)])
            rows.append(stat(base, ci_curve(windows, value), **common, at_step=_steps(chosen["iteration"]),
                             window=window_label(windows)))
    return rows


def budget_rows(metrics: pd.DataFrame, variants: Sequence[str], value: str, label: str,
                keys: Sequence[str] = ("model", "task")) -> list[dict]:
    """Training-curve `value` of each variant: its window mean (module docstring) ending at its final
    step (budget "iterations") and at matched rollouts and generated tokens (see :func:`matched_rows`).
    ``at_step`` says which logged step each window ends at, ``window`` the steps it spans; a variant
    whose first step already exceeds the matched budget gets a NaN value and says so."""
    curves = metrics[metrics["variant"].isin(variants)].dropna(subset=[value])
    metric = f"{label} (train curve)"
    rows = _final_step_rows(curves, value, metric, keys)
    for column in BUDGETS:
        rows += _matched_budget_rows(curves, variants, value, metric, keys, column)
    return rows


def smallest_sufficient(rewards: dict[int, float], tol: float = 0.01) -> int | None:
    """Smallest N whose final reward is at least (largest N's reward - tol)."""
    if not rewards:
        return None
    target = rewards[max(rewards)] - tol
    return min(n for n, r in rewards.items() if r >= target - 1e-12)


def pearson_ci(x: Sequence[float], y: Sequence[float], seed: int = 0) -> tuple[float, float, float]:
    """Pearson r with a 95% bootstrap CI over units; NaN with fewer than 3 units or no spread."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return NAN3
    r = float(np.corrcoef(x, y)[0, 1])
    idx = np.random.default_rng(seed).integers(0, x.size, size=(N_BOOT, x.size))
    xs, ys = x[idx], y[idx]
    xs = xs - xs.mean(axis=1, keepdims=True)
    ys = ys - ys.mean(axis=1, keepdims=True)
    den = np.sqrt((xs**2).sum(axis=1) * (ys**2).sum(axis=1))
    ok = den > 0
    if not ok.any():
        return r, math.nan, math.nan
    lo, hi = np.quantile((xs * ys).sum(axis=1)[ok] / den[ok], [0.025, 0.975])
    return r, float(lo), float(hi)
