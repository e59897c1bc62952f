"""Stage: an ES run's logged distance from its start against the z-score theory (paper A).

E||theta_T - theta_0||^2 = alpha^2 * updates * d / N for z-scored fitness; reads only the run's
metrics.jsonl and summary.json, so it needs no model (and no torch import: one job per ES run).
Outputs ``theory/{task}/{run}.csv`` (columns THEORY_COLUMNS, one row per logged iteration) and a
``.json`` with the fit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd

from esgrpo.analysis.theory import expected_es_sq_norm, fit_sq_norm_vs_t
from esgrpo.files import atomic_write_text, read_json, read_jsonl, write_json

THEORY_COLUMNS = ["iteration", "updates", "distance", "sq_distance", "theory_sq"]


def _es_settings(summary: Mapping) -> dict:
    settings = ((summary.get("provenance") or {}).get("config") or {}).get("settings")
    return dict(settings or summary.get("settings") or {})


def theory_stage(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """Logged ES distance vs the z-score theory E||dtheta||^2 = alpha^2 * updates * d / N, and its fit."""
    metrics = [r for r in read_jsonl(input["metrics"]) if "distance_from_init" in r]
    summary = read_json(input["summary"])
    settings = _es_settings(summary)
    alpha, n_members = float(settings["alpha"]), int(settings["population_size"])
    d = summary.get("trainable_parameters") or params.get("trainable_parameters")
    if not d:
        raise ValueError(f"{input['summary']}: no trainable_parameters; cannot compute the theory")
    d = int(d)
    rows = []
    for r in metrics:
        dist = float(r["distance_from_init"])
        updates = int(r.get("updates", r["iteration"]))
        rows.append({"iteration": int(r["iteration"]), "updates": updates, "distance": dist,
                     "sq_distance": dist ** 2, "theory_sq": float(expected_es_sq_norm(alpha, n_members, d, updates))})
    df = pd.DataFrame(rows, columns=THEORY_COLUMNS)
    try:
        fit = fit_sq_norm_vs_t(df["updates"], df["sq_distance"], alpha=alpha, n_members=n_members, d=d)
    except ValueError as err:  # fewer than two distinct update counts (e.g. every update skipped)
        print(f"theory: no fit ({err})")
        fit = {"slope": math.nan, "intercept": math.nan, "r2": math.nan, "slope_ratio_to_theory": math.nan}
    last = rows[-1] if rows else {}
    record = {
        **fit, "theory_slope": float(expected_es_sq_norm(alpha, n_members, d, 1.0)),
        "alpha": alpha, "population_size": n_members, "d": d,
        "normalization": settings.get("normalization", "zscore"),
        "n_points": len(rows), "final_updates": last.get("updates"),
        "final_distance": last.get("distance"),
        "final_theory_distance": math.sqrt(last["theory_sq"]) if rows else None,
        "final_ratio": (last["distance"] / math.sqrt(last["theory_sq"])
                        if rows and last["theory_sq"] > 0 else math.nan),
        "model": wildcards["model"], "task": wildcards["task"], "run": wildcards["run"],
    }
    atomic_write_text(output["csv"], df.to_csv(index=False))
    write_json(output["json"], record)
    print(f"theory {wildcards['run']}: slope ratio to theory {record['slope_ratio_to_theory']:.4f}, "
         f"r2 {record['r2']:.4f}, final distance / theory {record['final_ratio']:.4f}")
