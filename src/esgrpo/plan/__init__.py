"""Resource plan: what every job of a config needs (GPU and host memory, runtime) and the
settings that make it fit (GPUs, micro-batch, vLLM memory and context), computed from the model's
architecture. Light on purpose (no torch at import): the Snakemake DAG parse uses it.

    architecture.py  Architecture, config.json / shipped architecture files, parameter count
    gpus.py          GPU types: usable memory, device total (vLLM's share), reached matmul and memory speed
    memory.py        GPU memory terms (training state, activations, vLLM, ES population)
    host.py          host memory (RSS) terms, phase by phase
    runtime.py       throughput model anchored on es-at-scale's measured ES speed
    prompts.py       prompt lengths measured from the prepared data (tokenizers + jinja2), else constants
    jobs.py          JobSpec -> JobPlan (plan_job, check_fits)
    grid.py          a config's jobs (config_jobs, plan_config) and plan.csv / plan.md
"""

from esgrpo.plan.architecture import Architecture, PlanError, architecture_for, from_config_json, shipped
from esgrpo.plan.gpus import GPU_TYPES, GpuType, gpu_type
from esgrpo.plan.grid import (
    Planner,
    PlanSettings,
    analysis_job,
    config_jobs,
    cost_row,
    eval_job,
    gpu_hours_by_rule,
    plan_config,
    plan_row,
    settings_per_model,
    total_gpu_hours,
    train_job,
    write_plan,
)
from esgrpo.plan.jobs import JobPlan, JobSpec, check_fits, plan_job

__all__ = [
    "GPU_TYPES", "Architecture", "GpuType", "JobPlan", "JobSpec", "PlanError", "PlanSettings", "Planner", "analysis_job",
    "architecture_for", "cost_row", "check_fits", "config_jobs", "eval_job", "from_config_json", "gpu_hours_by_rule",
    "gpu_type", "plan_config", "plan_job", "plan_row", "settings_per_model", "shipped", "total_gpu_hours", "train_job", "write_plan",
]
