"""What each paper table and figure reads, and the kinds of run it reads them for.

This is the one report module ``rules/targets.smk`` imports (the input functions of the table and
figure rules): it imports neither pandas nor torch, so the DAG parse stays light. A run's kind
(``es``, ``es_pop``, ``grpo``, ``cl_es``, ...) is its role in the grid: the run name
(:func:`esgrpo.runs.parse_run_name`) read against the config's main population and group size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from esgrpo.analysis.jobs import AnalysisJob
from esgrpo.analysis.settings import ANALYSES
from esgrpo.config import judged_on
from esgrpo.evaluation.heldout import heldout_outputs
from esgrpo.report.registry import STAGES
from esgrpo.runs import config_rank, continual_stage_one, eval_settings, parse_run_name, planned_runs

BASE = "base"  # the base model's evaluation folder and the "run" of its rows
METHOD = {"base": "base", "es": "ES", "grpo": "GRPO", "es->grpo": "ES->GRPO", "grpo->es": "GRPO->ES",
          "cl_es": "ES", "cl_grpo": "GRPO", "es_pop": "ES", "es_norm": "ES", "es_anti": "ES",
          "grpo_group": "GRPO", "es_rank": "ES", "es_arith": "ES"}
METHOD_ORDER = ["base", "ES", "GRPO", "ES->GRPO", "GRPO->ES"]
RATIO_ORDER = ["ES", "GRPO", "ES/GRPO"]  # columns of the update-norm tables
# runs the alpha*sqrt(T d/N) theory is about: z-scored fitness (sum z^2 = N), independent members. Low-rank
# noise (es_rank) too: E = A B^T / sqrt(r) with iid standard factors has E||E||_F^2 = m n, as full-rank noise
# (esgrpo.analysis.theory; issue 20).
ZSCORE_ONE_SIDED = {"es", "es_pop", "cl_es", "grpo->es", "es_rank"}
# Per-run analyses computed for main runs and continual stages: a stage-1 main run's file also stands
# for its continual alias. (Sparsity is computed for main runs only and is not aliased.)
ALIASED_ANALYSES = ("drift", "theory", "kl")


def run_kind(run: str, main_n: int | None, main_g: int | None, main_rank: int | None = None) -> str:
    """base | es | es_pop | es_norm | es_anti | es_rank | es_arith | es_snap | grpo | grpo_group | es->grpo |
    grpo->es | cl_es | cl_grpo. es_rank: an ES run whose noise rank differs from the main runs' (`main_rank`,
    None = full-rank; es.ablations.ranks), so that it never joins the main ES rows; es_arith: a run of a paper's
    arithmetic (es.ablations.arithmetic), which no table reads yet."""
    if run == BASE:
        return BASE
    name = parse_run_name(run)
    if name.family == "snapshot":
        return "es_snap"
    if name.family == "es":
        if name.arithmetic is not None:
            return "es_arith"
        if name.normalization != "zscore":
            return "es_norm"
        if name.antithetic:
            return "es_anti"
        if name.rank != main_rank:
            return "es_rank"
        return "es" if name.population == main_n else "es_pop"
    if name.family == "grpo":
        return "grpo" if name.group == main_g else "grpo_group"
    if name.family == "sequential":
        return f"{name.first}->{name.method}"
    return f"cl_{name.method}"


def method_of(run: str, kind: str) -> str:
    """The method column: METHOD of the kind; a snapshot says its budget (``ES (100 it)``), a run of a paper's
    arithmetic which (``ES (paper A arithmetic)``)."""
    if kind == "es_snap":
        return snapshot_method(parse_run_name(run).iterations)
    if kind == "es_arith":
        return arithmetic_method(parse_run_name(run).arithmetic)
    return METHOD[kind]


def arithmetic_paper(arithmetic: str) -> str:
    """The paper whose ES arithmetic a key of es.ablations.arithmetic names: ``paper_a`` -> ``paper A``."""
    return f"paper {arithmetic.removeprefix('paper_').upper()}"


def arithmetic_method(arithmetic: str) -> str:
    """The method column of a run of a paper's ES arithmetic: ``ES (paper A arithmetic)``."""
    return f"ES ({arithmetic_paper(arithmetic)} arithmetic)"


def snapshot_method(iterations: int) -> str:
    return f"ES ({iterations} it)"


def paper_setup(config: dict) -> dict:
    """What the paper stages need to know of the config (passed to every rule as a param)."""
    es, grpo = config.get("es"), config.get("grpo")
    seq = config.get("sequential") or {}
    models, ks, n_samples, judged = {}, {}, {}, {}
    for model, spec in config["models"].items():
        ev = eval_settings(config, model)
        n = int(ev.get("n_samples", 32))
        models[model] = list(spec["tasks"])
        judged[model] = {task: judged_on(config, model, task) for task in spec["tasks"]}
        ks[model] = sorted({int(k) for k in ev.get("ks", [1, 2, 4, 8, 16, 32]) if k <= n} | {1})
        n_samples[model] = n
    continual = list(seq.get("continual") or [])
    methods = [m for m in seq.get("continual_methods", ["es", "grpo"]) if config.get(m)] if continual else []
    # one for every model (esgrpo.config checks that the models' own settings do not split it)
    first = next(iter(config["models"]))
    aliased = [continual_stage_one(config, first, m, s) for m in methods for s in config[m].get("seeds", [0])]
    stage_one = [dict(zip(("task", "run", "alias"), a, strict=True)) for a in aliased if a]
    return {
        "models": models,
        "sources": {model: spec.get("source") for model, spec in config["models"].items()},  # report.paper_values
        "judged_on": judged,
        "ks": ks,
        "n_samples": n_samples,
        "has_es": bool(es),
        "has_grpo": bool(grpo),
        "main_n": int(es["population_sizes"][0]) if es else None,
        "main_g": int(grpo["group_sizes"][0]) if grpo else None,
        "main_rank": config_rank(config) if es else None,  # the main ES runs' noise rank (None: full-rank)
        "sequential_task": seq.get("task") if (es and grpo) else None,
        "continual": continual,
        "continual_methods": methods,
        "continual_stage_one": stage_one,
        "ablation_task": ((es or {}).get("ablations") or {}).get("task"),
    }


def judged_tasks(setup: dict, model: str, train_task: str) -> list[str]:
    """The evaluation tasks that measure training on `train_task` (esgrpo.config.judged_on)."""
    return setup.get("judged_on", {}).get(model, {}).get(train_task, [train_task])


# What each paper stage reads (esgrpo.report.registry: the stages, their needs, captions and functions).
NEEDS: dict[str, dict] = {name: stage.needs for name, stage in STAGES.items()}


def stage_one_aliases(setup: dict) -> dict[tuple[str, str], str]:
    """(task, main run) -> the continual name it also stands for (stage 1: ``cl_es-s0-k1``)."""
    return {(a["task"], a["run"]): a["alias"] for a in setup.get("continual_stage_one", [])}


def kinds_served(task: str, run: str, setup: dict) -> set[str]:
    """The kinds a (task, run) file serves: its own, plus cl_* when it is stage 1 of a sequence."""
    kinds = {run_kind(run, setup["main_n"], setup["main_g"], setup.get("main_rank"))}
    alias = stage_one_aliases(setup).get((task, run))
    return kinds | {run_kind(alias, setup["main_n"], setup["main_g"], setup.get("main_rank"))} if alias else kinds


@dataclass(frozen=True)
class InputFile:
    """One input file of a paper stage and the job that writes it (``base`` as task and run: a base model's
    evaluation)."""

    path: str
    model: str
    task: str
    run: str


def _run_files(config: dict, setup: dict, needs: dict, results: str) -> dict[str, list[InputFile]]:
    """eval_prompts.jsonl / metrics.jsonl of every planned run of the kinds `needs` names."""
    where = _where(setup, needs)
    files: dict[str, list[InputFile]] = {}
    for key, filename in (("prompts", "eval_prompts.jsonl"), ("metrics", "metrics.jsonl")):
        kinds = needs.get(key)
        if not kinds:
            continue
        found = []
        for model in setup["models"]:
            if BASE in kinds and key == "prompts":
                found.append(InputFile(f"{results}/{model}/{BASE}/{filename}", model, BASE, BASE))
            for task, run in planned_runs(config, model):
                if where is not None and task != where:
                    continue
                if kinds_served(task, run, setup) & set(kinds):
                    found.append(InputFile(f"{results}/{model}/{task}/{run}/{filename}", model, task, run))
        files[key] = found
    return files


def _where(setup: dict, needs: dict) -> str | None:
    """The one task a stage reads (`needs["where"]`: its ablation or sequential task); None: every task."""
    return {"sequential": setup["sequential_task"], "ablation": setup["ablation_task"]}.get(needs.get("where"))


def _analysis_files(setup: dict, needs: dict, analysis_jobs: Sequence[AnalysisJob]) -> dict[str, list[InputFile]]:
    """The CSVs of the analysis jobs (esgrpo.analysis.jobs) of the kinds `needs` names (on its task only, where
    it names one)."""
    where = _where(setup, needs)
    files: dict[str, list[InputFile]] = {}
    for analysis in ANALYSES:
        kinds = needs.get(analysis)
        if not kinds:
            continue
        jobs = {job.outputs[0]: job for job in analysis_jobs
                if job.kind == analysis and job.model in setup["models"] and where in (None, job.task)
                and (kinds == "all" or kinds_served(job.task, job.run, setup) & set(kinds))}
        files[analysis] = [InputFile(path, jobs[path].model, jobs[path].task, jobs[path].run) for path in sorted(jobs)]
    return files


def paper_input_files(config: dict, name: str, analysis_jobs: Sequence[AnalysisJob] = (),
                      results: str = "results") -> dict[str, list[InputFile]]:
    """Input files of table / figure `name` as records: only what the config trains (via planned_runs) and
    the analysis jobs it reads (records: esgrpo.analysis.jobs), each with the job that writes it."""
    setup = paper_setup(config)
    needs = NEEDS[name]
    files = {**_run_files(config, setup, needs, results), **_analysis_files(setup, needs, analysis_jobs)}
    if needs.get("heldout"):  # benchmark prompts are evaluation rows of tasks no run trains on
        files["prompts"] = files.get("prompts", []) + [
            InputFile(path, model, task, run) for model, task, run, path in heldout_outputs(config, results,
                                                                                           "_prompts.jsonl")]
    return files


def paper_inputs(config: dict, name: str, analysis_jobs: Sequence[AnalysisJob] = (), results: str = "results") -> dict:
    """The paths of `paper_input_files` by input name: the rule's input."""
    return {key: [f.path for f in found]
            for key, found in paper_input_files(config, name, analysis_jobs, results).items()}


def paper_input_jobs(config: dict, name: str, analysis_jobs: Sequence[AnalysisJob] = (),
                     results: str = "results") -> dict[str, list[dict[str, str]]]:
    """The job of every input file of `name`, in the order of `paper_inputs`: the rule's params, so that
    the stage knows each file's model, task and run without reading them back from its path (which a
    storage plugin changes)."""
    return {key: [{"model": f.model, "task": f.task, "run": f.run} for f in found]
            for key, found in paper_input_files(config, name, analysis_jobs, results).items()}
