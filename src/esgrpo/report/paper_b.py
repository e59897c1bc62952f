"""Paper B's tables: Pass@k (with budgets), the easy-setting count, sequential ES->GRPO / GRPO->ES,
drift, functional sparsity, ES ablations, the population sweep and entropy. Each ``build_*``
returns the tidy table (statistics: report.stats); each ``table_*`` writes it with its caption."""

from __future__ import annotations

import numpy as np
import pandas as pd

from esgrpo.report.frames import (
    ACCURACY_METRICS,
    ablation_frames,
    ablation_sets,
    drift_norms,
    entropy_change,
    entropy_labels,
    es_against_grpo,
    lowrank_contrasts,
    population_of_variant,
    population_rewards,
    sparsity_frame,
)
from esgrpo.report.loading import StageInputs
from esgrpo.report.paper_values import (
    BENCHMARK_AVERAGE,
    PaperValue,
    paper_notes,
    paper_value,
    with_paper_rows,
)
from esgrpo.report.planning import METHOD_ORDER, RATIO_ORDER
from esgrpo.report.registry import table_caption
from esgrpo.report.stats import (
    budget_rows,
    ci_curve,
    ci_prompts,
    ci_values,
    main_variants,
    paired_ci,
    passk_display_ks,
    ratio_ci,
    saturated,
    smallest_sufficient,
    stat,
    tail,
)
from esgrpo.report.writing import (
    absent_notes,
    display_frame,
    not_run_table,
    order_rows,
    wide,
    write_long_table,
    write_table,
)

SINGLE_AND_SEQUENTIAL = {"base", "es", "grpo", "es->grpo", "grpo->es"}
SEQUENTIAL_CONTRASTS = (("ES->GRPO", "ES"), ("ES->GRPO", "GRPO"), ("GRPO->ES", "GRPO"), ("GRPO->ES", "ES"),
                        ("ES->GRPO", "base"), ("GRPO->ES", "base"))
# contrast name, setting a, setting b (ablation_sets)
ABLATION_CONTRASTS = (("zscore - none", "zscore", "none"), ("zscore - rank", "zscore", "rank"),
                      ("antithetic - one-sided", "antithetic", "one-sided"))


def benchmark_suites(setup: dict) -> dict[str, list[str]]:
    """model -> the evaluation tasks whose mean paper B reports (its hard setting: a model trained on one
    task and judged on several benchmarks, esgrpo.config.judged_on)."""
    return {model: tasks for model, judged in setup.get("judged_on", {}).items()
            for tasks in judged.values() if len(tasks) > 1}


def _benchmark_average_rows(test: pd.DataFrame, setup: dict) -> list[dict]:
    """Pass@k averaged over a model's benchmarks, each weighing the same (paper B's hard-setting number):
    per seed the mean over benchmarks of their mean over prompts; 95% CI over seeds (one seed: none)."""
    rows = []
    for model, tasks in sorted(benchmark_suites(setup).items()):
        mine = test[(test["model"] == model) & test["task"].isin(tasks)]
        for method, g in mine.groupby("method", sort=True):
            if set(g["task"]) != set(tasks):  # a benchmark without rows: no average
                continue
            for k in passk_display_ks(setup["ks"][model]):
                per_seed = g.groupby(["seed", "task"])[f"pass@{k}"].mean().groupby("seed").mean()
                rows.append(stat({"model": model, "task": BENCHMARK_AVERAGE, "variant": g["variant"].iloc[0]},
                                 ci_values(per_seed), method=method, budget="iterations",
                                 matched_at="final checkpoint", metric=f"pass@{k}", n_seeds=g["seed"].nunique(),
                                 n_prompts=g["prompt"].nunique()))
    return rows


def build_b_passk(data: StageInputs) -> pd.DataFrame:
    rows = []
    test = data.on_task(SINGLE_AND_SEQUENTIAL)
    for (model, task, method), g in test.groupby(["model", "task", "method"], sort=True):
        for k in passk_display_ks(data.setup["ks"][model]):
            rows.append(stat({"model": model, "task": task, "variant": g["variant"].iloc[0]},
                             ci_prompts(g, f"pass@{k}"), method=method, budget="iterations",
                             matched_at="final checkpoint", metric=f"pass@{k}", n_seeds=g["seed"].nunique(),
                             n_prompts=g["prompt"].nunique()))
    rows += _benchmark_average_rows(test, data.setup)
    rows += budget_rows(data.metrics, main_variants(data.metrics), "fitness_mean", "train reward")
    long = order_rows(pd.DataFrame(rows), ["model", "task", "budget", "metric", "method"])
    return with_paper_rows(long, "metric", lambda row: _reported_passk(data.setup, row))


def _reported_passk(setup: dict, row: pd.Series) -> PaperValue | None:
    """Paper B's Pass@k of a final checkpoint's cell (GSM8K reference of its code; hard-maths averages)."""
    if row["budget"] != "iterations":
        return None
    return paper_value(setup, "b_passk", row["model"], row["task"], row["method"], row["metric"])


def mark_saturated(long: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """`long` with a ``saturated`` column (our Pass@k cells at 1.000 [1.000, 1.000], `stats.saturated`;
    not the paper's rows nor the train reward) and the note that counts them."""
    if long.empty:
        return long, []
    ours = long["metric"].astype(str).str.fullmatch(r"pass@\d+")
    flags = [bool(o) and saturated(v, lo, hi) for o, v, lo, hi in
             zip(ours, long["value"], long["value_lo"], long["value_hi"], strict=True)]
    long = long.assign(saturated=flags)
    n = int(sum(flags))
    if not n:
        return long, []
    return long, [f"Saturated: {n} of {int(ours.sum())} Pass@k cells are 1.000 [1.000, 1.000] (every test prompt "
                  "solved in every seed), marked (saturated): they cannot tell the methods apart; b_easy_setting "
                  "leaves a comparison of two saturated cells out of its counts."]


def table_b_passk(data: StageInputs, output: dict) -> None:
    caption = table_caption("b_passk")
    long, saturation = mark_saturated(build_b_passk(data))
    notes = absent_notes(data.setup, sequential=True) + paper_notes(data.setup, "b_passk", long, "metric") + saturation
    write_long_table(output, caption, long, "no evaluations in this config",
                     ["model", "task", "budget", "matched_at", "metric"], order=METHOD_ORDER, notes=notes)


def easy_setting_cells(data: StageInputs) -> pd.DataFrame:
    """Per (model, task, method in ES/GRPO, k in the two largest ks): method - base Pass@k, paired
    per prompt; ``below`` = point estimate < 0, ``significant`` = CI upper bound < 0; ``saturated`` =
    base and method both at 1.000 [1.000, 1.000] (`stats.saturated`), a comparison that cannot come out
    below (its below / significant are left empty)."""
    rows = []
    test = data.on_task({"base", "es", "grpo"})
    for (model, task), g in test.groupby(["model", "task"], sort=True):
        base = g[g["method"] == "base"]
        ks = sorted(k for k in data.setup["ks"][model] if k > 1)[-2:]
        for method in ("ES", "GRPO"):
            run = g[g["method"] == method]
            if run.empty or base.empty:
                continue
            for k in ks:
                col = f"pass@{k}"
                diff, lo, hi = paired_ci(run, base, col)
                base_ci, trained_ci = ci_prompts(base, col), ci_prompts(run, col)
                both = saturated(*base_ci) and saturated(*trained_ci)
                rows.append({"model": model, "task": task, "method": method, "k": k,
                             "base": base_ci[0], "trained": trained_ci[0],
                             "value": diff, "value_lo": lo, "value_hi": hi, "saturated": both,
                             "below": None if both else bool(diff < 0), "significant": None if both else bool(hi < 0)})
    return pd.DataFrame(rows)


def easy_setting_counts(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (method, k): the compared cells (saturated ones left out, counted in n_saturated), those below
    the base (point estimate) and those significantly below."""
    columns = ["method", "k", "n_cells", "n_saturated", "n_below", "n_significant", "cells_below"]
    if cells.empty:
        return pd.DataFrame(columns=columns)
    out = []
    for (method, k), g in cells.groupby(["method", "k"], sort=True):
        compared = g[~g["saturated"].astype(bool)]
        below = compared["below"].astype(bool)
        out.append({"method": method, "k": int(k), "n_cells": len(compared), "n_saturated": len(g) - len(compared),
                    "n_below": int(below.sum()), "n_significant": int(compared["significant"].astype(bool).sum()),
                    "cells_below": ", ".join(f"{m}/{t}" for m, t in zip(compared.loc[below, "model"],
                                                                         compared.loc[below, "task"], strict=True))})
    return pd.DataFrame(out, columns=columns)


def table_b_easy_setting(data: StageInputs, output: dict) -> None:
    cells = easy_setting_cells(data)
    caption = table_caption("b_easy_setting")
    if cells.empty:
        return not_run_table(output, caption, "no trained runs to compare with the base model")
    counts = easy_setting_counts(cells)
    long = pd.concat([counts.assign(scope="total"), cells.assign(scope="cell")], ignore_index=True)
    long = long[["scope", "method", "k", "n_cells", "n_saturated", "n_below", "n_significant", "cells_below", "model",
                 "task", "base", "trained", "value", "value_lo", "value_hi", "saturated", "below", "significant"]]
    long = long.rename(columns={"value": "diff", "value_lo": "diff_lo", "value_hi": "diff_hi"})
    long = long.astype({"k": int, "n_cells": "Int64", "n_saturated": "Int64", "n_below": "Int64",
                        "n_significant": "Int64", "saturated": "boolean", "below": "boolean",
                        "significant": "boolean"})
    n_saturated = int(cells["saturated"].sum())
    notes = [f"Saturated: {n_saturated} of {len(cells)} comparisons have base and trained both at 1.000 [1.000, "
             "1.000]; they are left out of n_cells, n_below and n_significant."] if n_saturated else []
    write_table(long, output, caption, notes=absent_notes(data.setup) + notes)


def build_b_sequential(data: StageInputs) -> pd.DataFrame:
    setup = data.setup
    task = setup["sequential_task"]
    if task is None:
        return pd.DataFrame()
    test = data.on_task(SINGLE_AND_SEQUENTIAL)
    test = test[test["task"] == task]
    if not test["kind"].isin(["es->grpo", "grpo->es"]).any():
        return pd.DataFrame()
    rows = []
    for model, gm in test.groupby("model"):
        kmax = max(setup["ks"][model])
        by_method = {m: g for m, g in gm.groupby("method")}
        for metric in ("pass@1", f"pass@{kmax}"):
            for method in [m for m in METHOD_ORDER if m in by_method]:
                rows.append(stat({"model": model, "task": task, "metric": metric, "method": method},
                                 ci_prompts(by_method[method], metric), contrast=""))
            for a, b in SEQUENTIAL_CONTRASTS:
                if a in by_method and b in by_method:
                    rows.append(stat({"model": model, "task": task, "metric": metric, "method": f"{a} - {b}"},
                                     paired_ci(by_method[a], by_method[b], metric), contrast="paired difference"))
    return pd.DataFrame(rows)


def table_b_sequential(data: StageInputs, output: dict) -> None:
    caption = table_caption("b_sequential")
    write_long_table(output, caption, build_b_sequential(data), "no ES->GRPO / GRPO->ES runs in this config "
                     "(needs es, grpo and sequential.task)", ["model", "task", "method"], columns="metric")


def build_b_drift(data: StageInputs) -> pd.DataFrame:
    drift = data.analysis("drift")
    if drift.empty:
        return pd.DataFrame()
    drift = drift[drift["run_kind"].isin(["es", "grpo", "es_arith"])]
    whole = drift_norms(drift).assign(module_type="all")
    norms = pd.concat([whole, drift_norms(drift, ["module_type"])], ignore_index=True)
    rows = []
    for (model, task, module), g in norms.groupby(["model", "task", "module_type"], sort=True):
        for method, gm in g.groupby("method"):
            keys = {"model": model, "task": task, "module_type": module, "method": method}
            rows.append(stat(keys, ci_values(gm["relative_l2"]), quantity="relative L2",
                             n_seeds=gm["seed"].nunique()))
            rows.append(stat(keys, ci_values(gm["share_sq"]), quantity="share of squared update",
                             n_seeds=gm["seed"].nunique()))
        for method, es, grpo in es_against_grpo(g):
            rows.append(stat({"model": model, "task": task, "module_type": module, "method": f"{method}/GRPO"},
                             ratio_ci(es, grpo, "relative_l2"), quantity="relative L2 ratio",
                             n_seeds=len(set(es["seed"]) & set(grpo["seed"]))))
    return with_paper_rows(pd.DataFrame(rows), "quantity", lambda row: _reported_drift(data.setup, row))


def _reported_drift(setup: dict, row: pd.Series) -> PaperValue | None:
    """Paper B's whole-model ES/GRPO drift ratio (44.1x at Qwen2.5-7B)."""
    if row["module_type"] != "all":
        return None
    return paper_value(setup, "b_drift", row["model"], row["task"], row["method"], row["quantity"])


def table_b_drift(data: StageInputs, output: dict) -> None:
    caption = table_caption("b_drift")
    long = build_b_drift(data)
    write_long_table(output, caption, long, "no parameter-drift analyses for this config's runs",
                     ["model", "task", "module_type", "quantity"], order=RATIO_ORDER,
                     notes=absent_notes(data.setup) + paper_notes(data.setup, "b_drift", long, "quantity"))


def _sparsity_rows(keys: dict, runs: pd.DataFrame, metric: str) -> list[dict]:
    rows = []
    for kf, gk in runs[runs["kind"] == "top_fraction"].groupby("keep_fraction", sort=True):
        extra = {"kind": "top_fraction", "keep_fraction": float(kf), "module_type": "",
                 "n_kept": float(gk["n_kept"].mean()) if "n_kept" in gk else np.nan,
                 "n_changed": float(gk["n_changed"].mean()) if "n_changed" in gk else np.nan,
                 "n_runs": gk["run"].nunique()}
        rows.append(stat(keys, ci_values(gk[metric]), quantity="accuracy", **extra))
        rows.append(stat(keys, ci_values(gk[f"retained_{metric}"]), quantity="retained gain", **extra))
    for module_type, gk in runs[runs["kind"] == "reset_module"].groupby("module_type", sort=True):
        extra = {"kind": "reset_module", "keep_fraction": np.nan, "module_type": module_type,
                 "n_runs": gk["run"].nunique()}
        rows.append(stat(keys, ci_values(gk[metric]), quantity="accuracy", **extra))
        rows.append(stat(keys, ci_values(gk[f"lost_{metric}"]), quantity="share of gain lost", **extra))
    return rows


def build_b_sparsity(data: StageInputs) -> pd.DataFrame:
    sparsity = sparsity_frame(data)
    if sparsity.empty:
        return pd.DataFrame()
    rows = []
    for (model, task, method), g in sparsity.groupby(["model", "task", "method"], sort=True):
        for metric in (m for m in ACCURACY_METRICS if m in g):
            rows += _sparsity_rows({"model": model, "task": task, "method": method, "metric": metric}, g, metric)
    return pd.DataFrame(rows)


def table_b_sparsity(data: StageInputs, output: dict) -> None:
    caption = table_caption("b_sparsity")
    long = build_b_sparsity(data)
    if long.empty:
        return not_run_table(output, caption, "no sparsity analyses for this config's runs")
    long = long.assign(keep=long["keep_fraction"].map(lambda v: "" if pd.isna(v) else f"{v:g}"))
    shown = wide(long, ["model", "task", "method", "kind", "keep", "module_type"], columns="quantity")
    write_table(long.drop(columns=["keep"]), output, caption, display_frame(shown))


def _ablation_setting_rows(keys: dict, sets: dict, curves: pd.DataFrame, metrics: list[str]) -> list[dict]:
    """Each ablation setting's test metrics and final train reward."""
    rows = []
    for label, g in sets.items():
        if label == "one-sided":
            continue
        variant = g["variant"].iloc[0]
        for metric in metrics:
            rows.append(stat({**keys, "variant": variant, "setting": label, "metric": f"test {metric}"},
                             ci_prompts(g, metric), n_seeds=g["seed"].nunique()))
        curve = tail(curves[curves["variant"] == variant])
        rows.append(stat({**keys, "variant": variant, "setting": label, "metric": "final train reward"},
                         ci_curve(curve, "fitness_mean"), n_seeds=curve["seed"].nunique()))
    return rows


def _ablation_contrast_rows(keys: dict, sets: dict, curves: pd.DataFrame, metrics: list[str],
                            main_rank: int | None = None) -> list[dict]:
    """Paired differences between settings: per prompt on test metrics, per iteration on the train reward;
    the fitness contrasts, then each low-rank noise against the main runs' (frames.lowrank_contrasts)."""
    rows = []
    for name, a, b in (*ABLATION_CONTRASTS, *lowrank_contrasts(sets, main_rank)):
        if a not in sets or b not in sets:
            continue
        for metric in metrics:
            rows.append(stat({**keys, "variant": "", "setting": name, "metric": f"test {metric}"},
                             paired_ci(sets[a], sets[b], metric), n_seeds=sets[a]["seed"].nunique()))
        curve_a = tail(curves[curves["variant"] == sets[a]["variant"].iloc[0]])
        curve_b = tail(curves[curves["variant"] == sets[b]["variant"].iloc[0]])
        rows.append(stat({**keys, "variant": "", "setting": name, "metric": "final train reward"},
                         paired_ci(curve_a, curve_b, "fitness_mean", unit="iteration"),
                         n_seeds=curve_a["seed"].nunique() if not curve_a.empty else 0))
    return rows


def build_b_ablations(data: StageInputs) -> pd.DataFrame:
    setup = data.setup
    task, n, main_rank = setup["ablation_task"], setup["main_n"], setup.get("main_rank")
    if task is None or n is None:
        return pd.DataFrame()
    prompts, curves = ablation_frames(data)
    if prompts.empty and curves.empty:
        return pd.DataFrame()
    rows = []
    for model in sorted(set(prompts["model"]) if not prompts.empty else set(curves["model"])):
        model_prompts = prompts[prompts["model"] == model] if not prompts.empty else prompts
        model_curves = curves[curves["model"] == model] if not curves.empty else curves
        sets = ablation_sets(model_prompts, n)
        if len(sets) < 2 or not ({"rank", "none", "antithetic"} & set(sets) or lowrank_contrasts(sets, main_rank)):
            continue
        metrics = ["greedy", "mean@n", f"pass@{max(setup['ks'][model])}"]
        keys = {"model": model, "task": task}
        rows += _ablation_setting_rows(keys, sets, model_curves, metrics)
        rows += _ablation_contrast_rows(keys, sets, model_curves, metrics, main_rank)
    return pd.DataFrame(rows)


def table_b_ablations(data: StageInputs, output: dict) -> None:
    caption = table_caption("b_ablations", **data.setup)
    write_long_table(output, caption, build_b_ablations(data), "no ES ablation runs in this config "
                     "(es.ablations.normalization / antithetic / ranks)", ["model", "task", "setting", "variant"],
                     columns="metric")


def _mark_smallest_sufficient(rewards: pd.DataFrame) -> pd.DataFrame:
    out = pd.concat([r.assign(budget="iterations", matched_at="final (last 10% of iterations)")
                     for _, r in rewards.groupby("model")], ignore_index=True)
    out["smallest_sufficient"] = False
    for model, g in out.groupby("model"):
        best = smallest_sufficient(dict(zip(g["population"], g["value"], strict=True)))
        out.loc[(out["model"] == model) & (out["population"] == best), "smallest_sufficient"] = True
    return out


def build_b_population(data: StageInputs) -> pd.DataFrame:
    if data.setup["ablation_task"] is None:
        return pd.DataFrame()
    _, curves = ablation_frames(data)
    rewards = population_rewards(curves)
    if rewards.empty or rewards["population"].nunique() < 2:
        return pd.DataFrame()
    out = _mark_smallest_sufficient(rewards)
    # each population's curve at the smallest total rollouts of the sweep
    sweep = curves[curves["kind"].isin(["es", "es_pop"])]
    population = population_of_variant(sweep)
    extra = [{**r, "population": population[r["variant"]], "smallest_sufficient": None}
             for r in budget_rows(sweep, sorted(set(sweep["variant"])), "fitness_mean", "train reward")
             if r["budget"] == "rollouts"]
    if extra:
        out = pd.concat([out, pd.DataFrame(extra)], ignore_index=True)
    out["population"] = out["population"].astype(int)
    if "at_step" not in out:
        out["at_step"] = None
    out["at_step"] = out["at_step"].where(out["budget"] == "rollouts", out["iterations"].astype(str))
    cols = ["model", "task", "budget", "matched_at", "population", "at_step", "window", "total_rollouts", "n_seeds",
            "smallest_sufficient", "value", "value_lo", "value_hi"]
    out = out.rename(columns={"rollouts": "total_rollouts"})
    # a count (the seeds' mean of equal totals): an integer column, not a float printed "7680.000"
    if np.allclose(out["total_rollouts"].dropna() % 1, 0):
        out["total_rollouts"] = out["total_rollouts"].round().astype("Int64")
    return out[cols].sort_values(["model", "budget", "population"], kind="stable").reset_index(drop=True)


def table_b_population(data: StageInputs, output: dict) -> None:
    caption = table_caption("b_population", **data.setup)
    long = build_b_population(data)
    if long.empty:
        return not_run_table(output, caption, "no population sweep (es.ablations.population_sizes) in this config")
    write_table(long.rename(columns={"value": "reward", "value_lo": "reward_lo", "value_hi": "reward_hi"}),
                output, caption)


def _entropy_change_rows(curves: pd.DataFrame, changes: pd.DataFrame) -> list[dict]:
    rows = []
    for (model, task, method), g in changes.groupby(["model", "task", "method"], sort=True):
        keys = {"model": model, "task": task, "method": method, "budget": "iterations"}
        curve = curves[(curves["model"] == model) & (curves["task"] == task) & (curves["method"] == method)]
        rows.append(stat(keys, ci_curve(tail(curve, first=True), "entropy"), metric="train entropy, first 10%",
                         matched_at="whole run"))
        rows.append(stat(keys, ci_curve(tail(curve), "entropy"), metric="train entropy, last 10%",
                         matched_at="whole run"))
        rows.append(stat(keys, ci_values(g["relative_change"]), metric="train entropy last/first - 1",
                         matched_at="whole run"))
    variants = main_variants(curves)
    rows += [{**r, "metric": "train entropy at budget"} for r in
             budget_rows(curves, variants, "entropy", "entropy") if r["budget"] != "iterations"]
    return rows


def build_b_entropy(data: StageInputs) -> pd.DataFrame:
    curves = data.metrics
    curves = curves[curves["variant"].isin(main_variants(curves))] if not curves.empty else curves
    # A method whose entropy is an estimate or a bound (the vLLM backend) gets its own column, labelled.
    curves = curves.assign(method=entropy_labels(curves)) if not curves.empty else curves
    changes = entropy_change(curves) if not curves.empty else pd.DataFrame()
    rows = _entropy_change_rows(curves, changes) if not changes.empty else []
    test = data.on_task({"base", "es", "grpo"})
    test = test.assign(method=entropy_labels(test)) if not test.empty else test
    for (model, task, method), g in test.groupby(["model", "task", "method"], sort=True):
        rows.append(stat({"model": model, "task": task, "method": method, "budget": "iterations"},
                         ci_prompts(g, "entropy"), metric="test sampling entropy (per token)",
                         matched_at="final checkpoint"))
    return order_rows(pd.DataFrame(rows), ["model", "task", "budget", "metric", "method"])


def table_b_entropy(data: StageInputs, output: dict) -> None:
    caption = table_caption("b_entropy")
    write_long_table(output, caption, build_b_entropy(data), "no ES / GRPO runs in this config",
                     ["model", "task", "budget", "matched_at", "metric"], order=METHOD_ORDER,
                     notes=absent_notes(data.setup))
