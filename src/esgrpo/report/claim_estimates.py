"""The estimate of every claim (report.claims.CLAIMS) and the claims table.

One function per family of claims; each returns claim id -> estimate (mean, 95% CI, the budget it
was measured at, the number of units, and "measured" or "not run: <why>" where the config does
not train what the claim needs). The statistics are the tables' (report.stats).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from esgrpo.report.claims import CLAIMS, claims_table, fill_pass_at_k
from esgrpo.report.frames import (
    ablation_frames,
    ablation_sets,
    barrier_heights,
    drift_norms,
    entropy_change,
    exact_pairs,
    js_gain_frame,
    lowrank_contrasts,
    sparsity_frame,
    stage_frame,
    theory_ratios,
)
from esgrpo.report.loading import StageInputs, run_labels
from esgrpo.report.registry import table_caption
from esgrpo.report.stats import (
    NAN3,
    ci_values,
    common_ks,
    grouped_ci,
    main_variants,
    norm_ratio_over_tensors,
    paired,
    pearson_ci,
    ratio_ci,
    tail,
)
from esgrpo.report.writing import display_frame, fmt_ci, write_table

FINAL_CHECKPOINTS = "iterations (final checkpoints)"
NO_GRPO = "config has no GRPO runs"
NO_ES = "config has no ES runs"


def measured(triple: tuple[float, float, float], budget: str = FINAL_CHECKPOINTS, n: float = math.nan) -> dict:
    return {"estimate": triple[0], "lo": triple[1], "hi": triple[2], "budget": budget, "n": n, "status": "measured"}


def not_run(why: str) -> dict:
    return {**measured(NAN3, budget=""), "status": f"not run: {why}"}


def not_measured(why: str) -> dict:
    """The config trains what the claim is about but not what the paper measures it on."""
    return {**measured(NAN3, budget=""), "status": f"not measured: {why}"}


def paired_estimate(a: pd.DataFrame, b: pd.DataFrame, value: str, budget: str = FINAL_CHECKPOINTS,
                    unit: str = "prompt") -> dict:
    """a - b paired per (seed, unit) (stats.paired), with the number of units compared."""
    diff = paired(a, b, value, unit)
    return measured(grouped_ci(diff, "diff", ("seed", unit)), budget, n=diff[unit].nunique())


def claim_ks(setup: dict) -> dict[str, int]:
    """The Pass@k values the claims use: k1, k2 = the two largest ks every model has (k = k2)."""
    big = sorted(k for k in common_ks(setup) if k > 1)[-2:] or [1]
    return {"k": big[-1], "k1": big[0], "k2": big[-1]}


def test_difference_claims(data: StageInputs, ks: dict[str, int]) -> dict[str, dict]:
    """Paired differences of test metrics between methods, on each run's own task, pooled."""
    test = data.on_task({"base", "es", "grpo", "es->grpo", "grpo->es"})
    by_method = {m: g for m, g in test.groupby("method")} if not test.empty else {}
    no_seq = "config has no ES->GRPO / GRPO->ES runs (sequential.task)"
    k1, k2 = f"pass@{ks['k1']}", f"pass@{ks['k2']}"
    comparisons = {  # claim id: (a, b, metric, why not run)
        "a_es_improves": ("ES", "base", "greedy", NO_ES),
        "a_es_matches_grpo": ("ES", "GRPO", "greedy", NO_GRPO),
        "b_grpo_below_base_k1": ("GRPO", "base", k1, NO_GRPO),
        "b_grpo_below_base_k2": ("GRPO", "base", k2, NO_GRPO),
        "b_es_not_below_base": ("ES", "base", k2, NO_ES),
        "b_es_passk_ge_grpo": ("ES", "GRPO", k2, NO_GRPO),
        "b_grpo_pass1_ge_es": ("GRPO", "ES", "pass@1", NO_GRPO),
        "b_es_then_grpo": ("ES->GRPO", "GRPO", k2, no_seq),
        "b_grpo_then_es": ("GRPO->ES", "GRPO", k2, no_seq),
    }
    return {cid: paired_estimate(by_method[a], by_method[b], metric) if a in by_method and b in by_method
            else not_run(why) for cid, (a, b, metric, why) in comparisons.items()}


def single_task_heldout_claim(data: StageInputs) -> dict[str, dict]:
    """Single-task ES against the base on the tasks it was not trained on."""
    prompts = data.prompts
    if prompts.empty or not (prompts["kind"] == "es").any():
        return {"b_heldout": not_run(NO_ES)}
    es_off = prompts[(prompts["kind"] == "es") & ~prompts["on_task"]]
    if es_off.empty:
        return {"b_heldout": not_run("every model has a single task")}
    base = prompts[prompts["kind"] == "base"]
    # a prompt is (training task, prompt): the base is compared once for every task ES trained on
    trained = es_off.assign(prompt=es_off["train_task"] + ">" + es_off["prompt"])
    untrained = pd.concat([base.assign(prompt=t + ">" + base["prompt"]) for t in es_off["train_task"].unique()])
    return {"b_heldout": paired_estimate(trained, untrained, "greedy")}


def continual_heldout_claims(data: StageInputs) -> dict[str, dict]:
    """After - before the continual sequence, on the tasks no stage trained on; "not measured" when every
    evaluated task is in the sequence (gains on trained tasks would make "no forgetting" hold by construction)."""
    setup = data.setup
    stages = stage_frame(data) if setup["continual"] else pd.DataFrame()
    out = {}
    for method, cid in (("ES", "a_heldout_es"), ("GRPO", "a_heldout_grpo")):
        df = stages[stages["method"] == method] if not stages.empty and "stage" in stages else pd.DataFrame()
        if df.empty or df["stage"].max() < 1:
            out[cid] = not_run(f"config has no continual {method} sequence")
            continue
        held = sorted(set(df["eval_task"]) - set(setup["continual"]))
        if not held:
            out[cid] = not_measured("every evaluated task is trained in the continual sequence: none held out")
            continue
        df = df[df["eval_task"].isin(held)]
        out[cid] = paired_estimate(df[df["stage"] == df["stage"].max()], df[df["stage"] == 0], "greedy",
                                   budget="iterations; held-out tasks " + ", ".join(held))
    return out


def _continual_norm_ratio(drift: pd.DataFrame, norms: pd.DataFrame) -> dict:
    continual = norms[norms["run_kind"].isin(["cl_es", "cl_grpo"])]
    if continual.empty or continual["method"].nunique() != 2:
        return not_run("config has no continual ES and GRPO sequences (or no drift analysis)")
    continual = continual.assign(stage=continual["run"].map(lambda r: run_labels(r)["stage"]))
    last = continual[continual["stage"] == continual["stage"].max()]
    es, grpo = last[last["method"] == "ES"], last[last["method"] == "GRPO"]
    seeds = sorted(set(es["seed"]) & set(grpo["seed"]))
    if len(seeds) == 1:  # one seed: the interval over the update's tensors, and the note says so
        return _one_seed_norm_ratio(drift, es, grpo, seeds[0], "iterations (final stage)")
    return measured(ratio_ci(es, grpo, "l2"), budget="iterations (final stage)", n=len(seeds))


def _one_seed_norm_ratio(drift: pd.DataFrame, es: pd.DataFrame, grpo: pd.DataFrame, seed: int, budget: str) -> dict:
    """ES / GRPO norm of one seed's runs, with its CI over parameter tensors (a norm has no prompts)."""
    def tensors(runs: pd.DataFrame) -> pd.Series:
        rows = drift[drift["run"].isin(runs.loc[runs["seed"] == seed, "run"]) & drift["model"].isin(runs["model"])]
        return (rows["l2"] ** 2).groupby([rows["model"], rows["name"]]).sum()
    a, b = tensors(es), tensors(grpo)
    common = a.index.intersection(b.index)
    return measured(norm_ratio_over_tensors(a[common], b[common]), n=len(common),
                    budget=f"{budget}; one seed: 95% CI over {len(common)} parameter tensors")


def _single_task_drift_ratio(drift: pd.DataFrame, norms: pd.DataFrame, has_grpo: bool) -> dict:
    """ES / GRPO whole-model relative L2 per (model, task, shared seed), pooled; one pair alone gets the
    CI over its parameter tensors (same base, so the relative L2 ratio is the L2 ratio)."""
    single = norms[norms["run_kind"].isin(["es", "grpo"])]
    ratios, pairs = [], []
    for _, g in single.groupby(["model", "task"]):
        es, grpo = g[g["method"] == "ES"], g[g["method"] == "GRPO"]
        for seed in sorted(set(es["seed"]) & set(grpo["seed"])):
            b = float(grpo[grpo["seed"] == seed]["relative_l2"].mean())
            if b > 0:
                ratios.append(float(es[es["seed"] == seed]["relative_l2"].mean()) / b)
                pairs.append((es, grpo, seed))
    if len(ratios) == 1:
        return _one_seed_norm_ratio(drift, *pairs[0], FINAL_CHECKPOINTS)
    if ratios:
        return measured(ci_values(ratios), n=len(ratios))
    return not_run(NO_GRPO if not has_grpo else "no drift analyses")


def drift_claims(data: StageInputs) -> dict[str, dict]:
    drift = data.analysis("drift")
    if drift.empty:
        why = "no drift analyses in this workflow"
        return {"a_norm_ratio_continual": not_run(why), "b_drift_ratio": not_run(why)}
    norms = drift_norms(drift)
    return {"a_norm_ratio_continual": _continual_norm_ratio(drift, norms),
            "b_drift_ratio": _single_task_drift_ratio(drift, norms, data.setup["has_grpo"])}


def theory_claim(data: StageInputs) -> dict[str, dict]:
    theory = data.analysis("theory")
    fits = theory_ratios(theory) if not theory.empty else pd.DataFrame(columns=["ratio", "applies"])
    ratios = fits.loc[fits["applies"].astype(bool), "ratio"].tolist()
    if not ratios:
        return {"a_norm_theory": not_run("no norm-theory analyses of z-scored one-sided ES runs in this workflow")}
    return {"a_norm_theory": measured(ci_values(ratios), budget="per logged update", n=len(ratios))}


def geometry_claims(data: StageInputs) -> dict[str, dict]:
    """Barrier, orthogonality and off-task KL of the ES and GRPO updates."""
    out = {}
    interp = exact_pairs(data.analysis("interpolation"))
    if not interp.empty and "path" in interp and (interp["path"] == "es-grpo").any():
        barriers = barrier_heights(interp)
        on_task = barriers[(barriers["metric"] == "greedy") & barriers["on_task"].astype(bool)]["barrier"]
        out["a_no_barrier"] = measured(ci_values(on_task), n=len(on_task))
    else:
        out["a_no_barrier"] = not_run("no ES-GRPO interpolation analyses (needs GRPO)")
    cosine = exact_pairs(data.analysis("cosine"))
    if not cosine.empty and ((cosine["scope"] == "global") & (cosine["pair"] == "es-grpo")).any():
        glob = cosine[(cosine["scope"] == "global") & (cosine["pair"] == "es-grpo")]
        out["a_orthogonal"] = measured(ci_values(glob["cosine"].abs()), n=len(glob))
    else:
        out["a_orthogonal"] = not_run("no ES-GRPO cosine analyses (needs GRPO)")
    out["a_kl_off_task"] = _off_task_kl_claim(data.analysis("kl"))
    return out


def _off_task_kl_claim(kl: pd.DataFrame) -> dict:
    """ES - GRPO off-task KL per (model, task, seed) both main runs have (continual stages aside)."""
    kl = kl[kl["run_kind"].isin(["es", "grpo"])] if not kl.empty else kl
    if kl.empty or not set(kl["method"]) >= {"ES", "GRPO"}:
        return not_run("no KL analyses for both ES and GRPO")
    off = kl[kl["eval_task"] != kl["task"]]
    per_run = off.groupby(["model", "task", "method", "seed"])["token_mean"].mean().reset_index()
    es = per_run[per_run["method"] == "ES"].set_index(["model", "task", "seed"])["token_mean"]
    grpo = per_run[per_run["method"] == "GRPO"].set_index(["model", "task", "seed"])["token_mean"]
    common = es.index.intersection(grpo.index)
    return measured(ci_values((es[common] - grpo[common]).tolist()), n=len(common))


def entropy_claims(data: StageInputs) -> dict[str, dict]:
    """Relative change of the training entropy (last / first 10% - 1) of the main runs."""
    setup, curves = data.setup, data.metrics
    changes = entropy_change(curves[curves["variant"].isin(main_variants(curves))]) if not curves.empty \
        else pd.DataFrame()
    out = {}
    for method, cid in (("ES", "b_entropy_es_stable"), ("GRPO", "b_entropy_grpo_collapses")):
        change = changes[changes["method"] == method]["relative_change"] if not changes.empty else []
        if len(change):
            out[cid] = measured(ci_values(change), budget="iterations (whole run)", n=len(change))
        elif not setup["has_es" if method == "ES" else "has_grpo"]:
            out[cid] = not_run(f"config has no {method} runs")
        else:
            out[cid] = not_run(f"no {method} training curve logs an entropy")
    return out


def js_diversity_claim(data: StageInputs) -> dict[str, dict]:
    js = js_gain_frame(data)
    if len(js) < 3:
        return {"b_js_diversity": not_run(f"needs >= 3 ES runs with JS diversity (have {len(js)})")}
    return {"b_js_diversity": measured(pearson_ci(js["js_diversity"], js["gain"]), n=len(js))}


def sparsity_claim(data: StageInputs) -> dict[str, dict]:
    """Share of ES's gain kept at the keep fraction nearest 0.1."""
    sparsity = sparsity_frame(data)
    if sparsity.empty or "mean@n" not in sparsity:
        return {"b_sparsity": not_run("no sparsity analyses in this workflow")}
    top = sparsity[(sparsity["kind"] == "top_fraction") & (sparsity["method"] == "ES")].dropna(
        subset=["retained_mean@n"])
    top = top[~np.isclose(top["keep_fraction"], 1.0)]
    if top.empty:
        return {"b_sparsity": not_run("ES gave no gain to retain (full - base <= 0) or no top-fraction rows")}
    kf = float(top["keep_fraction"].iloc[(top["keep_fraction"] - 0.1).abs().argmin()])
    kept = top.loc[np.isclose(top["keep_fraction"], kf), "retained_mean@n"]
    return {"b_sparsity": measured(ci_values(kept), budget=f"keep fraction {kf:g}", n=len(kept))}


def ablation_claims(data: StageInputs, prompts: pd.DataFrame) -> dict[str, dict]:
    """z-score against raw and rank fitness, antithetic against one-sided: test mean@n, pooled."""
    sets = ablation_sets(prompts, data.setup["main_n"]) if not prompts.empty else {}
    out = {}
    for cid, a, b in (("b_zscore_vs_none", "zscore", "none"), ("b_zscore_vs_rank", "zscore", "rank"),
                      ("b_antithetic", "antithetic", "one-sided")):
        if a in sets and b in sets:
            out[cid] = paired_estimate(sets[a], sets[b], "mean@n", budget="iterations = rollouts (same N)")
        else:
            out[cid] = not_run(f"config has no ES {b if a != 'antithetic' else a} ablation run")
    return {**out, **lowrank_claim(sets, data.setup.get("main_rank"))}


def lowrank_claim(sets: dict[str, pd.DataFrame], main_rank: int | None) -> dict[str, dict]:
    """Low-rank - full-rank test mean@n at the same N, paired per prompt, for each rank of es.ablations.ranks;
    judged on the rank whose CI lies farthest from 0 (the claim must hold for every rank), as b_population
    is judged on its worst model."""
    contrasts = lowrank_contrasts(sets, main_rank)
    if not contrasts or "zscore" not in sets:
        return {"es_lowrank_matches": not_run("config has no low-rank ES ablation run (es.ablations.ranks)")}
    per_rank = {name: paired_estimate(sets[a], sets[b], "mean@n") for name, a, b in contrasts}
    worst = max(per_rank, key=lambda c: np.nan_to_num(max(abs(per_rank[c]["lo"]), abs(per_rank[c]["hi"])),
                                                      nan=np.inf))
    each = ", ".join(f"{c} {e['estimate']:+.3f}" for c, e in per_rank.items())
    return {"es_lowrank_matches": {**per_rank[worst],
                                   "budget": f"iterations = rollouts (same N); {each}; judged on {worst}"}}


PAPER_B_POPULATIONS = (16, 64)  # paper B: N=16 within 0.01 of the N=64 reference (docs/references.md)


def population_claim(data: StageInputs, curves: pd.DataFrame) -> dict[str, dict]:
    """Final train reward of N=16 minus N=64, per model; the claim is judged on the model where the lower
    bound is lowest (it must hold for every model). No other pair stands in for 16 vs 64."""
    small_n, large_n = PAPER_B_POPULATIONS
    sweep = curves[curves["kind"].isin(["es", "es_pop"])] if not curves.empty else curves
    if sweep.empty:
        return {"b_population": not_run("config has no population sweep (es.ablations.population_sizes)")}
    per_model = {}
    for model, g in sweep.groupby("model"):
        small, large = tail(g[g["population"] == small_n]), tail(g[g["population"] == large_n])
        if not small.empty and not large.empty:
            diff = paired(small, large, "fitness_mean", unit="iteration")
            per_model[model] = (grouped_ci(diff, "diff", ("seed", "iteration")), len(diff))
    if not per_model:
        return {"b_population": not_measured(f"no model has both an N={small_n} and an N={large_n} ES run")}
    worst = min(per_model, key=lambda m: np.nan_to_num(per_model[m][0][1], nan=-np.inf))
    each = ", ".join(f"{m} {t[0]:+.3f}" for m, (t, _) in per_model.items())
    return {"b_population": measured(per_model[worst][0], n=per_model[worst][1],
                                     budget=f"iterations (last 10%); N={small_n} - N={large_n}: {each}; "
                                            f"judged on {worst}")}


def claim_estimates(data: StageInputs) -> dict[str, dict]:
    """claim id -> {estimate, lo, hi, budget, n, status} for every claim of the catalog."""
    prompts, curves = ablation_frames(data) if data.setup["ablation_task"] else (pd.DataFrame(), pd.DataFrame())
    return {**test_difference_claims(data, claim_ks(data.setup)), **single_task_heldout_claim(data),
            **continual_heldout_claims(data), **drift_claims(data), **theory_claim(data),
            **geometry_claims(data), **entropy_claims(data), **js_diversity_claim(data), **sparsity_claim(data),
            **ablation_claims(data, prompts), **population_claim(data, curves)}


def build_claims(data: StageInputs) -> pd.DataFrame:
    """The judged claims table: "not run" / "not measured" as the verdict of a claim the config cannot
    measure; ``ours / paper`` beside the paper's figure of a magnitude claim; a measured claim that rests
    on one unit (no CI, hence never "holds") says so in its status."""
    estimates, ks = claim_estimates(data), claim_ks(data.setup)
    rows = [{"claim": fill_pass_at_k(claim, **ks), **estimates[claim.id]} for claim in CLAIMS]
    table = claims_table(rows)
    for prefix in ("not run", "not measured"):
        table.loc[table["status"].str.startswith(prefix), "verdict"] = prefix
    one_unit = (table["status"] == "measured") & table["estimate"].notna() & table["lo"].isna()
    table.loc[one_unit, "status"] = "measured; one unit, no CI: inconclusive by design"
    table.insert(table.columns.get_loc("estimate") + 1, "ours / paper", table["estimate"] / table["paper_value"])
    return table


def claim_test_text(comparison: str, threshold: float, margin: float) -> str:
    """A claim's test as a reader checks it against the CI: the bound that `esgrpo.report.claims.verdict`
    compares with, e.g. "> 0.05 (0 + margin 0.05)", "within 1 ± 0.1", "<= 0"."""
    if comparison == "~=0":  # equivalence: the CI inside threshold +- margin
        return f"within {threshold:g} ± {margin:g}" if margin else f"= {threshold:g}"
    if not margin:
        return f"{comparison} {threshold:g}"
    sign = 1 if comparison in (">", "<=") else -1  # superiority / non-inferiority side of the threshold
    return f"{comparison} {threshold + sign * margin:g} ({threshold:g} {'+' if sign > 0 else '-'} margin {margin:g})"


def table_claims(data: StageInputs, output: dict) -> None:
    table = build_claims(data)
    caption = table_caption("claims")
    shown = pd.DataFrame({
        "id": table["id"], "paper": table["paper"], "statement": table["statement"],
        "measured analogue": table["metric"],
        "test": [claim_test_text(c, t, m) for c, t, m in zip(table["comparison"], table["threshold"], table["margin"],
                                                         strict=True)],
        "estimate [95% CI]": [fmt_ci(m, lo, hi) for m, lo, hi in
                              zip(table["estimate"], table["lo"], table["hi"], strict=True)],
        "paper (ours / paper)": ["" if pd.isna(p) else f"{p:g} ({fmt_ci(r, math.nan, math.nan, 2)})"
                                 for p, r in zip(table["paper_value"], table["ours / paper"], strict=True)],
        "verdict": table["verdict"],
        "budget / note": [b if st == "measured" else (f"{b}; {st}" if b else st) for b, st in
                          zip(table["budget"], table["status"], strict=True)],
    })
    write_table(table, output, caption, display_frame(shown))
