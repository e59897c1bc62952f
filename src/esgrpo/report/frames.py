"""Per-run frames several tables, figures and claims share: continual stages, update norms,
sparsity gains, ablation settings, population rewards, entropy changes, norm-theory ratios,
JS diversity against Pass@K gain and interpolation barriers."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence

import numpy as np
import pandas as pd

from esgrpo.analysis.theory import fit_sq_norm_vs_t
from esgrpo.estimators import barrier_height
from esgrpo.report.loading import StageInputs, run_labels, variant_of, with_labels
from esgrpo.report.planning import ZSCORE_ONE_SIDED, judged_tasks
from esgrpo.report.registry import ES_KINDS
from esgrpo.report.stats import ci_curve, common_ks, stat, tail, window_label
from esgrpo.runs import parse_run_name

CONTINUAL_KINDS = ("cl_es", "cl_grpo")
ACCURACY_METRICS = ("greedy", "mean@n")


def stage_frame(data: StageInputs) -> pd.DataFrame:
    """Continual prompts with stage (0 = base) per method; base rows duplicated for each method."""
    prompts = data.prompts
    if prompts.empty:
        return prompts
    continual = prompts[prompts["kind"].isin(CONTINUAL_KINDS)].copy()
    continual["stage"] = continual["run"].map(lambda r: run_labels(r)["stage"]).astype(int)
    frames = [continual]
    base = prompts[prompts["kind"].eq("base")]
    for method in continual["method"].unique():
        frames.append(base.assign(method=method, stage=0))
    out = pd.concat(frames, ignore_index=True)
    order = data.setup["continual"]
    out["stage_task"] = out["stage"].map(lambda s: "base" if s == 0 else order[s - 1])
    return out


def has_continual_stages(stages: pd.DataFrame) -> bool:
    return not stages.empty and stages["kind"].isin(CONTINUAL_KINDS).any()


def drift_norms(drift: pd.DataFrame, by: Sequence[str] = ()) -> pd.DataFrame:
    """Per run (and `by` groups): l2 = sqrt(sum l2^2), base_l2 likewise, relative = l2 / base_l2,
    and share_sq = the group's share of the run's squared update."""
    keys = ["model", "task", "run", "run_kind", "method", "variant", "seed", *by]
    d = drift.assign(_sq=drift["l2"] ** 2, _bsq=drift["base_l2"] ** 2)
    g = d.groupby(keys, sort=True, dropna=False).agg(_sq=("_sq", "sum"), _bsq=("_bsq", "sum")).reset_index()
    g["l2"] = g["_sq"] ** 0.5
    g["base_l2"] = g["_bsq"] ** 0.5
    g["relative_l2"] = g["l2"] / g["base_l2"].where(g["base_l2"] > 0)
    totals = d.groupby(keys[:7])["_sq"].sum().rename("_tot")
    g = g.join(totals, on=keys[:7])
    g["share_sq"] = g["_sq"] / g["_tot"].where(g["_tot"] > 0)
    return g.drop(columns=["_sq", "_bsq", "_tot"])


def es_against_grpo(norms: pd.DataFrame) -> Iterator[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """(method, its rows, GRPO's rows) for each ES method of `norms` that has GRPO rows beside it: the main
    ES runs (method ES, continual stages included), then each paper's arithmetic (run kind es_arith)."""
    grpo = norms[norms["method"] == "GRPO"]
    if grpo.empty:
        return
    es = norms[(norms["method"] == "ES") | (norms["run_kind"] == "es_arith")]
    for method, rows in es.groupby("method", sort=True):
        yield method, rows, grpo


def _with_gain_columns(rows: pd.DataFrame, base: pd.DataFrame, model: str, eval_task: str) -> pd.DataFrame:
    """One run's sparsity rows on one evaluation task with base_/full_/retained_/lost_<metric>."""
    rows = rows.copy()
    top = rows[rows["kind"] == "top_fraction"]
    for metric in (m for m in ACCURACY_METRICS if m in rows):
        zero = top.loc[np.isclose(top["keep_fraction"], 0.0), metric]
        full = top.loc[np.isclose(top["keep_fraction"], 1.0), metric]
        base_rows = base[(base["model"] == model) & (base["eval_task"] == eval_task)] if not base.empty else base
        b = float(zero.iloc[0]) if len(zero) else (float(base_rows[metric].mean()) if len(base_rows) else math.nan)
        f = float(full.iloc[0]) if len(full) else math.nan
        gain = f - b if f - b > 0 else math.nan
        rows[f"base_{metric}"], rows[f"full_{metric}"] = b, f
        rows[f"retained_{metric}"] = (rows[metric] - b) / gain
        rows[f"lost_{metric}"] = (f - rows[metric]) / gain
    return rows


def sparsity_frame(data: StageInputs) -> pd.DataFrame:
    """Sparsity rows with, per run and metric, the base (``base_<m>``: keep fraction 0, else the base
    evaluation) and full-update (``full_<m>``: keep fraction 1) accuracies and ``retained_<m>`` =
    (acc - base) / (full - base) (NaN where the run gained nothing) / ``lost_<m>`` for resets."""
    sparsity = data.analysis("sparsity")
    if sparsity.empty:
        return sparsity
    base = data.base_prompts()
    if "eval_task" not in sparsity:  # files from before evaluation tasks were recorded: the training task
        sparsity = sparsity.assign(eval_task=sparsity["task"])
    parts = [_with_gain_columns(rows, base, model, eval_task) for (model, _task, _run, eval_task), rows
             in sparsity.groupby(["model", "task", "run", "eval_task"], sort=True)]
    return pd.concat(parts, ignore_index=True)


def ablation_frames(data: StageInputs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Prompts (on the ablation task) and training curves of the ablation task, with run labels."""
    task = data.setup["ablation_task"]
    prompts, metrics = data.prompts, data.metrics
    if not prompts.empty:
        prompts = with_labels(prompts[(prompts["train_task"] == task) & (prompts["eval_task"] == task)])
    if not metrics.empty:
        metrics = with_labels(metrics[metrics["task"] == task])
    return prompts, metrics


def ablation_sets(prompts: pd.DataFrame, n: int) -> dict[str, pd.DataFrame]:
    """setting -> prompts at the main population: zscore (= one-sided), rank, none, antithetic, and one
    ``low-rank r=<r>`` per noise rank of es.ablations.ranks (kind es_rank); zscore is the main runs' noise."""
    out = {}
    if prompts.empty:
        return out
    main = prompts[prompts["population"] == n]
    other_noise = main["kind"] == "es_rank"
    out["zscore"] = main[(main["normalization"] == "zscore") & ~main["antithetic"].astype(bool) & ~other_noise]
    out["rank"] = main[main["normalization"] == "rank"]
    out["none"] = main[main["normalization"] == "none"]
    out["one-sided"] = out["zscore"]
    out["antithetic"] = main[(main["normalization"] == "zscore") & main["antithetic"].astype(bool)]
    for r, g in main[other_noise].groupby("noise_rank", sort=True):
        out[lowrank_label(r)] = g
    return {k: v for k, v in out.items() if not v.empty}


def lowrank_label(rank: float | None) -> str:
    """The setting name of a noise rank (``low-rank r=4``; NaN / None: ``full-rank``)."""
    return "full-rank" if rank is None or pd.isna(rank) else f"low-rank r={int(rank)}"


def lowrank_contrasts(sets: dict[str, pd.DataFrame], main_rank: int | None) -> list[tuple[str, str, str]]:
    """(contrast name, setting a, setting b) of every low-rank setting against the main runs' noise at the
    same N, alpha and sigma (issue 20): ``low-rank r=1 - full-rank`` with full-rank main runs."""
    reference = lowrank_label(main_rank)
    return [(f"{label} - {reference}", label, "zscore") for label in sets
            if label.startswith("low-rank r=") and label != reference]


def population_rewards(metrics: pd.DataFrame) -> pd.DataFrame:
    """Final train reward (mean over the last window of iterations, report.stats) per (model, population) with CIs."""
    rows = []
    sweep = metrics[metrics["kind"].isin(["es", "es_pop"])]
    if sweep.empty:
        return pd.DataFrame(columns=["model", "task", "population", "value", "value_lo", "value_hi"])
    sweep = sweep.assign(population=sweep["run"].map(lambda r: run_labels(r)["population"]))
    for (model, task, n), g in sweep.groupby(["model", "task", "population"], sort=True):
        rows.append(stat({"model": model, "task": task, "population": int(n)}, ci_curve(tail(g), "fitness_mean"),
                         window=window_label(tail(g)), iterations=int(g.groupby("run")["iteration"].max().mean()),
                         rollouts=float(g.groupby("run")["rollouts"].max().mean()), n_seeds=g["seed"].nunique()))
    return pd.DataFrame(rows)


def entropy_change(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per run: entropy over the first and the last 10% of training and last / first - 1."""
    rows = []
    curves = metrics.dropna(subset=["entropy"])
    for (model, task, run), g in curves.groupby(["model", "task", "run"], sort=True):
        first, last = tail(g, first=True)["entropy"].mean(), tail(g)["entropy"].mean()
        rows.append({"model": model, "task": task, "run": run, "seed": g["seed"].iloc[0],
                     "method": g["method"].iloc[0], "variant": g["variant"].iloc[0], "first": first, "last": last,
                     "relative_change": last / first - 1 if first > 0 else math.nan})
    return pd.DataFrame(rows)


def entropy_labels(curves: pd.DataFrame) -> pd.Series:
    """Each row's method, with what its entropy is when not the exact one (the vLLM ES backend logs an
    estimate or a bound: `esgrpo.engines.vllm_engine.entropy_estimator`), so no line passes one off as the other."""
    kinds = curves["entropy_estimator"] if "entropy_estimator" in curves else pd.Series("exact", index=curves.index)
    return pd.Series([m if pd.isna(k) or k == "exact" else f"{m} ({str(k).replace('_', ' ')})"
                      for m, k in zip(curves["method"], kinds, strict=True)], index=curves.index)


def theory_ratios(theory: pd.DataFrame) -> pd.DataFrame:
    """Per ES run: slope of sq_distance vs updates divided by the slope of theory_sq vs updates (both
    least-squares lines of :func:`esgrpo.analysis.theory.fit_sq_norm_vs_t`), and ``applies`` = the run
    is z-scored and one-sided (rank / raw / antithetic runs break sum z^2 = N)."""
    rows = []
    for (model, task, run), g in theory.groupby(["model", "task", "run"]):
        g = g.dropna(subset=["sq_distance", "theory_sq"])
        x = g["updates"].to_numpy(float) if "updates" in g else g["iteration"].to_numpy(float)
        if len(g) < 2 or np.ptp(x) == 0:
            continue
        slope = fit_sq_norm_vs_t(x, g["sq_distance"].to_numpy(float))["slope"]
        theory_slope = fit_sq_norm_vs_t(x, g["theory_sq"].to_numpy(float))["slope"]
        if theory_slope > 0:
            rows.append({"model": model, "task": task, "run": run, "ratio": slope / theory_slope,
                         "applies": g["run_kind"].iloc[0] in ZSCORE_ONE_SIDED})
    return pd.DataFrame(rows, columns=["model", "task", "run", "ratio", "applies"])


def theory_norms(theory: pd.DataFrame) -> pd.DataFrame:
    """Per ES run: the theory's alpha*sqrt(updates d/N) from the base at its final logged update. A
    continual stage k started from stage k-1, so its theory norm from the base is the sqrt of the sum
    over stages 1..k of each stage's theory_sq (independent steps: the expected squares add)."""
    cols = ["model", "task", "run", "run_kind", "seed", "stage", "theory_l2"]
    if theory.empty:
        return pd.DataFrame(columns=cols)
    final = theory.sort_values("updates").groupby(["model", "task", "run"], sort=True).tail(1).copy()
    final["stage"] = final["run"].map(lambda r: run_labels(r)["stage"])
    final["theory_l2"] = final["theory_sq"] ** 0.5
    continual = final["run_kind"].isin(CONTINUAL_KINDS)
    for _, g in final[continual].groupby(["model", "seed"]):
        cumulative = g.sort_values("stage")["theory_sq"].cumsum() ** 0.5
        final.loc[cumulative.index, "theory_l2"] = cumulative
    return final[cols].reset_index(drop=True)


def js_gain_frame(data: StageInputs) -> pd.DataFrame:
    """Per ES run: mean population JS diversity over training and its Pass@K gain over the base;
    ``saturated``: the run and the base both solve every prompt at Pass@K (gain 0 by construction)."""
    metrics, prompts = data.metrics, data.prompts
    cols = ["model", "task", "run", "variant", "js_diversity", "gain", "k", "saturated"]
    if metrics.empty or prompts.empty or "js_diversity" not in metrics:
        return pd.DataFrame(columns=cols)
    k = max(common_ks(data.setup))
    rows = []
    es = metrics[metrics["kind"].isin(ES_KINDS)].dropna(subset=["js_diversity"])
    base = prompts[prompts["kind"] == "base"]
    for (model, task, run), g in es.groupby(["model", "task", "run"]):
        trained = prompts[(prompts["run"] == run) & (prompts["model"] == model) & (prompts["train_task"] == task)
                          & prompts["on_task"]]
        b = base[(base["model"] == model) & base["eval_task"].isin(judged_tasks(data.setup, model, task))]
        if trained.empty or b.empty:
            continue
        ours, theirs = trained[f"pass@{k}"].mean(), b[f"pass@{k}"].mean()
        rows.append({"model": model, "task": task, "run": run, "variant": variant_of(run),
                     "js_diversity": g["js_diversity"].mean(), "gain": ours - theirs, "k": k,
                     "saturated": bool(ours >= 1 - 1e-9 and theirs >= 1 - 1e-9)})
    return pd.DataFrame(rows, columns=cols)


def exact_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    """The rows of a pair analysis (cosine, interpolation) whose ES end is a main ES run, not the run of a
    paper's arithmetic (column ``arithmetic``: esgrpo.report.loading.load_analysis)."""
    if pairs.empty or "arithmetic" not in pairs:
        return pairs
    return pairs[pairs["arithmetic"] == "exact"]


def barrier_heights(interp: pd.DataFrame) -> pd.DataFrame:
    """Barrier heights along the ES-GRPO path (esgrpo.estimators.barrier_height) per (model, task, seed,
    arithmetic of the ES end, eval_task) and metric (greedy accuracy, mean@n), with ``on_task`` = evaluated on
    the training task."""
    cols = ["model", "task", "seed", "arithmetic", "on_task", "metric", "barrier"]
    if interp.empty or "path" not in interp:
        return pd.DataFrame(columns=cols)
    if "arithmetic" not in interp:
        interp = interp.assign(arithmetic="exact")
    rows = []
    path = interp[interp["path"] == "es-grpo"]
    for (model, task, seed, arithmetic, eval_task), g in path.groupby(["model", "task", "seed", "arithmetic",
                                                                        "eval_task"]):
        for metric in ACCURACY_METRICS:
            if metric in g and g[metric].notna().all():
                rows.append({"model": model, "task": task, "seed": seed, "arithmetic": arithmetic,
                             "on_task": eval_task == task, "metric": metric,
                             "barrier": barrier_height(g["lam"], g[metric])})
    return pd.DataFrame(rows, columns=cols)


def population_of_variant(metrics: pd.DataFrame) -> dict[str, int]:
    """variant -> ES population of the runs in `metrics` (from their names)."""
    return {variant: parse_run_name(run).population for variant, run in zip(metrics["variant"], metrics["run"],
                                                                             strict=True)}


def kl_sequence_label(kl: pd.DataFrame) -> pd.Series:
    """Which training a KL row measures: "single task", or "continual stage k" (paper A's sequence)."""
    return pd.Series([f"continual stage {parse_run_name(run).stage}" if kind in CONTINUAL_KINDS else "single task"
                      for run, kind in zip(kl["run"], kl["run_kind"], strict=True)], index=kl.index, dtype=str)
