"""The grid's analysis jobs as records: which analyses of which runs the config asks for, and the files each
writes under ``{results_dir}/analysis/{model}/``. The rules' targets (rules/targets.smk), the resource plan
(esgrpo.plan.grid) and the paper stages' inputs (esgrpo.report.planning) all read these records, so no one
takes an output path apart to learn its job.

Which runs each analysis covers: drift and KL the main ES and GRPO runs and the continual stages (drift also the
runs of the papers' arithmetic), theory every ES run, sparsity the main runs and the runs of the papers'
arithmetic, cosine and interpolation one pair (the main ES and GRPO runs) per seed and training task (``run`` is
then ``s{seed}``), and one more per run of a paper's arithmetic, with that run as the ES end
(``arith_paper_a-s{seed}``: esgrpo.runs.pair_name).
"""

from __future__ import annotations

from dataclasses import dataclass

from esgrpo.analysis.settings import analysis_config, main_run_seeds
from esgrpo.runs import main_es_name, main_grpo_name, pair_name, parse_run_name, planned_runs, run_spec


@dataclass(frozen=True)
class AnalysisJob:
    """One analysis job: its kind (esgrpo.analysis.settings.ANALYSES), model, training task, run (``s{seed}``
    for a pair analysis), the files it writes (a CSV first; theory and interpolation a JSON beside it) and its
    rule's wildcards (model, task, and run or seed)."""

    kind: str
    model: str
    task: str
    run: str
    outputs: tuple[str, ...]
    wildcards: tuple[tuple[str, str], ...] = ()

    @property
    def rule(self) -> str:
        return f"analysis_{self.kind}"


def rule_wildcards(**wildcards: str) -> tuple[tuple[str, str], ...]:
    """A job's wildcards as its record keeps them: sorted by name."""
    return tuple(sorted(wildcards.items()))


def pair_seeds(config: dict) -> list[int]:
    """Seeds with both a main ES and a main GRPO run (ES seed order)."""
    grpo = set(main_run_seeds(config, "grpo"))
    return [s for s in main_run_seeds(config, "es") if s in grpo]


def main_runs(config: dict, model: str) -> list[tuple[str, str]]:
    """(task, run) of the main ES and main GRPO runs of every seed, on every task of `model`."""
    planned = set(planned_runs(config, model))
    runs = []
    for task in config["models"][model]["tasks"]:
        runs += [(task, main_es_name(config, s)) for s in main_run_seeds(config, "es")]
        runs += [(task, main_grpo_name(config, s)) for s in main_run_seeds(config, "grpo")]
    return [r for r in runs if r in planned]


def analysis_jobs(config: dict, results: str) -> list[AnalysisJob]:
    """Every analysis job the config asks for, model by model, in a stable order."""
    wanted = set(analysis_config(config)["analyses"])
    jobs: list[AnalysisJob] = []
    for model in config["models"]:
        def job(kind: str, task: str, run: str, *suffixes: str, model: str = model, **wildcards: str) -> AnalysisJob:
            folder = f"{results}/analysis/{model}/{kind}/{task}"
            return AnalysisJob(kind, model, task, run, tuple(f"{folder}/{run}{s}" for s in suffixes),
                               rule_wildcards(model=model, task=task, **(wildcards or {"run": run})))

        runs, main = planned_runs(config, model), main_runs(config, model)
        names = {(t, r): parse_run_name(r) for t, r in runs}
        arith = [(t, r) for t, r in runs if names[t, r].arithmetic is not None]  # the papers' arithmetic
        if "drift" in wanted:  # what the drift tables read: main runs, the continual stages, the papers' arithmetic
            jobs += [job("drift", t, r, ".csv") for t, r in runs
                     if (t, r) in main or r.startswith("cl_") or (t, r) in arith]
        if "theory" in wanted:
            jobs += [job("theory", t, r, ".csv", ".json") for t, r in runs
                     if run_spec(config, model, t, r).method == "es"]
        if "sparsity" in wanted:
            jobs += [job("sparsity", t, r, ".csv") for t, r in runs if (t, r) in main or (t, r) in arith]
        if "kl" in wanted:  # main runs and the continual stages (paper A's heatmap covers the sequence)
            jobs += [job("kl", t, r, ".csv") for t, r in runs if (t, r) in main or r.startswith("cl_")]
        pairs = [(task, seed, None) for task in config["models"][model]["tasks"] for seed in pair_seeds(config)]
        grpo = set(main_run_seeds(config, "grpo"))
        pairs += [(t, names[t, r].seed, names[t, r].arithmetic) for t, r in arith
                  if names[t, r].seed in grpo and (t, main_grpo_name(config, names[t, r].seed)) in main]
        for task, seed, arithmetic in pairs:
            name = pair_name(seed, arithmetic)
            if "cosine" in wanted:
                jobs.append(job("cosine", task, name, ".csv", pair=name))
            if "interpolation" in wanted:
                jobs.append(job("interpolation", task, name, ".csv", ".json", pair=name))
    return jobs
