"""The ES arithmetic table: the project's exact arithmetic (fp32 master, exact restore) beside each paper's
(bf16 in place, no master; `esgrpo.es.arithmetic`), on the task and population where es.ablations.arithmetic
trains the papers' variants, seed for seed.

Four numbers per arithmetic: test greedy accuracy; the distance from the start over the norm theory's
alpha * sqrt(T d / N) at the final update (the theory analysis); and the two that tell rounding from
learning, per update (`esgrpo.distance.StepAgreement`, metrics.jsonl): the cosine of the step the weights
took with the step ES meant, and the share of coordinates that changed. Means over a run's updates, then 95%
CIs over seeds; a backend that does not measure the agreement leaves its cells empty.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from esgrpo.report.frames import drift_norms
from esgrpo.report.loading import StageInputs, run_labels
from esgrpo.report.registry import table_caption
from esgrpo.report.stats import ci_prompts, ci_values, ratio_ci, stat
from esgrpo.report.writing import order_rows, write_long_table
from esgrpo.runs import ARITHMETIC_VARIANTS, parse_run_name

ARITHMETIC_LABELS = {"exact": "exact (fp32 master)",
                     **{name: f"paper {name[-1].upper()} ({ARITHMETIC_VARIANTS[name]['arithmetic']}, bf16)"
                        for name in ARITHMETIC_VARIANTS}}
METRICS = ("test greedy accuracy", "distance / theory (final)", "step cosine with the intended step",
           "share of coordinates changed per update", "ES/GRPO drift ratio (relative L2)",
           "norm layers' share of the squared update")


def arithmetic_of(run: str) -> str:
    """"exact", or the key of ARITHMETIC_VARIANTS a run's name carries."""
    return parse_run_name(run).arithmetic or "exact"


def _compared(frame: pd.DataFrame, cells: set[tuple[str, str, int]]) -> pd.DataFrame:
    """Rows of the runs compared: a papers' arithmetic run, or an exact ES run of the same model, task and
    population as one; with an `arithmetic` column (its label)."""
    if frame.empty:
        return frame.assign(arithmetic=pd.Series(dtype=str))
    es = frame[frame["kind"].isin(["es", "es_arith"])]
    population = es["run"].map(lambda r: run_labels(r)["population"])
    keep = [(m, t, int(n)) in cells for m, t, n in zip(es["model"], es["task"], population, strict=True)]
    es = es[keep]
    return es.assign(arithmetic=es["run"].map(lambda r: ARITHMETIC_LABELS[arithmetic_of(r)]))


def _cells(data: StageInputs) -> set[tuple[str, str, int]]:
    """(model, task, population) of every run of a paper's arithmetic."""
    metrics = data.metrics
    if metrics.empty:
        return set()
    runs = metrics.loc[metrics["kind"] == "es_arith", ["model", "task", "run"]].drop_duplicates()
    return {(m, t, int(run_labels(r)["population"])) for m, t, r in runs.itertuples(index=False)}


def _drift_rows(drift: pd.DataFrame, cells: set[tuple[str, str, int]]) -> list[dict]:
    """Paper B's drift findings per arithmetic: the ES/GRPO relative-L2 ratio and the norm layers' share."""
    if drift.empty:
        return []
    whole = drift_norms(drift)
    by_module = drift_norms(drift, ["module_type"])
    grpo = whole[whole["run_kind"] == "grpo"]
    es = _compared(whole.rename(columns={"run_kind": "kind"}), cells)
    norms = _compared(by_module[by_module["module_type"] == "norm"].rename(columns={"run_kind": "kind"}), cells)
    rows = []
    for (model, task, arithmetic), g in es.groupby(["model", "task", "arithmetic"], sort=True):
        keys = {"model": model, "task": task, "metric": METRICS[4], "arithmetic": arithmetic}
        against = grpo[(grpo["model"] == model) & (grpo["task"] == task)]
        if not against.empty:
            rows.append(stat(keys, ratio_ci(g, against, "relative_l2"),
                             n_seeds=len(set(g["seed"]) & set(against["seed"]))))
    for (model, task, arithmetic), g in norms.groupby(["model", "task", "arithmetic"], sort=True):
        rows.append(stat({"model": model, "task": task, "metric": METRICS[5], "arithmetic": arithmetic},
                         ci_values(g["share_sq"]), n_seeds=g["seed"].nunique()))
    return rows


def build_es_arithmetic(data: StageInputs) -> pd.DataFrame:
    cells = _cells(data)
    if not cells:
        return pd.DataFrame()
    rows = []
    keys = ["model", "task", "arithmetic"]
    test = _compared(data.on_task({"es", "es_arith"}), cells)
    for (model, task, arithmetic), g in test.groupby(keys, sort=True):
        rows.append(stat({"model": model, "task": task, "metric": METRICS[0], "arithmetic": arithmetic},
                         ci_prompts(g, "greedy"), n_seeds=g["seed"].nunique()))
    theory = data.analysis("theory")
    if not theory.empty:
        final = theory.sort_values("updates").groupby(["model", "task", "run"], sort=True).tail(1)
        final = _compared(final.rename(columns={"run_kind": "kind"}), cells)
        final = final.assign(ratio=final["distance"] / np.sqrt(final["theory_sq"]))
        for (model, task, arithmetic), g in final.groupby(keys, sort=True):
            rows.append(stat({"model": model, "task": task, "metric": METRICS[1], "arithmetic": arithmetic},
                             ci_values(g["ratio"]), n_seeds=g["seed"].nunique()))
    metrics = _compared(data.metrics, cells)
    for column, metric in (("step_cosine", METRICS[2]), ("changed_share", METRICS[3])):
        if column not in metrics:
            continue
        per_run = metrics.groupby(keys + ["run", "seed"], sort=True)[column].mean().reset_index()
        for (model, task, arithmetic), g in per_run.groupby(keys, sort=True):
            rows.append(stat({"model": model, "task": task, "metric": metric, "arithmetic": arithmetic},
                             ci_values(g[column]), n_seeds=g["seed"].nunique()))
    rows += _drift_rows(data.analysis("drift"), cells)
    long = pd.DataFrame(rows)
    long["metric"] = pd.Categorical(long["metric"], categories=METRICS, ordered=True)
    long = order_rows(long.sort_values(["model", "task", "metric", "arithmetic"]), ["model", "task", "metric"])
    return long.assign(metric=long["metric"].astype(str))


def table_es_arithmetic(data: StageInputs, output: dict) -> None:
    write_long_table(output, table_caption("es_arithmetic", **data.setup), build_es_arithmetic(data),
                     "no run of a paper's arithmetic (es.ablations.arithmetic) in this config",
                     ["model", "task", "metric"], columns="arithmetic", order=list(ARITHMETIC_LABELS.values()))
