import os
from pathlib import Path

from esgrpo.evaluation import heldout
from esgrpo.plan import Planner, PlanSettings, cost_row, plan_row, settings_per_model, total_gpu_hours
from esgrpo.report import planning as paper_planning
from esgrpo.report.registry import stage_names
from esgrpo.workflow import slurm

# --- the resource plan -------------------------------------------------------------------------
# What every job needs (GPU and host memory, runtime) and the settings that make it fit (GPUs,
# micro-batches, vLLM's share and context), computed from the model's architecture for the GPU
# type of the config's `plan:` block (esgrpo.plan; docs/cluster.md, "Resource plan"). A config
# with GPU jobs is checked here, at parse time: a job that cannot fit stops the workflow with what
# it needs and what the GPU has; its rules then take mem_mb, runtime, gpu and gpu_model from the
# plan, and its trainers and engines the plan's settings. A CPU-only config (the embedded default)
# keeps the rules' own resources and settings; `snakemake plan` still writes its plan.

PLANNER = Planner(
    config,
    PlanSettings.from_config(config, **slurm.site_gpu_type(config, os.environ)),
    analysis_jobs=ANALYSIS_JOBS,
)
PLAN_SIZES_JOBS = PLANNER.sizes_jobs
if PLAN_SIZES_JOBS:
    PLANNER.check()


def job_plan(rule, wildcards):
    """The plan of `rule`'s job with these wildcards: each planned job's record states its rule's wildcards
    (esgrpo.plan.Planner.plan_of)."""
    return PLANNER.plan_of(rule, dict(wildcards.items()))


def retry_size(name, value, attempt):
    """mem_mb or runtime `value` of attempt 1 for attempt `attempt` (a retry resumes from its checkpoint with
    more of both), on a cluster at most what its largest node and longest partition limit allow: sbatch
    refuses a job no node can hold (esgrpo.workflow.slurm.cluster_limits)."""
    if name not in ("mem_mb", "runtime"):
        return value
    value *= attempt
    return value if workflow.local_exec else slurm.capped(name, value, slurm.cluster_limits())


def sized(name, value):
    """The input function of resource `name` (mem_mb, runtime) of a rule the plan does not size."""

    def resource(wildcards, attempt):
        return retry_size(name, value, attempt)

    return resource


GPU_RESOURCES = ("gpu", "cpus_per_gpu", "gpu_model")


def planned(rule, name, cpu_default):
    """The input function of resource `name` (mem_mb, runtime, threads, gpu, gpu_model) of `rule`: the
    plan's (JobPlan.resources: threads = the CPUs the job asks for, 1 per job on a CPU, plan.cpus_per_gpu
    per GPU); `cpu_default` in a CPU-only config; mem_mb and runtime grow with the attempt (retry_size); the GPU
    resources left unset where 0 or empty."""

    def resource(wildcards, attempt):
        value = (
            job_plan(rule, wildcards).resources(PLANNER.settings.cpus_per_gpu)[name]
            if PLAN_SIZES_JOBS
            else cpu_default
        )
        if name in GPU_RESOURCES and not value:
            return None  # unset: the Kubernetes executor refuses a `gpu` without a manufacturer, even 0
        return retry_size(name, value, attempt)

    resource.__name__ = f"{rule}_{name}"
    return resource


def with_plan(rule, wildcards, settings):
    """`settings` with the plan's choices for the job in place (GPU configs; JobPlan.applied_to)."""
    if not PLAN_SIZES_JOBS:
        return settings
    return job_plan(rule, wildcards).applied_to(settings)


def train_settings(wildcards):
    """The run's settings; a GRPO run's with the plan's micro-batches, processes, sharding and vLLM
    share and context."""
    settings = run_settings(wildcards)
    return with_plan("train_run", wildcards, settings) if run_method(wildcards) == "grpo" else settings


def es_engine(wildcards):
    """The ES engine block (es.engine); for an ES run, with the plan's engines, vLLM share and context."""
    engine = dict((config.get("es") or {}).get("engine") or {})
    return with_plan("train_run", wildcards, engine) if run_method(wildcards) == "es" else engine


def target_planner(target):
    """The plan of the jobs `target` runs: `all` (the config's default target: every job), or a paper's
    (paper_a, paper_b): every run and evaluation, the analyses its tables and figures read, and the held-out
    benchmarks where one of them reads those."""
    if target == "all":
        return PLANNER
    names = {
        "paper_a": stage_names("Paper A"),
        "paper_b": stage_names("Paper B"),
    }[target]
    read = {
        path
        for name in names
        for paths in paper_planning.paper_inputs(config, name, ANALYSIS_JOBS, RESULTS).values()
        for path in ([paths] if isinstance(paths, str) else paths)
    }
    heldout_read = bool(read & set(heldout.heldout_files(config, RESULTS, "_prompts.jsonl")))
    return Planner(
        config,
        PLANNER.settings,
        analysis_jobs=[job for job in ANALYSIS_JOBS if read.intersection(job.outputs)],
        heldout=heldout_read,
    )


def write_plan_files(target, csv_path, md_path, cost_path, log_path):
    """The plan rules: every job's plan of `target` as CSV and Markdown, its GPU-hours by kind (the
    cost row of docs/cluster.md) and the total in the log."""
    planner = target_planner(target)
    planner.write(csv_path, md_path)
    plans = planner.all()
    Path(cost_path).write_text(cost_row(plans, target) + "\n")
    own = [
        f"  {r['model']} ({r['task'] or 'all tasks'}): {r['block']}.{r['key']} = {r['value']} (the grid's: {r['grid']})\n"
        for r in settings_per_model(config)
    ]
    Path(log_path).write_text(
        f"{target}: {len(plans)} jobs, {total_gpu_hours(plans):.1f} GPU-hours "
        f"({planner.settings.gpu_type}): {csv_path}, {md_path}\n"
        + ("settings of a model's own (models.<model>.es / grpo / eval / per_task):\n" if own else "")
        + "".join(own)
    )


def plan_fingerprint(wildcards):
    """What the plan files hold, so that `snakemake plan` rewrites them when the config changes (with the
    settings a model has of its own, where any: plan.md lists them)."""
    rows = [plan_row(plan) for plan in target_planner(wildcards.get("plan_target", "all")).all()]
    own = settings_per_model(config)
    return rows + own if own else rows
