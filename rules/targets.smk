# What the targets ask for: the evaluations, analyses, tables, figures and held-out benchmarks of the
# config (all_targets: the default target; paper_a_targets, paper_b_targets: the papers').
import re

from esgrpo.evaluation import heldout
from esgrpo.report import planning as paper_planning
from esgrpo.report.registry import STAGES, stage_names
from esgrpo.runs import SNAPSHOT_RUN_PATTERN, planned_runs, run_spec

# --- tables, figures, papers -------------------------------------------------------------------
# Each paper table/figure reads only the tidy files of what the config trains
# (esgrpo.report.planning.paper_inputs, through planned_runs); the stages run from
# esgrpo.report.registry (STAGES: each stage's paper, inputs, caption and function; workflow_scripts/paper_stage.py).

PAPER_SETUP = paper_planning.paper_setup(config)
PAPER_TABLES = {name: STAGES[name].paper for name in stage_names(kind="table")}
PAPER_FIGURES = {name: STAGES[name].paper for name in stage_names(kind="figure")}


def base_eval_targets():
    return [f"{RESULTS}/{m}/base/eval.json" for m in MODELS]


def table_targets(name):
    return [f"{RESULTS}/tables/{name}.{ext}" for ext in ("csv", "md", "tex", "html")]


def figure_targets(name):
    return [f"{RESULTS}/figures/{name}.png", f"{RESULTS}/figures/{name}.pdf"]


def paper_input_function(name):
    def inputs(wildcards):
        return paper_planning.paper_inputs(config, name, ANALYSIS_JOBS, RESULTS)

    return inputs


def paper_jobs_function(name):
    """The job of each input file, in the inputs' order (the stage reads model, task and run from it)."""

    def jobs(wildcards):
        return paper_planning.paper_input_jobs(config, name, ANALYSIS_JOBS, RESULTS)

    return jobs


def paper_a_targets():
    return [
        *[p for n in stage_names("Paper A", "table") for p in table_targets(n)],
        *[p for n in stage_names("Paper A", "figure") for p in figure_targets(n)],
        *arithmetic_eval_targets(),
    ]


def snapshot_eval_targets():
    """The evaluations of the ES snapshots (es.snapshots): paper B's code exports and evaluates its model
    after one epoch as well as two, so its target evaluates them like final models."""
    return [
        f"{run_dir(m, t, r)}/eval.json"
        for m in MODELS
        for t, r in planned_runs(config, m)
        if re.fullmatch(SNAPSHOT_RUN_PATTERN, r)
    ]


def arithmetic_eval_targets():
    """The evaluations of the runs of a paper's arithmetic (es.ablations.arithmetic): a paper's target trains
    and evaluates them (tables/es_arithmetic reads them; a_update_norms and b_drift their drift)."""
    return [
        f"{run_dir(m, t, r)}/eval.json"
        for m in MODELS
        for t, r in planned_runs(config, m)
        if run_spec(config, m, t, r).settings.get("arithmetic", "exact") != "exact"
    ]


def paper_b_targets():
    return [
        *[p for n in stage_names("Paper B", "table") for p in table_targets(n)],
        *[p for n in stage_names("Paper B", "figure") for p in figure_targets(n)],
        *snapshot_eval_targets(),
        *arithmetic_eval_targets(),
    ]


def paper_targets():
    """Every paper table (CSV, Markdown, LaTeX), figure (PNG, PDF), the claims table and its verdict stability."""
    return [
        *paper_a_targets(),
        *paper_b_targets(),
        *[p for n in stage_names("Claims") for p in table_targets(n)],
    ]


def run_eval_targets(model=None):
    models = [model] if model else MODELS
    return [f"{run_dir(m, t, r)}/eval.json" for m in models for t, r in planned_runs(config, m)]


def base_fingerprint_targets():
    """The fingerprint of every offline default base (rule base_fingerprint)."""
    return [
        f"{RESULTS}/{m}/base/fingerprint.json"
        for m, spec in config["models"].items()
        if spec["source"] == "default"
    ]


# Held-out benchmarks through lm-eval (rules/heldout.smk; esgrpo.evaluation.heldout).
HELDOUT_BENCHMARKS = heldout.benchmark_names(config)
HELDOUT_RUNTIME = heldout.runtime_minutes(config)


def heldout_settings(wildcards):
    return heldout.benchmark_settings(config, wildcards.bench)


def heldout_targets():
    """Every held-out benchmark summary (heldout_benchmarks: base and final continual stages)."""
    return heldout.heldout_files(config, RESULTS)


def all_targets():
    """Every evaluation, analysis, table and figure."""
    targets = [
        *table_targets("base_passk"),
        *figure_targets("base_passk"),
        *run_eval_targets(),
        *base_fingerprint_targets(),
        *heldout_targets(),
    ]
    return [*targets, *ALL_ANALYSIS_TARGETS, *paper_targets()]
