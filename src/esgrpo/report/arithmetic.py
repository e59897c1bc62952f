"""The ES arithmetic table: the project's exact arithmetic (fp32 master, exact restore) beside each paper's
(bf16 in place, no master; `esgrpo.es.arithmetic`), on the task and population where es.ablations.arithmetic
trains the papers' variants, seed for seed.

Four numbers per arithmetic: test greedy accuracy; the distance from the start over the norm theory's
alpha * sqrt(T d / N) at the final update (the theory analysis); and the two that tell rounding from
learning, per update (`esgrpo.distance.StepAgreement`, metrics.jsonl): the cosine of the step the weights
took with the step ES meant, and the share of coordinates that changed (also per module type). Means over a run's updates, then 95%
CIs over seeds; a backend that does not measure the agreement leaves its cells empty.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from esgrpo.parameter_names import MODULE_TYPES
from esgrpo.report.claim_estimates import drift_claims, geometry_claims, sparsity_claim, theory_claim
from esgrpo.report.claims import CLAIMS, claims_table
from esgrpo.report.frames import drift_norms
from esgrpo.report.loading import StageInputs, run_labels
from esgrpo.report.planning import arithmetic_paper
from esgrpo.report.registry import table_caption
from esgrpo.report.stats import ci_prompts, ci_values, ratio_ci, stat
from esgrpo.report.writing import fmt_ci, order_rows, write_long_table
from esgrpo.runs import ARITHMETIC_VARIANTS, parse_run_name

ARITHMETIC_LABELS = {"exact": "exact (fp32 master)",
                     **{name: f"{arithmetic_paper(name)} ({ARITHMETIC_VARIANTS[name]['arithmetic']}, bf16)"
                        for name in ARITHMETIC_VARIANTS}}
METRICS = ("test greedy accuracy", "distance / theory (final)", "step cosine with the intended step",
           "share of coordinates changed per update", "ES/GRPO drift ratio (relative L2)",
           "norm layers' share of the squared update", "cosine of the ES and GRPO updates")
MODULE_METRICS = {kind: f"share changed per update: {kind}" for kind in MODULE_TYPES}
ORDER = (*METRICS[:4], *MODULE_METRICS.values(), *METRICS[4:])


def arithmetic_of(run: str) -> str:
    """"exact", or the key of ARITHMETIC_VARIANTS a run's name carries."""
    return parse_run_name(run).arithmetic or "exact"


Cells = dict[tuple[str, str, int], set[int]]  # (model, task, population) -> the seeds of its arithmetic runs


def _compared(frame: pd.DataFrame, cells: Cells) -> pd.DataFrame:
    """Rows of the runs compared: a papers' arithmetic run, or an exact ES run of the same model, task,
    population and seed as one; with an `arithmetic` column (its label)."""
    if frame.empty:
        return frame.assign(arithmetic=pd.Series(dtype=str))
    es = frame[frame["kind"].isin(["es", "es_arith"])]
    population = es["run"].map(lambda r: run_labels(r)["population"])
    keep = [seed in cells.get((m, t, int(n)), ()) for m, t, n, seed
            in zip(es["model"], es["task"], population, es["seed"], strict=True)]
    es = es[keep]
    return es.assign(arithmetic=es["run"].map(lambda r: ARITHMETIC_LABELS[arithmetic_of(r)]))


def _cells(data: StageInputs) -> Cells:
    """(model, task, population) of every run of a paper's arithmetic -> the seeds it was run on."""
    metrics = data.metrics
    cells: Cells = {}
    if metrics.empty:
        return cells
    runs = metrics.loc[metrics["kind"] == "es_arith", ["model", "task", "run", "seed"]].drop_duplicates()
    for m, t, r, seed in runs.itertuples(index=False):
        cells.setdefault((m, t, int(run_labels(r)["population"])), set()).add(int(seed))
    return cells


def _drift_rows(drift: pd.DataFrame, cells: Cells) -> list[dict]:
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
        against = grpo[(grpo["model"] == model) & (grpo["task"] == task) & grpo["seed"].isin(g["seed"])]
        if not against.empty:
            rows.append(stat(keys, ratio_ci(g, against, "relative_l2"),
                             n_seeds=len(set(g["seed"]) & set(against["seed"]))))
    for (model, task, arithmetic), g in norms.groupby(["model", "task", "arithmetic"], sort=True):
        rows.append(stat({"model": model, "task": task, "metric": METRICS[5], "arithmetic": arithmetic},
                         ci_values(g["share_sq"]), n_seeds=g["seed"].nunique()))
    return rows


def _cosine_rows(cosine: pd.DataFrame, cells: Cells) -> list[dict]:
    """Paper A's orthogonality per arithmetic: the global cosine of ES's update (from its own start) with the
    main GRPO run's of the same seed."""
    if cosine.empty:
        return []
    glob = cosine[(cosine["scope"] == "global") & (cosine["pair"] == "es-grpo")]
    rows = []
    for (model, task, arithmetic), g in glob.groupby(["model", "task", "arithmetic"], sort=True):
        seeds = set().union(*(s for (m, t, _n), s in cells.items() if (m, t) == (model, task)))
        g = g[g["seed"].isin(seeds)]
        if not g.empty:
            rows.append(stat({"model": model, "task": task, "metric": METRICS[6],
                              "arithmetic": ARITHMETIC_LABELS[arithmetic]}, ci_values(g["cosine"]),
                             n_seeds=g["seed"].nunique()))
    return rows


# The geometry claims the arithmetic runs' analyses measure (norm theory, orthogonality, barrier, drift,
# sparsity): each is judged with the runs of one arithmetic in the main ES runs' place (`claim_verdicts`).
ARITHMETIC_CLAIMS = ("a_norm_theory", "a_orthogonal", "a_no_barrier", "b_drift_ratio", "b_sparsity")
# The analyses those claims read, each seen as if that arithmetic's runs were the main ES runs (`_as_main`).
ARITHMETIC_ANALYSES = ("drift", "theory", "sparsity", "cosine", "interpolation")


def _as_main(frame: pd.DataFrame, arithmetic: str, task: str, seeds: set[int]) -> pd.DataFrame:
    """An analysis frame with the runs of `arithmetic` (on `task`, seeds `seeds`) as the main ES runs and
    the main GRPO runs of those seeds; every other run dropped. A pair analysis (cosine, interpolation): the
    pairs whose ES end is that arithmetic's run, as the main runs' pairs."""
    if frame.empty:
        return frame
    own = frame[(frame["task"] == task) & frame["seed"].isin(seeds)]
    if "run_kind" not in own:  # a pair analysis (esgrpo.report.loading.load_analysis)
        return own[own["arithmetic"] == arithmetic].assign(arithmetic="exact")
    es = own[own["run_kind"].isin(["es", "es_arith"]) & (own["run"].map(arithmetic_of) == arithmetic)]
    return pd.concat([es.assign(run_kind="es", method="ES"), own[own["run_kind"] == "grpo"]], ignore_index=True)


def claim_verdicts(data: StageInputs) -> pd.DataFrame:
    """ARITHMETIC_CLAIMS judged per arithmetic on the ablation task and the seeds of the papers' arithmetic
    runs (the claims table's estimators and verdicts); `survives`: the exact arithmetic's verdict."""
    task = data.setup.get("ablation_task")
    seeds = set().union(*_cells(data).values())
    if task is None or not seeds:
        return pd.DataFrame()
    claims = {c.id: c for c in CLAIMS}
    rows = []
    for arithmetic, label in ARITHMETIC_LABELS.items():
        view = StageInputs({}, data.setup, {})
        for analysis in ARITHMETIC_ANALYSES:  # StageInputs' cache, filled with the arithmetic's view
            view.__dict__[analysis] = _as_main(data.analysis(analysis), arithmetic, task, seeds)
        estimates = {**drift_claims(view), **theory_claim(view), **geometry_claims(view), **sparsity_claim(view)}
        rows += [{"claim": claims[cid], "arithmetic": label, **estimates[cid]} for cid in ARITHMETIC_CLAIMS]
    table = claims_table(rows)
    table.loc[table["status"] != "measured", "verdict"] = table["status"]
    return table[["id", "statement", "arithmetic", "estimate", "lo", "hi", "verdict"]]


def _module_rows(metrics: pd.DataFrame, keys: list[str]) -> list[dict]:
    """The share of coordinates changed per update, per module type (paper B's grouping): a run's mean over
    its updates, then over seeds."""
    measured = metrics[metrics["changed_share_by_module"].map(lambda v: isinstance(v, dict))]
    long = pd.DataFrame([{**dict(zip([*keys, "run", "seed"], key, strict=True)), "kind": kind, "share": share}
                         for key, shares in zip(measured[[*keys, "run", "seed"]].itertuples(index=False),
                                                measured["changed_share_by_module"], strict=True)
                         for kind, share in shares.items()])
    if long.empty:
        return []
    per_run = long.groupby([*keys, "kind", "run", "seed"], sort=True)["share"].mean().reset_index()
    return [stat({"model": model, "task": task, "metric": MODULE_METRICS[kind], "arithmetic": arithmetic},
                 ci_values(g["share"]), n_seeds=g["seed"].nunique())
            for (model, task, arithmetic, kind), g in per_run.groupby([*keys, "kind"], sort=True)]


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
    if "changed_share_by_module" in metrics:
        rows += _module_rows(metrics, keys)
    rows += _drift_rows(data.analysis("drift"), cells)
    rows += _cosine_rows(data.analysis("cosine"), cells)
    long = pd.DataFrame(rows)
    long["metric"] = pd.Categorical(long["metric"], categories=ORDER, ordered=True)
    long = order_rows(long.sort_values(["model", "task", "metric", "arithmetic"]), ["model", "task", "metric"])
    return long.assign(metric=long["metric"].astype(str))


def verdict_notes(verdicts: pd.DataFrame) -> list[str]:
    """One line per claim: its verdict under each arithmetic, and whether the finding survives the exact one."""
    notes = []
    for cid, g in verdicts.groupby("id", sort=False):
        cells = [f"{r.arithmetic}: {r.verdict} ({fmt_ci(r.estimate, r.lo, r.hi)})" for r in g.itertuples()]
        exact = g.loc[g["arithmetic"] == ARITHMETIC_LABELS["exact"], "verdict"].iloc[0]
        survives = {"holds": "yes", "does not hold": "no"}.get(exact, exact)
        notes.append(f"Claim {cid} ({g['statement'].iloc[0]}): " + "; ".join(cells)
                     + f". Survives exact arithmetic: {survives}.")
    return notes


def table_es_arithmetic(data: StageInputs, output: dict) -> None:
    verdicts = claim_verdicts(data)
    write_long_table(output, table_caption("es_arithmetic", **data.setup), build_es_arithmetic(data),
                     "no run of a paper's arithmetic (es.ablations.arithmetic) in this config",
                     ["model", "task", "metric"], columns="arithmetic", order=list(ARITHMETIC_LABELS.values()),
                     notes=verdict_notes(verdicts) if not verdicts.empty else ())
