# Helpers shared by the other .smk files: names, paths, input functions and parameters derived
# from the config. Everything here is a constant or a function; the rules live in the stage
# files (data, models, train, eval, analysis, tables, paper).
import json
import os
import re
from pathlib import Path

from snakemake.logging import logger

from esgrpo.live import ENV as LIVE_ENV
from esgrpo.analysis.jobs import analysis_jobs
from esgrpo.analysis.settings import analysis_config, analysis_eval_settings, next_seed
from esgrpo.evaluation import heldout
from esgrpo.config import (
    check_config,
    judged_on,
    model_eval_tasks,
    model_warmup_tasks,
    software_env,
    task_splits,
)
from esgrpo.grids import check_grid_folder, config_source, write_grid_record
from esgrpo.plan import Planner, PlanSettings, cost_row, plan_row, settings_per_model, total_gpu_hours
from esgrpo.report import planning as paper_planning
from esgrpo.report.registry import STAGES, stage_names
from esgrpo.runs import (
    RUN_PATTERN,
    SNAPSHOT_RUN_PATTERN,
    TRAINED_RUN_PATTERN,
    eval_settings,
    main_es_name,
    main_grpo_name,
    planned_runs,
    reward_rules_setting,
    run_spec,
)
from esgrpo.pins import model_snapshot_folder
from esgrpo.tasks.registry import get_task
from esgrpo.tasks.rewards import own_graders_under
from esgrpo.workflow import progress_store, slurm

check_config(config)
# Whose rules grade this grid's training and evaluation (docs/rewards.md): said once, dry runs included,
# with the verifiers of this config's tasks that those rules have no grader of (the project's grade them).
_OWN_GRADERS = own_graders_under(config["rewards"]["rules"], [get_task(t).verifier for t in config["tasks"]])
logger.info(
    f"Reward rules: {config['rewards']['rules']} (rewards.rules; docs/rewards.md)"
    + (
        f"; the project's graders for verifier(s) {_OWN_GRADERS}, which those rules do not grade"
        if _OWN_GRADERS
        else ""
    )
)

# The grid's folder (config `results_dir`, set by the Snakefile): every output lives under it. A folder
# that holds another config's grid with other settings stops the parse here, before any job runs
# (esgrpo.grids); the record is written when jobs start (onstart: write_grid_folder_record).
RESULTS = config["results_dir"]
# This workflow's own folder: workflow.basedir is the deploying workflow's when this one is a module
# (snakedeploy, `module ... use rule * from`); the folder of this file is always this workflow's.
WORKFLOW_DIR = Path(workflow.current_basedir.get_path_or_uri(secret_free=True)).parent
GRID_SOURCE = config_source(
    workflow.overwrite_configfiles, workflow.config_settings.config_args, WORKFLOW_DIR / "config.yaml"
)
GRID_RECORD_DUE = check_grid_folder(RESULTS, config, GRID_SOURCE)
MODELS = list(config["models"])
TASKS = list(config["tasks"])

# Live training curves (esgrpo.live): the logging block reaches the training jobs through the
# environment, not as a rule parameter, so that changing where the curves go retrains nothing.
os.environ[LIVE_ENV] = json.dumps({**config["logging"], "root": f"{RESULTS}/tensorboard"})
# Under a default storage provider (no shared filesystem: Kubernetes, cloud batch) the training jobs keep their
# progress folders in that storage too, so that a killed job resumes on another node (esgrpo.workflow.progress_store).
_PROGRESS_STORE = progress_store.store_setting(
    workflow.storage_settings.default_storage_provider, workflow.storage_settings.default_storage_prefix
)
if _PROGRESS_STORE:
    os.environ[progress_store.ENV] = _PROGRESS_STORE

# Every job's software under `--software-deployment-method conda`: the pinned CPU or GPU env.
SOFTWARE_ENV = f"../envs/{software_env(config)}.yaml"
# Jobs import esgrpo from this checkout, also inside a conda env built from envs/*.yaml (an env
# file cannot pip-install the checkout itself). A module read from a URL has no checkout: there the
# installed package serves (README, "Usage").
_SRC = str(WORKFLOW_DIR / "src")
if Path(_SRC).is_dir() and _SRC not in os.environ.get("PYTHONPATH", "").split(os.pathsep):
    os.environ.update(PYTHONPATH=os.pathsep.join(filter(None, [_SRC, os.environ.get("PYTHONPATH")])))


def _alternatives(names):
    return "|".join(re.escape(n) for n in names)


wildcard_constraints:
    model=_alternatives(MODELS),
    task=_alternatives(TASKS),
    evaltask=_alternatives(TASKS),
    run=RUN_PATTERN,


# --- models ------------------------------------------------------------------------------------

# Models shipped as a GGUF file (`models.<name>.gguf_file`) are converted once to HF layout.
GGUF_MODELS = [m for m, spec in config["models"].items() if spec.get("gguf_file")]


def model_tasks(model):
    """The tasks `model` is trained on."""
    return config["models"][model]["tasks"]


def train_tasks(wildcards):
    """The tasks the job's model is trained on."""
    return model_tasks(wildcards.model)


def eval_tasks(wildcards):
    """The tasks every checkpoint of the job's model is evaluated on (`eval_tasks`, default: its training tasks)."""
    return model_eval_tasks(config, wildcards.model)


def model_source(wildcards):
    """The model's `source`: a Hub id, a folder, "default", or a package holding its GGUF file."""
    return config["models"][wildcards.model]["source"]


def model_gguf_file(wildcards):
    return config["models"][wildcards.model]["gguf_file"]


def base_model_is_built(model):
    """Built here: the offline default, or a GGUF model converted once to HF layout."""
    spec = config["models"][model]
    return spec["source"] == "default" or bool(spec.get("gguf_file"))


def base_model_is_pinned(model):
    """A Hub id or folder with a pinned revision or file checksums (esgrpo.pins; rule pin_model checks them)."""
    spec = config["models"][model]
    return not base_model_is_built(model) and bool(spec.get("revision") or spec.get("sha256"))


PINNED_MODELS = [m for m in MODELS if base_model_is_pinned(m)]


def base_model_files(wildcards):
    """The built base checkpoint, when the model is built here (not a Hub id or a folder); for a pinned
    model, the record of its checked files (so that no job reads it before the check)."""
    if base_model_is_built(wildcards.model):
        return f"{RESULTS}/{wildcards.model}/base/model"
    if base_model_is_pinned(wildcards.model):
        return f"{RESULTS}/{wildcards.model}/base/pin.json"
    return []


def base_model_ref(wildcards):
    if base_model_is_built(wildcards.model):
        return f"{RESULTS}/{wildcards.model}/base/model"
    spec = config["models"][wildcards.model]
    if spec.get("revision") and not Path(spec["source"]).expanduser().is_dir():
        return str(model_snapshot_folder(spec["source"], spec["revision"]))  # the pinned revision's files
    return spec["source"]


def model_revision(wildcards):
    return config["models"][wildcards.model].get("revision")


def model_sha256(wildcards):
    return dict(config["models"][wildcards.model].get("sha256") or {})


def task_files(tasks, split="test"):
    return {
        split: expand(f"{RESULTS}/data/{{t}}/{split}.jsonl", t=tasks),
        "info": expand(f"{RESULTS}/data/{{t}}/info.json", t=tasks),
    }


def task_options(wildcards):
    """The task's block of the config (source, sizes, loader options)."""
    return config["tasks"][wildcards.task]


def used_splits(wildcards):
    """The splits of the task some model trains or evaluates on (esgrpo.config.task_splits)."""
    return task_splits(config, wildcards.task)


def train_data(wildcards):
    """Train rows and info of every training task of the model."""
    return task_files(train_tasks(wildcards), split="train")


def warmup_tasks(wildcards):
    """The tasks the default model is warmed up on: its training tasks and its held-out eval tasks."""
    return model_warmup_tasks(config, wildcards.model)


def warmup_data(wildcards):
    return task_files(warmup_tasks(wildcards), split="train")


def eval_data(wildcards):
    """Test rows and info of every evaluation task of the model."""
    return task_files(eval_tasks(wildcards))


def judged_tasks(wildcards):
    """The evaluation tasks that measure training on {task} (itself, or e.g. MATH-500 for DeepScaleR)."""
    return judged_on(config, wildcards.model, wildcards.task)


def judged_data(wildcards):
    return task_files(judged_tasks(wildcards))


# --- runs --------------------------------------------------------------------------------------


def run_dir(model, task, run):
    return f"{RESULTS}/{model}/{task}/{run}"


def run_model(wildcards):
    return f"{run_dir(wildcards.model, wildcards.task, wildcards.run)}/model"


def run_spec_of(wildcards):
    """What the run's name says (esgrpo.runs.RunSpec): method, settings, labels, start."""
    return run_spec(config, wildcards.model, wildcards.task, wildcards.run)


def run_method(wildcards):
    return run_spec_of(wildcards).method


def run_settings(wildcards):
    return run_spec_of(wildcards).settings


def run_labels(wildcards):
    return run_spec_of(wildcards).labels


def init_model_ref(wildcards):
    """The checkpoint a run starts from: the base, or (sequential runs) the previous stage's model."""
    spec = run_spec_of(wildcards)
    if spec.init is None:
        return base_model_ref(wildcards)
    return f"{run_dir(wildcards.model, *spec.init)}/model"


def snapshot_parent_dir(wildcards):
    """The folder of the ES run a snapshot run was exported by."""
    return run_dir(wildcards.model, *run_spec_of(wildcards).init)


def snapshot_parent_files(wildcards):
    """The model, metrics and summary of the ES run a snapshot run was exported by."""
    parent = snapshot_parent_dir(wildcards)
    return {
        "model": f"{parent}/model",
        "metrics": f"{parent}/metrics.jsonl",
        "summary": f"{parent}/summary.json",
    }


def snapshot_iteration(wildcards):
    """The parent ES run's iterations when it exported this snapshot."""
    return run_labels(wildcards)["iterations"]


def snapshot_parent_run(wildcards):
    return run_labels(wildcards)["snapshot_of"]


def init_model_files(wildcards):
    spec = run_spec_of(wildcards)
    return base_model_files(wildcards) if spec.init is None else init_model_ref(wildcards)


def eval_params(model):
    """Evaluation settings: the global block, overridden per model (esgrpo.runs.eval_settings), graded under
    rewards.rules."""
    return {**eval_settings(config, model), **reward_rules_setting(config)}


def eval_base_settings(wildcards):
    """The evaluation settings of the job's model, with the plan's engine choices (GPU configs)."""
    return with_plan("eval_base", wildcards, eval_params(wildcards.model))


def eval_run_settings(wildcards):
    return with_plan("eval_run", wildcards, eval_params(wildcards.model))


def engine_setting(wildcards, key, default):
    """One of the model's engine settings (dtype, device, batch_size) for analysis jobs."""
    return eval_params(wildcards.model).get(key, default)


def engine_dtype(wildcards):
    return engine_setting(wildcards, "dtype", "float32")


def engine_device(wildcards):
    return engine_setting(wildcards, "device", "cpu")


def base_samples_batch_size(wildcards):
    default = {"batch_size": engine_setting(wildcards, "batch_size", 256)}
    return with_plan("analysis_base_samples", wildcards, default)["batch_size"]


# --- analyses ----------------------------------------------------------------------------------
# Every analysis output lives under {RESULTS}/analysis/{model}/ and is a tidy CSV (columns: the
# ANALYSIS table in esgrpo/workflow/stages/analysis.py). theta0 is always the model's base checkpoint.
# Analyses pairing ES with GRPO (cosine, interpolation) need both an `es` and a `grpo` block.

ANALYSIS = analysis_config(config)
ANALYSIS_DIR = f"{RESULTS}/analysis"


# The analysis jobs as records (esgrpo.analysis.jobs): kind, model, task, run and outputs; fixed for the run,
# computed once, not again in every paper table's input function.
ANALYSIS_JOBS = analysis_jobs(config, RESULTS)
ALL_ANALYSIS_TARGETS = [path for job in ANALYSIS_JOBS for path in job.outputs]


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


def analysis_eval(wildcards):
    settings = analysis_eval_settings(eval_params(wildcards.model), ANALYSIS["eval"])
    return with_plan("analysis_sparsity", wildcards, settings)


def analysis_interpolation_eval(wildcards):
    overrides = {**ANALYSIS["eval"], **ANALYSIS["interpolation_eval"]}
    settings = analysis_eval_settings(eval_params(wildcards.model), overrides)
    return with_plan("analysis_interpolation", wildcards, settings)


def analysis_kl_settings(wildcards):
    kl = dict(ANALYSIS["kl"])
    if kl.get("max_new_tokens") is None:
        kl["max_new_tokens"] = eval_params(wildcards.model).get("max_new_tokens", 24)
    return kl


def kl_base_samples(wildcards):
    """The base model's fixed continuations on every evaluation task of the model (KL's reference)."""
    return expand(f"{ANALYSIS_DIR}/{wildcards.model}/base_samples/{{t}}.jsonl", t=eval_tasks(wildcards))


def _main_run_model(wildcards, main_name, seed):
    return f"{run_dir(wildcards.model, wildcards.task, main_name(config, seed))}/model"


def pair_es_model(wildcards):
    """The model of this seed's main ES run: the ES end of the pair analyses."""
    return _main_run_model(wildcards, main_es_name, int(wildcards.seed))


def pair_grpo_model(wildcards):
    """The model of this seed's main GRPO run: the GRPO end of the pair analyses."""
    return _main_run_model(wildcards, main_grpo_name, int(wildcards.seed))


def analysis_cosine_pairs(wildcards):
    """es-grpo of this seed; es-es and grpo-grpo of this seed with the next configured seed."""
    seed = int(wildcards.seed)
    pairs = [
        {"pair": "es-grpo", "a": pair_es_model(wildcards), "b": pair_grpo_model(wildcards), "seed_b": seed}
    ]
    for method, main_name in (("es", main_es_name), ("grpo", main_grpo_name)):
        other = next_seed(config, method, seed)
        if other is not None:
            pairs.append(
                {
                    "pair": f"{method}-{method}",
                    "a": _main_run_model(wildcards, main_name, seed),
                    "b": _main_run_model(wildcards, main_name, other),
                    "seed_b": other,
                }
            )
    return pairs


def analysis_cosine_models(wildcards):
    return sorted({ref for p in analysis_cosine_pairs(wildcards) for ref in (p["a"], p["b"])})


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
    """The evaluations of the runs of a paper's arithmetic (es.ablations.arithmetic), which no table reads yet:
    a paper's target still trains and evaluates them (their norm theory: the default target's analyses)."""
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


# --- the local job server ----------------------------------------------------------------------
# A local CPU run forks its jobs from one interpreter that has torch, transformers and TRL imported
# (esgrpo.workflow.job_server: ~4-5 s of imports saved per job, results unchanged). SLURM jobs, GPU configs
# and conda-deployed jobs run their stage in their own process, as does every job with
# ESGRPO_NO_JOB_SERVER=1.

JOB_SERVERS = []


def write_grid_folder_record():
    """The grid record of RESULTS, when this config's run is the folder's first or changed its settings."""
    if GRID_RECORD_DUE:
        write_grid_record(RESULTS, config, GRID_SOURCE)


def start_job_server():
    from esgrpo.workflow import job_server

    if workflow.local_exec and software_env(config) == "cpu" and job_server.enabled():
        JOB_SERVERS.append(job_server.start(f"{RESULTS}/logs/job_server.log"))


def stop_job_server():
    while JOB_SERVERS:
        JOB_SERVERS.pop().stop()


# --- SLURM ----------------------------------------------------------------------------------------
# profiles/slurm reads its site settings from the environment: the partitions (ESGRPO_SLURM_PARTITION,
# ..._GPU_PARTITION; unset, the local cluster's names) and the account (ESGRPO_SLURM_ACCOUNT; unset, an
# empty one: jobs go without -A). Set here, at parse time: Snakemake expands the profile's $VARS when it
# evaluates each job's resources (dry runs included), and the jobs inherit them (sbatch --export=ALL).
for _name, _default in {**slurm.PARTITION_DEFAULTS, slurm.ACCOUNT_ENV: ""}.items():
    os.environ.setdefault(_name, _default)
# The profile is known at parse time by its default resources; the executor only when jobs start.
SLURM_PROFILE = any(
    str(arg).startswith("slurm_")
    for arg in getattr(workflow.resource_settings.default_resources, "args", None) or []
)
if SLURM_PROFILE:
    logger.info(slurm.site_summary(os.environ, PLANNER.settings.gpu_type if PLAN_SIZES_JOBS else None))


def check_slurm_driver():
    """onstart of a SLURM driver: a job without an account is taken where none is set, no job of a driver
    that no longer runs is left in this working directory, and this driver recorded as alive so that a
    driver of another grid leaves its jobs alone (esgrpo.workflow.slurm; docs/cluster.md, "When the
    driver dies")."""
    if workflow.executor_plugin is not None and workflow.executor_plugin.name == "slurm":
        slurm.check_driver(os.getcwd())
        # The plugin names every job after this run ID (snakemake-executor-plugin-slurm 2.8.0, run_uuid).
        slurm.register_driver(os.getcwd(), workflow.scheduler._executor.run_uuid, RESULTS)
