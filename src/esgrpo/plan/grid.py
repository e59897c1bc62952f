"""The plan of a whole config: one JobSpec per job the workflow runs, and plan.csv / plan.md.

Jobs come from the same place as the workflow's: `esgrpo.runs.planned_runs` and `run_spec` for
training and evaluation; analysis jobs from their records (`esgrpo.analysis.jobs.analysis_jobs`, the rules'
analysis targets).
What the config does not say (the GPU type, ES engines per job) comes from `PlanSettings`, read
from an optional `plan:` block of the config; prompt lengths are measured from the prepared data
where they can be (`esgrpo.plan.prompts`, `PromptTokens`), else its constants or `plan.prompt_tokens`.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from esgrpo.analysis.jobs import AnalysisJob, rule_wildcards
from esgrpo.plan.architecture import Architecture, PlanError, architecture_for
from esgrpo.plan.gpus import gpu_type
from esgrpo.plan.jobs import CPUS_PER_GPU, JobPlan, JobSpec, plan_job
from esgrpo.plan.memory import GIB
from esgrpo.plan.prompts import (
    DEFAULT_PROMPT_TOKENS,
    PROMPT_TOKENS,
    hf_cache_tokenizer,
    longest_prompts,
    plan_tokens,
    tokenizer_files,
)
from esgrpo.runs import eval_settings, trainer_settings

# Test rows the Hub loaders give when the config's test_size is null (esgrpo.tasks.hub: paper sizes).
TEST_ROWS = {"countdown": 2000, "math": 500, "chemistry": 2000, "boolq": 2000, "gsm8k": 1319}
DEFAULT_TEST_ROWS = 500
# plan.gpu_type for a grid whose GPU jobs (vLLM engines, TRL's colocated vLLM) run on this host's cores.
HOST_ONLY = "cpu"


@dataclass(frozen=True)
class PlanSettings:
    """What the plan needs beyond the config. gpu_type: the GPU the SLURM profile asks for;
    es_gpus: vLLM engines (GPUs) per ES job when `es.engine.num_engines` is not set;
    grpo_gpus: None lets the plan pick the fewest GPUs that fit; cpus_per_gpu: CPU cores a GPU job
    asks for per GPU."""

    gpu_type: str = "h200"
    es_gpus: int = 4
    grpo_gpus: int | None = None
    cpus_per_gpu: int = CPUS_PER_GPU
    prompt_tokens: dict[str, int] = field(default_factory=dict)
    results: str = "results/default"  # the config's results_dir (esgrpo.grids): where built models live

    @classmethod
    def from_config(cls, config: dict[str, Any], **overrides: Any) -> PlanSettings:
        block = {"results": config.get("results_dir", cls.results), **(config.get("plan") or {})}
        block.update(overrides)
        settings = cls(**block)
        if settings.gpu_type != HOST_ONLY:  # an unknown type fails here once, not once per job
            gpu_type(settings.gpu_type)
        return settings

    def device(self, on_gpu: bool) -> str:
        """Where a job that would take a GPU runs: "cuda", or "cpu" under `plan.gpu_type: cpu` (vLLM's CPU
        build on this host: the rehearsal grid, configs/rehearsal.yaml), where every job is a host job."""
        return "cuda" if on_gpu and self.gpu_type != HOST_ONLY else "cpu"

    def prompt_tokens_of(self, task: str) -> int:
        """The unmeasured prompt length of `task`: `plan.prompt_tokens`, else the stated constant."""
        return int(self.prompt_tokens.get(task, PROMPT_TOKENS.get(task, DEFAULT_PROMPT_TOKENS)))


class PromptTokens:
    """The prompt part of a job's max_model_len, by (model, task, split): the longest prompt of
    `{results_dir}/data/{task}/{split}.jsonl` with the model's tokenizer and chat template, in whole KV
    blocks (`esgrpo.plan.prompts`), where both are there at parse time, and never below an explicit
    `plan.prompt_tokens`; else `PlanSettings.prompt_tokens_of` (stated constants). `sources` records
    which it was for each (model, task, split) asked, for plan.md."""

    def __init__(self, config: dict[str, Any], settings: PlanSettings):
        self.config, self.settings = config, settings
        self._tokenizers: dict[str, dict[str, Path] | None] = {}
        self._measured: dict[tuple[str, str], dict[str, int]] = {}
        self.sources: dict[tuple[str, str, str], str] = {}

    def tokenizer(self, model: str) -> dict[str, Path] | None:
        """The model's tokenizer files where they are local (as `architecture_for` finds config.json)."""
        if model not in self._tokenizers:
            spec = self.config["models"][model]
            source = str(spec["source"])
            if source == "default" or spec.get("gguf_file"):
                found = tokenizer_files(Path(self.settings.results) / model / "base" / "model")
            elif Path(source).expanduser().is_dir():
                found = tokenizer_files(Path(source).expanduser())
            else:
                found = hf_cache_tokenizer(source)
            self._tokenizers[model] = found
        return self._tokenizers[model]

    def __call__(self, model: str, task: str, split: str) -> int:
        fallback = self.settings.prompt_tokens_of(task)
        files = self.tokenizer(model)
        if files is None:
            self.sources[(model, task, split)] = "constant (no local tokenizer)"
            return fallback
        if (model, task) not in self._measured:
            data_dir = Path(self.settings.results) / "data" / task
            try:
                self._measured[(model, task)] = longest_prompts(data_dir, files, model)
            except ValueError as err:  # a template this light renderer cannot compile, an unreadable row
                import sys

                print(f"plan: prompt lengths of {task} for {model} not measured ({type(err).__name__}: {err}); "
                      f"using {fallback} tokens", file=sys.stderr)
                self._measured[(model, task)] = {}
        measured = self._measured[(model, task)].get(split)
        if measured is None:
            self.sources[(model, task, split)] = "constant (no prepared data)"
            return fallback
        self.sources[(model, task, split)] = f"measured ({measured} tokens)"
        return max(plan_tokens(measured), int(self.settings.prompt_tokens.get(task, 0)))


def _test_rows(config: dict[str, Any], task: str, limit: int | None) -> int:
    own = (config["tasks"].get(task) or {}).get("test_size")
    rows = int(own) if own else TEST_ROWS.get(task, DEFAULT_TEST_ROWS)
    return min(rows, int(limit)) if limit else rows


# --------------------------------------------------------------------------- one job


def train_job(config: dict[str, Any], model: str, task: str, run: str, arch: Architecture,
              settings: PlanSettings, lengths: PromptTokens | None = None) -> JobSpec | None:
    """The train_run job of (model, task, run); None for a snapshot run (exported, not trained)."""
    from esgrpo.runs import run_spec

    lengths = lengths or PromptTokens(config, settings)
    spec = run_spec(config, model, task, run)
    s = spec.settings
    common = dict(rule="train_run", model=model, task=task, run=run, architecture=arch,
                  wildcards=rule_wildcards(model=model, task=task, run=run),
                  gpu_type=settings.gpu_type, prompt_tokens=lengths(model, task, "train"),
                  new_tokens=int(s["max_new_tokens"]))
    if spec.method == "es":
        es = config.get("es") or {}
        engine = es.get("engine") or {}
        on_vllm = es.get("backend", "hf") == "vllm"
        in_place = s.get("arithmetic", "exact") != "exact"  # one engine, the weights in bf16 (es.ablations.arithmetic)
        return JobSpec(**common, method="es", device=settings.device(on_vllm),
                       backend="vllm" if on_vllm else "hf",
                       gpus=(1 if in_place else int(engine.get("num_engines") or settings.es_gpus)) if on_vllm else None,
                       weight_dtype=engine.get("dtype", "bfloat16") if on_vllm else "bfloat16" if in_place else "float32",
                       es_arithmetic=s.get("arithmetic", "exact"),
                       iterations=int(s["iterations"]), population=int(s["population_size"]),
                       prompts=int(s.get("prompts_per_iteration") or 64))
    if spec.method == "grpo":
        on_gpu = settings.device(bool(s.get("use_vllm") or s.get("bf16"))) == "cuda"
        completions = int(s["prompts_per_step"]) * int(s["num_generations"])
        return JobSpec(**common, method="grpo", device=settings.device(on_gpu),
                       backend="vllm" if s.get("use_vllm") else "hf", gpus=settings.grpo_gpus if on_gpu else None,
                       weight_dtype="bfloat16" if on_gpu else "float32", iterations=int(s["steps"]),
                       prompts=int(s["prompts_per_step"]), samples=int(s["num_generations"]),
                       checkpointing=on_gpu, beta=float(s.get("beta") or 0.0),
                       micro_batch=None if on_gpu else completions // int(s.get("gradient_accumulation_steps", 1)))
    return None


def eval_job(config: dict[str, Any], model: str, task: str, run: str, arch: Architecture,
             settings: PlanSettings, lengths: PromptTokens | None = None) -> JobSpec:
    """eval_base (run "base") or eval_run: every eval task of the model, n samples + greedy each."""
    from esgrpo.config import model_eval_tasks

    lengths = lengths or PromptTokens(config, settings)
    ev = eval_settings(config, model)
    tasks = model_eval_tasks(config, model)
    prompts = sum(_test_rows(config, t, ev.get("test_size")) for t in tasks)
    on_vllm = ev.get("backend", "hf") == "vllm"
    on_gpu = on_vllm or str(ev.get("device", "cpu")).startswith("cuda")
    wildcards = rule_wildcards(model=model) if run == "base" else rule_wildcards(model=model, task=task, run=run)
    return JobSpec(rule="eval_base" if run == "base" else "eval_run", model=model, task=task, run=run,
                   wildcards=wildcards, method="eval", architecture=arch, device=settings.device(on_gpu),
                   gpu_type=settings.gpu_type, gpus=1, backend="vllm" if on_vllm else "hf",
                   weight_dtype=ev.get("dtype", "bfloat16" if on_gpu else "float32"),
                   prompts=prompts, samples=int(ev.get("n_samples", 32)) + (1 if ev.get("greedy", True) else 0),
                   prompt_tokens=max(lengths(model, t, "test") for t in tasks),
                   new_tokens=int(ev.get("max_new_tokens", 24)), eval_batch=int(ev.get("batch_size", 256)))


def analysis_job(config: dict[str, Any], record: AnalysisJob, arch: Architecture, settings: PlanSettings,
                 lengths: PromptTokens | None = None) -> JobSpec:
    """The plan's job of analysis job `record` (esgrpo.analysis.jobs)."""
    from esgrpo.analysis.settings import analysis_config, next_seed
    from esgrpo.runs import pair_arithmetic, pair_seed, run_spec

    model, kind, task, name = record.model, record.kind, record.task, record.run
    analysis = analysis_config(config)
    base = replace(eval_job(config, model, task, name, arch, settings, lengths), wildcards=record.wildcards)
    ev = {**eval_settings(config, model), **(analysis.get("eval") or {})}
    samples = int(ev.get("n_samples", 8)) + (1 if ev.get("greedy", True) else 0)
    prompts = base.prompts if not ev.get("test_size") else min(base.prompts, int(ev["test_size"]))
    rule = f"analysis_{kind}"
    if kind in ("drift", "cosine", "theory"):
        # drift loads the run, the base and, for a run that started elsewhere (a sequential stage, a snapshot),
        # its start (esgrpo.workflow.stages.analysis.drift_stage): two copies for a run that started at the base,
        # three otherwise (three for every run overplanned the rehearsal's main runs: docs/rehearsal.md, fix 11)
        if kind == "drift":
            copies = 2 if run_spec(config, model, task, name).init is None else 3
        elif kind == "cosine":  # named by its pair: the deltas of its pairs' runs (rules/inputs.smk,
            # analysis_cosine_pairs): ES and GRPO, and the next seed's of each; or, with the run of a paper's
            # arithmetic as ES (no cross-seed pairs), ES, GRPO and the ES run's bf16 start
            seed = pair_seed(name)
            if pair_arithmetic(name) is None:
                copies = 2 + sum(next_seed(config, method, seed) is not None for method in ("es", "grpo"))
            else:
                copies = 3
        else:  # theory: metrics files only
            copies = 0
        return replace(base, rule=rule, method="compare", device="cpu", copies=copies)
    # the points are evaluated one after another: a batch holds one point's prompts x samples at most
    gpu_eval = dict(rule=rule, backend="hf", samples=samples, copies=3,
                    eval_batch=min(base.eval_batch, prompts * samples))
    if kind == "sparsity":
        return replace(base, **gpu_eval, prompts=prompts * len(analysis["sparsity_fractions"]))
    if kind == "interpolation":  # 3 paths x steps + 3 direction scans x multiples (shared points counted)
        ev = {**ev, **(analysis.get("interpolation_eval") or {})}
        prompts = base.prompts if not ev.get("test_size") else min(base.prompts, int(ev["test_size"]))
        points = 3 * int(analysis["interpolation_steps"]) + 3 * len(analysis.get("scan_multiples") or [])
        return replace(base, **{**gpu_eval, "copies": 5, "eval_batch": min(base.eval_batch, prompts * samples)},
                       prompts=prompts * points)
    kl = analysis["kl"]
    return replace(base, rule=rule, method="score", prompts=int(kl["n_prompts"]),
                   samples=int(kl["samples_per_prompt"]), eval_batch=int(kl.get("batch_size", 16)), copies=2)


def base_samples_job(config: dict[str, Any], model: str, evaltask: str, arch: Architecture,
                     settings: PlanSettings, lengths: PromptTokens | None = None) -> JobSpec:
    """analysis_base_samples: the base model's KL continuations on one evaluation task (transformers)."""
    from esgrpo.analysis.settings import analysis_config

    kl = analysis_config(config)["kl"]
    ev = eval_settings(config, model)
    on_gpu = str(ev.get("device", "cpu")).startswith("cuda") or ev.get("backend") == "vllm"
    return JobSpec(rule="analysis_base_samples", model=model, task=evaltask, run="base", method="eval",
                   wildcards=rule_wildcards(model=model, evaltask=evaltask),
                   architecture=arch, device=settings.device(on_gpu), gpu_type=settings.gpu_type, gpus=1,
                   backend="hf", weight_dtype=ev.get("dtype", "bfloat16" if on_gpu else "float32"),
                   prompts=int(kl["n_prompts"]), samples=int(kl["samples_per_prompt"]),
                   prompt_tokens=(lengths or PromptTokens(config, settings))(model, evaltask, "test"),
                   new_tokens=int(kl.get("max_new_tokens") or ev.get("max_new_tokens", 24)),
                   eval_batch=int(ev.get("batch_size", 256)), copies=1)


def heldout_jobs(config: dict[str, Any], model: str, arch: Architecture, settings: PlanSettings,
                 lengths: PromptTokens | None = None) -> list[JobSpec]:
    """heldout_base / heldout_run (rules/heldout.smk): one job per checkpoint and benchmark, on what the
    checkpoint's evaluation job gets (GPUs, memory), for the block's time limit. Its run is `{run}:{bench}`."""
    from esgrpo.evaluation import heldout

    limit = heldout.runtime_minutes(config)
    out = []
    for task, run in heldout.heldout_checkpoints(config, model):
        ev = eval_job(config, model, task, run, arch, settings, lengths)
        out += [replace(ev, rule="heldout_base" if run == "base" else "heldout_run", run=f"{run}:{bench}",
                        time_limit=limit, wildcards=rule_wildcards(**dict(ev.wildcards), bench=bench))
                for bench in heldout.benchmark_names(config)]
    return out


def config_jobs(config: dict[str, Any], settings: PlanSettings | None = None,
                analysis_jobs: Sequence[AnalysisJob] = (),
                lengths: PromptTokens | None = None, heldout: bool = True) -> list[JobSpec]:
    """Every training, evaluation, held-out benchmark (`heldout`) and (given their records) analysis job of
    `config`."""
    from esgrpo.config import model_eval_tasks
    from esgrpo.runs import planned_runs

    settings = settings or PlanSettings.from_config(config)
    lengths = lengths or PromptTokens(config, settings)
    jobs: list[JobSpec] = []
    archs = {m: architecture_for(config, m, settings.results) for m in config["models"]}
    for model, arch in archs.items():
        runs = planned_runs(config, model)
        jobs += [j for t, r in runs if (j := train_job(config, model, t, r, arch, settings, lengths)) is not None]
        jobs.append(eval_job(config, model, "base", "base", arch, settings, lengths))
        jobs += [eval_job(config, model, t, r, arch, settings, lengths) for t, r in runs]
        if heldout:
            jobs += heldout_jobs(config, model, arch, settings, lengths)
    kl_models = set()
    for record in analysis_jobs:
        if record.model in archs:
            jobs.append(analysis_job(config, record, archs[record.model], settings, lengths))
            if record.kind == "kl":
                kl_models.add(record.model)
    for model in sorted(kl_models):  # the KL analyses' reference continuations, one job per eval task
        jobs += [base_samples_job(config, model, t, archs[model], settings, lengths)
                 for t in model_eval_tasks(config, model)]
    return jobs


def plan_config(config: dict[str, Any], settings: PlanSettings | None = None,
                analysis_jobs: Sequence[AnalysisJob] = ()) -> list[JobPlan]:
    """The plan of every job; PlanError listing every job that cannot fit (not just the first)."""
    return Planner(config, settings, analysis_jobs).all()


class Planner:
    """The plan of one config for the rules: every job planned once, looked up by its wildcards.

        planner = Planner(config, PlanSettings.from_config(config), analysis_jobs=ANALYSIS_JOBS)
                                                          # (a target's jobs only: its analyses, heldout=False
                                                          #  where it runs no held-out benchmark)
        planner.check()                                   # at parse time: PlanError naming every misfit
        planner.plan("train_run", model, task, run)       # a JobPlan (eval_base: task = run = "base";
                                                          #   analyses: their rule, task, and run or "s{seed}")
        planner.resources("train_run", model, task, run)  # mem_mb, runtime, gpu, gpu_model, threads, cpus_per_gpu
        planner.write("results/ci/plan.csv", "results/ci/plan.md")
    """

    def __init__(self, config: dict[str, Any], settings: PlanSettings | None = None,
                 analysis_jobs: Sequence[AnalysisJob] = (), heldout: bool = True):
        self.config = config
        self.settings = settings or PlanSettings.from_config(config)
        self.lengths = PromptTokens(config, self.settings)
        self.jobs = {(j.rule, j.model, j.task, j.run): j
                     for j in config_jobs(config, self.settings, analysis_jobs, self.lengths, heldout)}
        self._by_wildcards = {(j.rule, j.wildcards): key for key, j in self.jobs.items()}
        self._plans: dict[tuple[str, str, str, str], JobPlan] = {}

    @property
    def sizes_jobs(self) -> bool:
        """Whether the rules take their resources from the plan: any job of the config runs on a GPU, or the
        config's GPU jobs run on this host (plan.gpu_type: cpu, vLLM's CPU build)."""
        return self.settings.gpu_type == HOST_ONLY or any(job.device != "cpu" for job in self.jobs.values())

    def plan(self, rule: str, model: str, task: str, run: str) -> JobPlan:
        key = (rule, model, task, run)
        if key not in self._plans:
            self._plans[key] = plan_job(self.jobs.get(key) or self._unlisted(key))
        return self._plans[key]

    def plan_of(self, rule: str, wildcards: Mapping[str, str]) -> JobPlan:
        """The plan of `rule`'s job with these wildcards (the rules' lookup: each job's record states its own);
        a training or evaluation job the grid does not list (a target asked for by path) is planned on demand."""
        key = self._by_wildcards.get((rule, rule_wildcards(**wildcards)))
        if key is None and set(wildcards) == {"model", "task", "run"}:
            key = (rule, wildcards["model"], wildcards["task"], wildcards["run"])
        if key is None:
            raise PlanError(f"no planned job {rule} {dict(wildcards)} in this config")
        return self.plan(*key)

    def _unlisted(self, key: tuple[str, str, str, str]) -> JobSpec:
        """A training or evaluation job the config's grid does not list (a target asked for by path)."""
        rule, model, task, run = key
        arch = architecture_for(self.config, model, self.settings.results) if model in self.config["models"] else None
        job = None
        if arch is not None and rule == "train_run":
            job = train_job(self.config, model, task, run, arch, self.settings, self.lengths)
        elif arch is not None and rule in ("eval_run", "eval_base"):
            job = eval_job(self.config, model, task, run, arch, self.settings, self.lengths)
        if job is None:
            raise PlanError(f"no planned job {rule} {model}/{task}/{run} in this config")
        return job

    def resources(self, rule: str, model: str, task: str, run: str) -> dict[str, object]:
        return self.plan(rule, model, task, run).resources(self.settings.cpus_per_gpu)

    def all(self) -> list[JobPlan]:
        """Every job's plan; PlanError listing every job that cannot fit (not just the first)."""
        plans, errors = [], []
        for key in self.jobs:
            try:
                plans.append(self.plan(*key))
            except PlanError as err:
                errors.append(str(err))
        if errors:
            raise PlanError(f"{len(errors)} job(s) cannot fit:\n" + "\n".join(errors))
        return plans

    def check(self) -> None:
        self.all()

    def write(self, csv_path: str | Path, md_path: str | Path | None = None) -> None:
        write_plan(self.all(), csv_path, md_path, self.lengths.sources, settings_per_model(self.config))


# --------------------------------------------------------------------------- plan.csv / plan.md

COLUMNS = ("rule", "model", "task", "run", "method", "iterations", "gpus", "gpu_type", "gpu_mem_gib",
           "gpu_avail_gib", "host_mem_gib", "mem_mb", "runtime_h", "slurm_minutes", "gpu_hours",
           "micro_batch", "grad_accum", "sharding", "vllm_util", "vllm_max_len", "vllm_concurrency", "prompt_tokens",
           "largest_terms")


def plan_row(plan: JobPlan) -> dict[str, Any]:
    j, gm = plan.job, plan.gpu_memory
    return {
        "rule": j.rule, "model": j.model, "task": j.task, "run": j.run, "method": j.method,
        "iterations": j.iterations if j.method in ("es", "grpo") else "",
        "gpus": plan.gpus, "gpu_type": j.gpu_type if gm else "",
        "gpu_mem_gib": round(gm.total / GIB, 1) if gm else "", "gpu_avail_gib": round(plan.gpu_available / GIB, 1) if gm else "",
        "host_mem_gib": round(plan.host_memory.total / GIB, 3), "mem_mb": plan.mem_mb,
        "runtime_h": round(plan.runtime_s / 3600, 2), "slurm_minutes": plan.runtime_minutes,
        "gpu_hours": round(plan.gpu_hours, 2),
        "micro_batch": plan.micro_batch or "", "grad_accum": plan.grad_accum or "", "sharding": plan.sharding,
        "vllm_util": plan.vllm_gpu_memory_utilization or "", "vllm_max_len": plan.vllm_max_model_len or "",
        "vllm_concurrency": plan.vllm_concurrency or "", "prompt_tokens": j.prompt_tokens,
        "largest_terms": (gm or plan.host_memory).describe(3),
    }


def gpu_hours_by_rule(plans: list[JobPlan]) -> dict[str, float]:
    out: dict[str, float] = {}
    for plan in plans:
        key = f"{plan.job.rule} ({plan.job.method})"
        out[key] = out.get(key, 0.0) + plan.gpu_hours
    return out


def settings_per_model(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Every setting a model's runs or evaluations take other than the grid's block (models.<model>.es / grpo /
    eval, per_task): model, task ("" for all the model's tasks, and for eval), block, key, the model's value and
    the grid's (None where the block has no such key). Empty for a grid without overrides."""
    rows = []
    for model, spec in config["models"].items():
        for block in ("es", "grpo"):
            if block not in config:
                continue
            grid = config[block]["settings"]
            merged = {task: trainer_settings(config, block, model, task) for task in spec["tasks"]}
            keys = dict.fromkeys(k for m in merged.values() for k in m if m[k] != grid.get(k, object()))
            for key in keys:
                values = {task: m[key] for task, m in merged.items()}
                everywhere = len({repr(v) for v in values.values()}) == 1
                for task, value in ([("", next(iter(values.values())))] if everywhere else values.items()):
                    rows.append({"model": model, "task": task, "block": f"{block}.settings", "key": key,
                                 "value": value, "grid": grid.get(key)})
        ev, grid = eval_settings(config, model), config.get("eval") or {}
        rows += [{"model": model, "task": "", "block": "eval", "key": k, "value": v, "grid": grid.get(k)}
                 for k, v in ev.items() if k not in grid or grid[k] != v]
    return rows


def write_plan(plans: list[JobPlan], csv_path: str | Path, md_path: str | Path | None = None,
               prompt_sources: dict[tuple[str, str, str], str] | None = None,
               model_settings: list[dict[str, Any]] | None = None) -> None:
    """plan.csv (every column) and plan.md (the main ones, GPU-hours by rule, where each prompt length came
    from: `PromptTokens.sources`, and the settings a model has of its own: `settings_per_model`)."""
    rows = [plan_row(p) for p in plans]
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    if md_path is None:
        return
    shown = ("rule", "model", "task", "run", "method", "iterations", "gpus", "gpu_mem_gib", "gpu_avail_gib",
             "host_mem_gib", "runtime_h", "gpu_hours")
    lines = ["| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    lines += ["| " + " | ".join(str(r[c]) for c in shown) + " |" for r in rows]
    total = sum(p.gpu_hours for p in plans)
    lines += ["", "| GPU-hours by rule | |", "|---|---|"]
    lines += [f"| {k} | {v:.1f} |" for k, v in sorted(gpu_hours_by_rule(plans).items())]
    lines += [f"| **total** | **{total:.1f}** |", "",
              "Runtimes cost every completion at its max_new_tokens (an upper bound); GPU memory is per GPU; "
              "see esgrpo/plan for every constant."]
    if model_settings:
        lines += ["", "| settings of a model's own | task | setting | value | the grid's |", "|---|---|---|---|---|"]
        lines += [f"| {r['model']} | {r['task'] or 'all'} | {r['block']}.{r['key']} | {r['value']} | {r['grid']} |"
                  for r in model_settings]
    if prompt_sources:
        lines += ["", "| prompt tokens of | model | split | from |", "|---|---|---|---|"]
        lines += [f"| {task} | {model} | {split} | {source} |"
                  for (model, task, split), source in sorted(prompt_sources.items(), key=lambda kv: kv[0][1:] + kv[0][:1])]
    Path(md_path).write_text("\n".join(lines) + "\n")


def total_gpu_hours(plans: list[JobPlan]) -> float:
    return math.fsum(p.gpu_hours for p in plans)


def cost_row(plans: list[JobPlan], target: str) -> str:
    """A target's GPU-hours by kind of job: a row of docs/cluster.md's cost table (target (jobs, GPU) |
    training | evaluation | held-out benchmarks | analyses | total)."""
    def hours(keep) -> float:
        return math.fsum(p.gpu_hours for p in plans if keep(p.job))

    gpu = sorted({p.job.gpu_type for p in plans if p.gpu_memory is not None}) or ["host"]
    training = ", ".join(f"{name} {hours(lambda j, m=method: j.rule == 'train_run' and j.method == m):.1f}"
                         for name, method in (("ES", "es"), ("GRPO", "grpo")))
    return (f"| `{target}` ({len(plans)} jobs, {', '.join(gpu)}) | {training} "
            f"| {hours(lambda j: j.rule in ('eval_base', 'eval_run')):.1f} "
            f"| {hours(lambda j: j.rule.startswith('heldout_')):.1f} "
            f"| {hours(lambda j: j.rule.startswith('analysis_')):.1f} | **{total_gpu_hours(plans):.1f}** |")
