"""Paper A's tables: accuracy (with budgets), the continual sequence, update norms, held-out
scores and update geometry. Each ``build_*`` returns the tidy table (statistics: report.stats);
each ``table_*`` writes it with its caption (report.writing)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from esgrpo.report.frames import (
    barrier_heights,
    drift_norms,
    es_against_grpo,
    has_continual_stages,
    kl_sequence_label,
    stage_frame,
    theory_norms,
)
from esgrpo.report.loading import StageInputs, run_labels
from esgrpo.report.paper_values import PaperValue, paper_notes, paper_value, with_paper_rows
from esgrpo.report.planning import (
    METHOD_ORDER,
    RATIO_ORDER,
    arithmetic_method,
    arithmetic_paper,
    snapshot_method,
)
from esgrpo.report.registry import table_caption
from esgrpo.report.stats import budget_rows, ci_prompts, ci_values, main_variants, paired_ci, ratio_ci, stat
from esgrpo.report.writing import absent_notes, order_rows, write_long_table
from esgrpo.runs import parse_run_name

NO_CONTINUAL = "no continual sequence (sequential.continual) in this config"


def build_a_accuracy(data: StageInputs) -> pd.DataFrame:
    rows = []
    test = data.on_task({"base", "es", "es_snap", "grpo"})
    for (model, task, method), g in test.groupby(["model", "task", "method"], sort=True):
        # a snapshot's final checkpoint is its parent after K iterations; the method says K
        rows.append(stat({"model": model, "task": task, "variant": g["variant"].iloc[0]}, ci_prompts(g, "greedy"),
                         method=method, budget="iterations", matched_at="final checkpoint",
                         metric="test greedy accuracy", n_seeds=g["seed"].nunique(),
                         n_prompts=g["prompt"].nunique()))
    rows += budget_rows(data.metrics, main_variants(data.metrics), "fitness_mean", "train reward")
    long = order_rows(pd.DataFrame(rows), ["model", "task", "budget", "metric", "method"])
    return with_paper_rows(long, "metric", lambda row: _reported_accuracy(data.setup, row))


def _reported_accuracy(setup: dict, row: pd.Series) -> PaperValue | None:
    """Paper A's test accuracy of a final checkpoint's cell (base, ES after 100 / 300 iterations, GRPO)."""
    if row["metric"] != "test greedy accuracy":  # not the train-reward rows
        return None
    return paper_value(setup, "a_accuracy", row["model"], row["task"], row["method"])


def methods_with_snapshots(data: StageInputs) -> list[str]:
    """METHOD_ORDER with the snapshot columns (``ES (K it)``, by K) just before ES."""
    prompts = data.prompts
    runs = set(prompts.loc[prompts["kind"] == "es_snap", "run"]) if not prompts.empty else set()
    iterations = sorted({parse_run_name(run).iterations for run in runs})
    i = METHOD_ORDER.index("ES")
    return [*METHOD_ORDER[:i], *(snapshot_method(k) for k in iterations), *METHOD_ORDER[i:]]


def table_a_accuracy(data: StageInputs, output: dict) -> None:
    caption = table_caption("a_accuracy")
    long = build_a_accuracy(data)
    write_long_table(output, caption, long, "no base / ES / GRPO evaluations in this config",
                     ["model", "task", "budget", "matched_at", "metric"], order=methods_with_snapshots(data),
                     notes=absent_notes(data.setup) + paper_notes(data.setup, "a_accuracy", long, "metric"))


def build_a_sequential(data: StageInputs) -> pd.DataFrame:
    stages = stage_frame(data)
    if not has_continual_stages(stages):
        return pd.DataFrame()
    rows = []
    for (model, method, stage, eval_task), g in stages.groupby(["model", "method", "stage", "eval_task"], sort=True):
        rows.append(stat({"model": model, "method": method, "stage": int(stage),
                          "stage_task": g["stage_task"].iloc[0], "eval_task": eval_task},
                         ci_prompts(g, "greedy"), row="accuracy"))
    accuracy = pd.DataFrame(rows)
    for (model, method, eval_task), g in accuracy.groupby(["model", "method", "eval_task"]):
        final_stage = g["stage"].max()
        earlier = g[(g["stage"] >= 1) & (g["stage"] < final_stage)]
        if earlier.empty:
            continue
        best = int(earlier.loc[earlier["value"].idxmax(), "stage"])
        sel = stages[(stages["model"] == model) & (stages["method"] == method) & (stages["eval_task"] == eval_task)]
        rows.append(stat({"model": model, "method": method, "stage": best, "stage_task": "forgetting",
                          "eval_task": eval_task},
                         paired_ci(sel[sel["stage"] == best], sel[sel["stage"] == final_stage], "greedy"),
                         row=f"forgetting = stage {best} (best earlier) - stage {final_stage} (final)"))
    return pd.DataFrame(rows)


def table_a_sequential(data: StageInputs, output: dict) -> None:
    setup = data.setup
    caption = table_caption("a_sequential", sequence=" -> ".join(setup["continual"] or ["(none)"]))
    write_long_table(output, caption, build_a_sequential(data), NO_CONTINUAL,
                     ["model", "method", "row", "stage", "stage_task"], columns="eval_task", notes=absent_notes(setup))


NORM = "||theta - theta0||"
THEORY_NORM = "||theta - theta0|| theory alpha*sqrt(T d/N)"


def build_a_update_norms(data: StageInputs) -> pd.DataFrame:
    drift = data.analysis("drift")
    if drift.empty:
        return pd.DataFrame()
    norms = drift_norms(drift)
    norms["setting"] = np.where(norms["run_kind"].str.startswith("cl_"), "continual", "single-task")
    norms["stage"] = [f"{int(run_labels(r)['stage'])}: {t}" if s == "continual" else t
                      for r, t, s in zip(norms["run"], norms["task"], norms["setting"], strict=True)]
    theory = theory_norms(data.analysis("theory")).set_index(["model", "task", "run"])["theory_l2"]
    rows = []
    for (setting, model, stage), g in norms.groupby(["setting", "model", "stage"], sort=True):
        keys = {"setting": setting, "model": model, "stage": stage}
        for method, gm in g.groupby("method", sort=True):
            rows.append(stat({**keys, "quantity": NORM, "method": method}, ci_values(gm["l2"]),
                             n_seeds=gm["seed"].nunique()))
            runs = [r for r in zip(gm["model"], gm["task"], gm["run"], strict=True) if r in theory.index]
            if runs:  # ES runs with a norm-theory analysis
                rows.append(stat({**keys, "quantity": THEORY_NORM, "method": method},
                                 ci_values(theory.loc[runs]), n_seeds=gm["seed"].nunique()))
            rows.append(stat({**keys, "quantity": "relative L2", "method": method}, ci_values(gm["relative_l2"]),
                             n_seeds=gm["seed"].nunique()))
        for method, es, grpo in es_against_grpo(g):
            rows.append(stat({**keys, "quantity": f"{NORM} ratio", "method": f"{method}/GRPO"},
                             ratio_ci(es, grpo, "l2"), n_seeds=len(set(es["seed"]) & set(grpo["seed"]))))
    return with_paper_rows(pd.DataFrame(rows), "quantity", lambda row: _reported_norm(data.setup, row))


def _reported_norm(setup: dict, row: pd.Series) -> PaperValue | None:
    """Paper A's norm of a continual stage's ||theta - theta0|| cell (its model and task at that stage)."""
    if row["setting"] != "continual" or row["quantity"] != NORM:
        return None
    stage, task = row["stage"].split(": ", 1)
    return paper_value(setup, "a_update_norms", row["model"], task, row["method"], int(stage))


def table_a_update_norms(data: StageInputs, output: dict) -> None:
    caption = table_caption("a_update_norms")
    long = build_a_update_norms(data)
    notes = absent_notes(data.setup, continual=True) + paper_notes(data.setup, "a_update_norms", long, "quantity")
    write_long_table(output, caption, long,
                     "no parameter-drift analyses (<grid folder>/analysis/*/drift) for this config's runs",
                     ["setting", "model", "stage", "quantity"], order=RATIO_ORDER, notes=notes)


def build_a_heldout(data: StageInputs) -> pd.DataFrame:
    stages = stage_frame(data)
    if not has_continual_stages(stages):
        return pd.DataFrame()
    order = data.setup["continual"]
    rows = []
    for (model, method, eval_task), g in stages.groupby(["model", "method", "eval_task"], sort=True):
        final = g["stage"].max()
        before, after = g[g["stage"] == 0], g[g["stage"] == final]
        held = eval_task not in order
        for label, metric in _heldout_metrics(g):
            keys = {"model": model, "method": method, "eval_task": eval_task, "held_out": held, "metric": label}
            rows.append(stat(keys, ci_prompts(before, metric), quantity="before (base)"))
            rows.append(stat(keys, ci_prompts(after, metric), quantity=f"after (stage {final})"))
            rows.append(stat(keys, paired_ci(after, before, metric), quantity="after - before"))
    return with_paper_rows(pd.DataFrame(rows), "metric", lambda row: _reported_heldout(data.setup, row))


def _heldout_metrics(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """(label, column) of one evaluation task's rows: greedy accuracy and mean@n; an lm-eval benchmark
    (esgrpo.evaluation.heldout) has one value per prompt, its headline metric, in the greedy column."""
    benchmark = rows["lm_eval_metric"].dropna() if "lm_eval_metric" in rows else pd.Series(dtype=object)
    if benchmark.empty:
        return [("greedy", "greedy"), ("mean@n", "mean@n")]
    return [(f"lm-eval {benchmark.iloc[0]}", "greedy")]


def _reported_heldout(setup: dict, row: pd.Series) -> PaperValue | None:
    """Paper A's held-out scores (MMLU, IFEval) before, after and after - before the sequence."""
    if row["metric"] == "mean@n":
        return None
    when = row["quantity"].split(" (")[0]  # "before (base)", "after (stage K)", "after - before"
    return paper_value(setup, "a_heldout", row["model"], row["eval_task"], row["method"], when)


def table_a_heldout(data: StageInputs, output: dict) -> None:
    caption = table_caption("a_heldout")
    long = build_a_heldout(data)
    notes = absent_notes(data.setup) + paper_notes(data.setup, "a_heldout", long, "metric")
    if not long.empty and not long["held_out"].astype(bool).any():
        notes.append("Every task is in the continual sequence: no task is held out.")
    write_long_table(output, caption, long, NO_CONTINUAL, ["model", "method", "eval_task", "held_out", "metric"],
                     columns="quantity", notes=notes)


# The pair a pairwise quantity compares (the cosine analysis' pair names), as a reader says it.
PAIRS = {"es-grpo": "dES vs dGRPO", "es-es": "dES vs dES (2 seeds)", "grpo-grpo": "dGRPO vs dGRPO (2 seeds)"}
PAIRWISE = "pairwise"  # the value column of a quantity of two runs (cosine, barrier), beside ES and GRPO


def _pair_label(pair: str, arithmetic: str) -> str:
    """A pair as a reader says it; an ES end of a paper's arithmetic named as such."""
    label = PAIRS.get(pair, pair)
    return label if arithmetic == "exact" else label.replace("dES", f"dES ({arithmetic_paper(arithmetic)} arithmetic)")


def _cosine_rows(cosine: pd.DataFrame) -> list[dict]:
    """Global cosine (and |cosine|) per pair, and the mean |cosine| per layer and module type; the pairs whose
    ES end is a run of a paper's arithmetic as rows of their own."""
    rows = []
    if "arithmetic" not in cosine:
        cosine = cosine.assign(arithmetic="exact")
    glob = cosine[cosine["scope"] == "global"]
    for (model, task, pair, arithmetic), g in glob.groupby(["model", "task", "pair", "arithmetic"], sort=True):
        keys = {"model": model, "task": task, "pair": _pair_label(pair, arithmetic), "method": PAIRWISE}
        rows.append(stat({**keys, "quantity": "cosine global"}, ci_values(g["cosine"]), n=len(g)))
        rows.append(stat({**keys, "quantity": "|cosine| global"}, ci_values(g["cosine"].abs()), n=len(g)))
    for (model, task, scope, pair, arithmetic), g in cosine[cosine["scope"] != "global"].groupby(
            ["model", "task", "scope", "pair", "arithmetic"], sort=True):
        rows.append(stat({"model": model, "task": task, "pair": _pair_label(pair, arithmetic), "method": PAIRWISE,
                          "quantity": f"mean |cosine| per {scope}"}, ci_values(g["cosine"].abs()), n=len(g)))
    return rows


def _barrier_rows(interp: pd.DataFrame) -> list[dict]:
    """Barrier heights ES-GRPO per (model, task, metric): on-task and off-task means over seeds; a path from
    the run of a paper's arithmetic as a row of its own."""
    per = barrier_heights(interp)
    rows = []
    for (model, task, metric, on, arithmetic), g in per.groupby(["model", "task", "metric", "on_task", "arithmetic"]):
        where = "on-task" if on else "off-task mean"
        es = "ES" if arithmetic == "exact" else arithmetic_method(arithmetic)
        rows.append(stat({"model": model, "task": task, "quantity": f"barrier height ({metric}, {where})",
                          "pair": f"{es} -> GRPO path", "method": PAIRWISE}, ci_values(g["barrier"]), n=len(g)))
    return rows


def _kl_rows(kl: pd.DataFrame) -> list[dict]:
    """On-task and off-task KL(base || model) of single-task runs and of every continual stage."""
    rows = []
    kl = kl.assign(sequence=kl_sequence_label(kl))
    for (model, task, method, sequence), g in kl.groupby(["model", "task", "method", "sequence"], sort=True):
        on, off = g[g["eval_task"] == task], g[g["eval_task"] != task]
        where = "" if sequence == "single task" else f", {sequence}"
        rows.append(stat({"model": model, "task": task, "quantity": f"KL on-task (token mean{where})", "pair": "",
                          "method": method}, ci_values(on["token_mean"]), n=len(on)))
        rows.append(stat({"model": model, "task": task, "quantity": f"KL off-task (token mean{where})", "pair": "",
                          "method": method}, ci_values(off["token_mean"]), n=len(off)))
    return rows


def build_a_geometry(data: StageInputs) -> pd.DataFrame:
    cosine, kl = data.analysis("cosine"), data.analysis("kl")
    rows = _cosine_rows(cosine) if not cosine.empty else []
    rows += _barrier_rows(data.analysis("interpolation"))
    rows += _kl_rows(kl) if not kl.empty else []
    return pd.DataFrame(rows)


def table_a_geometry(data: StageInputs, output: dict) -> None:
    caption = table_caption("a_geometry")
    write_long_table(output, caption, build_a_geometry(data), "no cosine / interpolation / KL analyses for this "
                     "config (they need both ES and GRPO runs and the analyses under the grid folder)",
                     ["model", "task", "quantity", "pair"], order=[PAIRWISE, "ES", "GRPO"], notes=absent_notes(data.setup))
