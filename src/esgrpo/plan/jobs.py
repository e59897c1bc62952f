"""One job's plan: from what the job does (JobSpec) to what it needs and gets (JobPlan).

`plan_job(job)` sizes a training, evaluation or comparison job: GPU memory per GPU (by term),
host memory, expected runtime, and the choices that make it fit, taken in this order:

- GRPO on GPUs: the number of GPUs (when the job does not fix it: the fewest of 1, 2, 4, 8 at
  which it fits, sharded with FSDP above one GPU), then, among the micro-batches (divisors of a
  process's completions, at most 32 sequences, as the paper configs' 24-32), the one whose
  step the runtime model finds fastest, vLLM taking the room its activations leave (all of a
  process's completions at once if the cache holds them, else fewer); gradient accumulation
  follows.
- vLLM engines (ES, GRPO, evaluation): max_model_len = prompt + new tokens (never the model's
  full context: Qwen3-4B's 262,144 tokens would need ~36 GiB of KV cache for one sequence), and
  gpu_memory_utilization = what the weights, the activation peak, CUDA graphs and a KV cache
  for the concurrent sequences need, as a share of the device total (vLLM takes ceil(share x
  total), `memory.granted_bytes`), rounded up to a hundredth.

Limits. The plan's own choices (GPUs, micro-batch, vLLM concurrency, a transformers batch) keep
10% of the GPU free (PLAN_HEADROOM). GRPO, and ES on vLLM, whose engine gets what the rest leaves
within that 90%, are refused when even their smallest setting (micro-batch 1, one sequence) needs
more than 90% of the GPU. No vLLM engine is given more than 0.9 of the device total
(VLLM_MAX_UTILIZATION, vLLM's default). An analysis on transformers whose smallest setting (batch 1)
needs between 90% and 100% is still planned: nothing is left to choose. Every plan is then checked,
allocator slack included, against the whole GPU (`check_fits`). A job refused either way raises
`PlanError` naming the job, what it needs and what one GPU has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from esgrpo.plan import host, runtime
from esgrpo.plan.architecture import Architecture, PlanError, dtype_bytes
from esgrpo.plan.gpus import GpuType, gpu_type
from esgrpo.plan.memory import (
    ALLOCATOR_SLACK,
    CUDA_PROCESS_BYTES,
    GIB,
    VLLM_LARGE_GPU_BATCHED_TOKENS,
    VLLM_LARGE_GPU_MAX_SEQS,
    VLLM_MAX_UTILIZATION,
    VLLM_SMALL_GPU_BATCHED_TOKENS,
    VLLM_SMALL_GPU_MAX_SEQS,
    VLLM_TRL_BATCHED_TOKENS,
    Memory,
    autocast_weight_copies,
    es_master_bytes,
    es_update_bytes,
    granted_bytes,
    hf_generation,
    peak,
    population_generation,
    reference_model,
    scoring_forward,
    training_activations,
    training_state,
    utilization_for,
    vllm_engine,
    vllm_sequences_that_fit,
)

METHODS = ("es", "grpo", "eval", "score", "compare")
GPU_COUNTS = (1, 2, 4, 8)
MAX_MICRO_BATCH = 32
# The plan's choices (micro-batch, vLLM concurrency) keep a tenth of the GPU free: every term is an
# estimate until scripts/gpu_smoke.sh has measured it. GRPO and vLLM ES are refused when their
# smallest setting exceeds it; analyses on transformers are planned up to the whole GPU (module docstring).
PLAN_HEADROOM = 0.9
# How GRPO shards its training state over more than one GPU: FSDP, which torch itself provides.
# envs/gpu.yaml has no DeepSpeed (esgrpo.grpo.launch refuses zero3 without it), so the plan never
# chooses ZeRO-3 even where it would shard the same state (GRPOSettings.sharding still allows it).
MULTI_GPU_SHARDING = "fsdp"
# CPU cores per GPU a GPU job asks for (config `plan.cpus_per_gpu`): what the profile set for every GPU
# job before the plan did, and a common share on 8-GPU nodes (64-128 cores per 8 GPUs).
CPUS_PER_GPU = 8
# SLURM time limit: the expected runtime x 1.5, plus 10 minutes (queue-side start, a slow node).
RUNTIME_FACTOR, RUNTIME_EXTRA_MINUTES = 1.5, 10


@dataclass(frozen=True)
class JobSpec:
    """What a job does, in the terms its memory and time depend on.

    method: es | grpo | eval (generate and grade) | score (forward passes of `copies` models over
    sampled continuations: the KL analysis) | compare (`copies` checkpoints side by side on the host).
    prompts: ES prompts per iteration, GRPO prompts per step, evaluation prompts; samples: GRPO
    group size, evaluation samples per prompt (greedy included).
    backend: how it generates, vllm or hf (transformers). gpus None: the plan chooses (GRPO),
    else 1 (ES engines and evaluation take the count they are given). beta: GRPO's KL coefficient;
    above 0 TRL holds a reference model beside the policy (`memory.reference_model`).
    """

    rule: str
    model: str
    task: str
    run: str
    method: str
    architecture: Architecture
    device: str = "cuda"
    gpu_type: str | None = "h200"
    gpus: int | None = None
    backend: str = "vllm"
    weight_dtype: str = "bfloat16"
    iterations: int = 1
    population: int = 0
    prompts: int = 1
    samples: int = 1
    prompt_tokens: int = 256
    new_tokens: int = 256
    checkpointing: bool = True
    micro_batch: int | None = None
    es_population: str = "stacked"
    eval_batch: int = 256
    copies: int = 2
    beta: float = 0.0
    time_limit: int | None = None  # minutes, where the rule asks for a fixed limit (held-out benchmarks)
    es_arithmetic: str = "exact"  # ESConfig.arithmetic: in place, no fp32 master (theta in the weights' dtype)
    # the wildcards of its rule's job, sorted by name: how the rules find its plan (Planner.plan_of)
    wildcards: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.rule} {self.model}/{self.task}/{self.run}"

    @property
    def max_model_len(self) -> int:
        return self.prompt_tokens + self.new_tokens


@dataclass(frozen=True)
class JobPlan:
    job: JobSpec
    gpus: int
    gpu_memory: Memory | None  # per GPU; None on a CPU
    gpu_available: int  # bytes per GPU
    host_memory: Memory
    runtime_s: float
    sharding: str = "none"
    micro_batch: int | None = None
    grad_accum: int | None = None
    vllm_gpu_memory_utilization: float | None = None
    vllm_max_model_len: int | None = None
    vllm_concurrency: int | None = None
    eval_batch: int | None = None
    cpus: int = 1  # a host job's cores (--cpus-per-task): 1, or one per vLLM engine on vLLM's CPU build

    @property
    def fits(self) -> bool:
        return self.gpu_memory is None or self.gpu_memory.total <= self.gpu_available

    @property
    def mem_mb(self) -> int:
        return host.mem_mb(self.host_memory.total)

    @property
    def runtime_minutes(self) -> int:
        """The SLURM time limit for attempt 1."""
        if self.job.time_limit is not None:
            return self.job.time_limit
        return math.ceil(RUNTIME_FACTOR * self.runtime_s / 60 + RUNTIME_EXTRA_MINUTES)

    @property
    def gpu_hours(self) -> float:
        return self.runtime_s * self.gpus / 3600

    def trainer_settings(self) -> dict[str, object]:
        """The plan's choices under the names the trainers and engines take (what the rules pass on).

        GRPO (TRL): gradient_accumulation_steps, vllm_gpu_memory_utilization, vllm_max_model_length,
        activation_checkpointing, num_processes (GPUs, launched with accelerate) and sharding
        (MULTI_GPU_SHARDING, "fsdp", above one GPU). ES and evaluation on vLLM: the engine's
        gpu_memory_utilization, max_model_len (and num_engines for ES). Transformers evaluation on a GPU: batch_size.
        """
        j, out = self.job, {}
        if j.method == "grpo":
            out = {"gradient_accumulation_steps": self.grad_accum, "activation_checkpointing": j.checkpointing,
                   "num_processes": max(1, self.gpus), "sharding": self.sharding}
            if self.vllm_gpu_memory_utilization is not None:
                out.update(vllm_gpu_memory_utilization=self.vllm_gpu_memory_utilization,
                           vllm_max_model_length=self.vllm_max_model_len)
        elif self.vllm_gpu_memory_utilization is not None:
            out = {"gpu_memory_utilization": self.vllm_gpu_memory_utilization, "max_model_len": self.vllm_max_model_len}
            if j.method == "es":
                out["num_engines"] = self.gpus
        elif self.eval_batch is not None:
            out = {"batch_size": self.eval_batch}
        return out

    def applied_to(self, settings: dict[str, Any]) -> dict[str, Any]:
        """`settings` (a run's settings, an ES engine block, an evaluation block) with the plan's choices
        in place of the config's: a vLLM evaluation's go into the block's `engine`, the rest at the top."""
        chosen = self.trainer_settings()
        if self.job.method in ("eval", "score") and self.vllm_gpu_memory_utilization is not None:
            return {**settings, "engine": {**(settings.get("engine") or {}), **chosen}}
        return {**settings, **chosen}

    def resources(self, cpus_per_gpu: int = CPUS_PER_GPU) -> dict[str, object]:
        """What the rule's `threads:` and `resources:` take: mem_mb, runtime (minutes), gpu, gpu_model, and the
        CPUs the job asks for: `cpus_per_gpu` per GPU (vLLM engine processes, Ray, tokenisation; the SLURM
        plugin submits --cpus-per-gpu), threads = all of them; a job on the host 1 (one torch thread per job:
        more threads than a job's cores thrash, docs/references.md; the plugin submits --cpus-per-task=1)."""
        gpu = self.gpus if self.gpu_memory is not None else 0
        return {"mem_mb": self.mem_mb, "runtime": self.runtime_minutes, "gpu": gpu,
                "gpu_model": (self.job.gpu_type or "") if gpu else "",
                "threads": gpu * cpus_per_gpu if gpu else self.cpus, "cpus_per_gpu": cpus_per_gpu if gpu else 0}


def check_fits(plan: JobPlan) -> JobPlan:
    """`plan`, or PlanError naming the job, what it needs per GPU and what the GPU has."""
    if not plan.fits:
        need, have = plan.gpu_memory.total / GIB, plan.gpu_available / GIB
        raise PlanError(f"{plan.job.label}: needs {need:.1f} GiB per GPU on {plan.gpus} x {plan.job.gpu_type} "
                        f"({plan.gpu_memory.describe()}), but one {plan.job.gpu_type} has {have:.1f} GiB. "
                        f"Give it more GPUs (GRPO shards with FSDP), a larger GPU type, or smaller settings.")
    return plan


def plan_job(job: JobSpec) -> JobPlan:
    """The plan of `job`; PlanError when no setting the plan may choose makes it fit."""
    if job.method not in METHODS:
        raise PlanError(f"{job.label}: method {job.method!r}; the plan knows {METHODS}")
    if job.device == "cpu" or job.method == "compare":  # on the host only
        return _limited(_plan_cpu(job))
    gpu = gpu_type(job.gpu_type or "")
    if job.method == "es":
        plan = _plan_es_vllm(job, gpu) if job.backend == "vllm" else _plan_es_hf_gpu(job, gpu)
    elif job.method == "grpo":
        plan = _plan_grpo_gpu(job, gpu)
    elif job.method == "eval":
        plan = _plan_eval_vllm(job, gpu) if job.backend == "vllm" else _plan_eval_hf_gpu(job, gpu)
    else:
        plan = _plan_score_gpu(job, gpu)
    return check_fits(_limited(plan))


def _limited(plan: JobPlan) -> JobPlan:
    """A job with a fixed time limit: its GPUs held for all of it (an upper bound of its GPU-hours)."""
    return plan if plan.job.time_limit is None else replace(plan, runtime_s=60.0 * plan.job.time_limit)


# --------------------------------------------------------------------------- shared pieces


def _with_slack(parts: dict[str, int], cuda_process: bool = True) -> Memory:
    """A GPU's terms plus the CUDA process and the allocator's fragmentation."""
    out = dict(parts)
    out["allocator fragmentation"] = int(ALLOCATOR_SLACK * sum(parts.values()))
    if cuda_process:
        out["CUDA context and workspaces"] = CUDA_PROCESS_BYTES
    return Memory(out)


def _vllm_defaults(gpu: GpuType) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) a plain vllm.LLM takes on this GPU (memory.py)."""
    if gpu.memory_gib >= 70 and not gpu.name.startswith("a100"):
        return VLLM_LARGE_GPU_BATCHED_TOKENS, VLLM_LARGE_GPU_MAX_SEQS
    return VLLM_SMALL_GPU_BATCHED_TOKENS, VLLM_SMALL_GPU_MAX_SEQS


def _vllm_choice(job: JobSpec, gpu: GpuType, wanted: int, budget: int,
                 batched_tokens: int) -> tuple[dict[str, int], int, float]:
    """(engine terms, concurrent sequences, gpu_memory_utilization) of an engine that runs up to
    `wanted` sequences at once within `budget` bytes (and vLLM's 0.9), or PlanError."""
    arch, dtype, length = job.architecture, job.weight_dtype, job.max_model_len
    budget = min(budget, int(VLLM_MAX_UTILIZATION * gpu.total_bytes))
    concurrent = min(wanted, vllm_sequences_that_fit(arch, dtype, length, budget, batched_tokens))
    if concurrent < 1:
        need = sum(vllm_engine(arch, dtype, length, 1, batched_tokens).values())
        raise PlanError(f"{job.label}: a vLLM engine for one sequence of {length} tokens needs "
                        f"{need / GIB:.1f} GiB, but only {budget / GIB:.1f} GiB of one {gpu.name} is left for it")
    parts = vllm_engine(arch, dtype, length, concurrent, batched_tokens)
    return parts, concurrent, utilization_for(sum(parts.values()), gpu.total_bytes)


# --------------------------------------------------------------------------- ES


def _plan_es_vllm(job: JobSpec, gpu: GpuType) -> JobPlan:
    """ES with one vLLM engine per GPU (`esgrpo.es.vllm_backend`): the engine, the fp32 master beside it."""
    arch, engines = job.architecture, job.gpus or 1
    batched, max_seqs = _vllm_defaults(gpu)
    beside = {"ES fp32 master": es_master_bytes(arch),
              "ES perturb / update / distance of one tensor": es_update_bytes(arch, "vllm")}
    if job.es_arithmetic != "exact":  # in place: the live weights are theta (one tensor's update is fp32 still)
        del beside["ES fp32 master"]
    # The engine's concurrency is chosen within the plan's headroom, as GRPO's: the allocator slack
    # counted on top of it must not push a job that could run fewer sequences over the GPU.
    left = int(PLAN_HEADROOM * gpu.memory_bytes) - int((1 + ALLOCATOR_SLACK) * sum(beside.values()))
    engine, concurrent, util = _vllm_choice(job, gpu, min(job.prompts, max_seqs), left, batched)
    granted = granted_bytes(util, gpu.total_bytes)
    memory = _with_slack({**engine, "vLLM budget rounding": granted - sum(engine.values()), **beside},
                         cuda_process=False)  # vLLM counts its process's CUDA memory in its budget
    seconds = runtime.start_seconds(arch) + job.iterations * runtime.es_iteration_seconds(
        arch, gpu, job.population, engines, job.prompts, concurrent, job.prompt_tokens, job.new_tokens)
    host_memory = peak(host.gpu_job_host(arch, "es", processes=1, engines=engines))
    return JobPlan(job, engines, memory, gpu.memory_bytes, host_memory, seconds,
                   vllm_gpu_memory_utilization=util, vllm_max_model_len=job.max_model_len,
                   vllm_concurrency=concurrent)


def _es_hf_parts(job: JobSpec) -> dict[str, int]:
    """ES on the transformers backend: model, theta0 and theta, the population's generation."""
    arch, width = job.architecture, dtype_bytes(job.weight_dtype)
    members = job.population if job.es_population == "stacked" else 1
    theta = ("theta0 and theta (fp32)", 8) if job.es_arithmetic == "exact" else \
        (f"theta0 and theta ({job.weight_dtype}, in place)", 2 * width)
    return {"model weights": arch.parameters * width, theta[0]: theta[1] * arch.parameters,
            **population_generation(arch, members, job.prompts, job.prompt_tokens, job.new_tokens)}


def _plan_es_hf_gpu(job: JobSpec, gpu: GpuType) -> JobPlan:
    arch = job.architecture
    memory = _with_slack(_es_hf_parts(job))
    tokens = job.population * job.prompts
    # The population engine (fp32, a Python loop per token, no CUDA graphs) is costed as transformers
    # generate: HF_GENERATE_SLOWDOWN over vLLM at the same batch.
    seconds = job.iterations * runtime.HF_GENERATE_SLOWDOWN * runtime.batched_decode_seconds(
        arch, gpu, tokens, tokens if job.es_population == "stacked" else job.prompts, job.prompt_tokens,
        job.new_tokens)
    return JobPlan(job, 1, memory, gpu.memory_bytes, peak(host.es_gpu_hf_host(arch, job.weight_dtype)), seconds)


# --------------------------------------------------------------------------- GRPO


def _sharding(gpus: int) -> str:
    return MULTI_GPU_SHARDING if gpus > 1 else "none"


def _divisors_down(n: int, cap: int) -> list[int]:
    return [d for d in range(min(n, cap), 0, -1) if n % d == 0]


def _grpo_train_parts(job: JobSpec, gpus: int, sharding: str, micro: int) -> dict[str, int]:
    """The training process's terms at its peak, the larger of its two phases:

    - training: the training state and one micro-batch's activations (bf16 autocast; the residual
      stream is fp32 over an fp32 model and under FSDP, counted as fp32 there; bf16 over ZeRO-3's bf16
      parameters), and on one GPU autocast's bf16 weight copies at the forward's end;
    - scoring: TRL's no-grad log-prob forwards over the step's completions, one micro-batch at a time:
      the importance-sampling forward of the policy (with vLLM: `vllm_importance_sampling_correction`,
      on by default in TRL 1.16) and, with beta > 0, the reference model's, which adds its gathered
      parameters under FSDP.
    The reference model of beta > 0 stays on the GPU through both (`memory.reference_model`).
    """
    arch = job.architecture
    residual = 2 if sharding == "zero3" else 4
    state = training_state(arch, gpus, sharding)
    reference, reference_forward = reference_model(arch, gpus, sharding) if job.beta > 0 else ({}, {})
    cache = autocast_weight_copies(arch, sharding)
    train = {**state, **reference,
             **training_activations(arch, micro, job.max_model_len, checkpointing=job.checkpointing,
                                    act_bytes=2, residual_bytes=residual, scores=False), **cache}
    forward = scoring_forward(arch, micro, job.max_model_len)
    scoring = {**state, **reference, **forward, **max(cache, reference_forward, key=lambda d: sum(d.values()))}
    return max(train, scoring, key=lambda parts: sum(parts.values()))


def _grpo_generate_parts(job: JobSpec, gpus: int, sharding: str, sequences: int) -> dict[str, int]:
    """transformers generate inside the training process (no vLLM): the state, the reference model of
    beta > 0, autocast's weight copies and generate's working set for `sequences` at once."""
    arch = job.architecture
    reference = reference_model(arch, gpus, sharding)[0] if job.beta > 0 else {}
    return {**training_state(arch, gpus, sharding), **reference, "autocast bf16 weight copies": 2 * arch.parameters,
            **hf_generation(arch, sequences, job.prompt_tokens, job.new_tokens, 2)}


def _grpo_candidate(job: JobSpec, gpu: GpuType, gpus: int, micro: int) -> tuple[Memory, float | None, int] | None:
    """(memory per GPU, vLLM utilization, concurrent sequences) at micro-batch `micro`: vLLM gets
    what the training process leaves (within the plan's headroom); None if not even one sequence fits."""
    sharding = _sharding(gpus)
    per_process = job.prompts * job.samples // gpus
    train = _grpo_train_parts(job, gpus, sharding, micro)
    if job.backend != "vllm":  # transformers generate in the training process (the GPU smoke script)
        gen = _grpo_generate_parts(job, gpus, sharding, per_process)
        memory = max((_with_slack(train), _with_slack(gen)), key=lambda m: m.total)
        return (memory, None, per_process) if memory.total <= PLAN_HEADROOM * gpu.memory_bytes else None
    left = int(PLAN_HEADROOM * gpu.memory_bytes - (1 + ALLOCATOR_SLACK) * sum(train.values()) - CUDA_PROCESS_BYTES)
    try:
        engine, concurrent, util = _vllm_choice(job, gpu, per_process, left, VLLM_TRL_BATCHED_TOKENS)
    except PlanError:
        return None
    granted = granted_bytes(util, gpu.total_bytes)
    return _with_slack({**train, **engine, "vLLM budget rounding": granted - sum(engine.values())}), util, concurrent


def _grpo_fit(job: JobSpec, gpu: GpuType, gpus: int) -> JobPlan | None:
    """The fastest plan at `gpus` GPUs over the micro-batches (and the vLLM concurrency each leaves
    room for), by the runtime model; None if nothing fits."""
    completions = job.prompts * job.samples
    if completions % gpus:
        return None
    per_process = completions // gpus
    best: JobPlan | None = None
    for micro in [job.micro_batch] if job.micro_batch else _divisors_down(per_process, MAX_MICRO_BATCH):
        found = _grpo_candidate(job, gpu, gpus, micro)
        if found is None:
            continue
        plan = _grpo_plan(job, gpu, gpus, _sharding(gpus), micro, *found)
        if best is None or plan.runtime_s < best.runtime_s:
            best = plan
    return best


def _grpo_plan(job: JobSpec, gpu: GpuType, gpus: int, sharding: str, micro: int, memory: Memory,
               util: float | None, concurrent: int) -> JobPlan:
    arch = job.architecture
    completions = job.prompts * job.samples
    step = runtime.grpo_step_seconds(arch, gpu, gpus=gpus, completions=completions, concurrent=concurrent,
                                     prompt=job.prompt_tokens, new=job.new_tokens, micro_batch=micro,
                                     checkpointing=job.checkpointing, sharded=sharding != "none",
                                     vllm=job.backend == "vllm", reference=job.beta > 0)
    host_memory = peak(host.gpu_job_host(arch, "grpo", processes=gpus, engines=0, reference=job.beta > 0,
                                         sharded=sharding != "none"))
    return JobPlan(job, gpus, memory, gpu.memory_bytes, host_memory,
                   runtime.start_seconds(arch) + job.iterations * step, sharding=sharding, micro_batch=micro,
                   grad_accum=completions // (gpus * micro), vllm_gpu_memory_utilization=util,
                   vllm_max_model_len=job.max_model_len if util is not None else None,
                   vllm_concurrency=concurrent)


def _plan_grpo_gpu(job: JobSpec, gpu: GpuType) -> JobPlan:
    counts = [job.gpus] if job.gpus else list(GPU_COUNTS)
    for gpus in counts:
        plan = _grpo_fit(job, gpu, gpus)
        if plan is not None:
            return plan
    raise PlanError(_grpo_misfit(job, gpu, counts[-1]))


def _grpo_misfit(job: JobSpec, gpu: GpuType, gpus: int) -> str:
    """What the smallest setting (micro-batch 1, one vLLM sequence) needs at `gpus` GPUs, for the error."""
    arch, sharding = job.architecture, _sharding(gpus)
    parts = _grpo_train_parts(job, gpus, sharding, job.micro_batch or 1)
    if job.backend == "vllm":
        parts.update(vllm_engine(arch, job.weight_dtype, job.max_model_len, 1, VLLM_TRL_BATCHED_TOKENS))
    else:
        gen = _grpo_generate_parts(job, gpus, sharding, max(1, job.prompts * job.samples // gpus))
        parts = max((parts, gen), key=lambda p: sum(p.values()))
    memory = _with_slack(parts)
    return (f"{job.label}: needs {memory.gib:.1f} GiB per GPU on {gpus} x {gpu.name} even at micro-batch 1 "
            f"({memory.describe()}), but one {gpu.name} has {gpu.memory_gib:.1f} GiB, of which the plan fills at "
            f"most {PLAN_HEADROOM:.0%}. Give it more GPUs (GRPO shards with FSDP), a larger GPU type, or "
            f"fewer completions or tokens per step.")


# --------------------------------------------------------------------------- evaluation


def _plan_eval_vllm(job: JobSpec, gpu: GpuType) -> JobPlan:
    """One vLLM engine generating prompts x samples (esgrpo.engines.vllm_engine)."""
    arch = job.architecture
    batched, max_seqs = _vllm_defaults(gpu)
    total = job.prompts * job.samples
    engine, concurrent, util = _vllm_choice(job, gpu, min(total, max_seqs), gpu.memory_bytes, batched)
    granted = granted_bytes(util, gpu.total_bytes)
    memory = _with_slack({**engine, "vLLM budget rounding": granted - sum(engine.values())}, cuda_process=False)
    seconds = runtime.start_seconds(arch) + runtime.batched_decode_seconds(
        arch, gpu, total, concurrent, job.prompt_tokens, job.new_tokens)
    return JobPlan(job, 1, memory, gpu.memory_bytes, peak(host.gpu_job_host(arch, "eval", processes=1, engines=1)),
                   seconds, vllm_gpu_memory_utilization=util, vllm_max_model_len=job.max_model_len,
                   vllm_concurrency=concurrent)


def _hf_eval_parts(job: JobSpec, batch: int) -> dict[str, int]:
    """`esgrpo.engines.rollout.HFEngine` on a GPU: the model, generate's working set, and the per-step fp32
    logits generate keeps for the entropies (output_logits) until the batch ends."""
    arch = job.architecture
    width = dtype_bytes(job.weight_dtype)
    return {"model weights": arch.parameters * width,
            **hf_generation(arch, batch, job.prompt_tokens, job.new_tokens, width),
            "kept logits (output_logits)": batch * job.new_tokens * arch.vocab_size * 4}


def _analysis_host(job: JobSpec) -> Memory:
    """An analysis job's host side: the process, and `copies` fp32 models (base, run, deltas)."""
    return peak({"analysis": {"process (Python, torch, CUDA)": host.PROCESS_BASE["eval"] + host.CUDA_LIBRARIES_BYTES,
                              f"{job.copies} fp32 copies of the model": job.copies * 4 * job.architecture.parameters}})


def _plan_eval_hf_gpu(job: JobSpec, gpu: GpuType) -> JobPlan:
    """Generation with transformers on one GPU (the sparsity and interpolation analyses, which
    swap weights in place): the largest batch, halving from the configured one, that fits."""
    arch, total = job.architecture, job.prompts * job.samples
    batch = max(1, min(job.eval_batch, total))
    memory = _with_slack(_hf_eval_parts(job, batch))
    while batch > 1 and memory.total > PLAN_HEADROOM * gpu.memory_bytes:
        batch //= 2
        memory = _with_slack(_hf_eval_parts(job, batch))
    seconds = runtime.start_seconds(arch) + runtime.batched_decode_seconds(
        arch, gpu, total, batch, job.prompt_tokens, job.new_tokens) * runtime.HF_GENERATE_SLOWDOWN
    return JobPlan(job, 1, memory, gpu.memory_bytes, _analysis_host(job), seconds, eval_batch=batch)


def _plan_score_gpu(job: JobSpec, gpu: GpuType) -> JobPlan:
    """Forward passes of `copies` models over `prompts x samples` sampled sequences (the KL analysis):
    each forward keeps its full [batch, tokens, vocab] fp32 logits and log-softmax."""
    arch, width = job.architecture, dtype_bytes(job.weight_dtype)
    batch, tokens = max(1, job.eval_batch), job.max_model_len
    forward = hf_generation(arch, batch, tokens, 0, width)["prefill (one layer)"]
    memory = _with_slack({"model weights": job.copies * arch.parameters * width,
                          "logits and log-softmax (fp32)": job.copies * 2 * batch * tokens * arch.vocab_size * 4,
                          "forward (one layer)": forward})
    sequences = job.prompts * job.samples
    seconds = runtime.start_seconds(arch) + job.copies * 2 * arch.parameters * sequences * tokens / (
        runtime.MATMUL_SHARE * gpu.bf16_tflops * 1e12)
    return JobPlan(job, 1, memory, gpu.memory_bytes, _analysis_host(job), seconds, eval_batch=batch)


# --------------------------------------------------------------------------- CPU


def _plan_vllm_cpu(job: JobSpec) -> JobPlan:
    """A job whose vLLM engines run on this host (plan.gpu_type: cpu, vLLM's CPU build): ES gets a core per
    engine (`esgrpo.es.vllm_backend.cpu_engine_options` splits the job's cores), the rest one core."""
    arch, new = job.architecture, job.new_tokens
    engines = (job.gpus or 1) if job.method == "es" else 1
    start = engines * runtime.START_SECONDS + (0.0 if job.method == "es" else runtime.VLLM_CPU_COMPILE_SECONDS)
    if job.method == "es":
        phases = host.vllm_cpu(arch, "es", engines=engines, weight_dtype=job.weight_dtype,
                               in_place=job.es_arithmetic != "exact")
        seconds = start + job.iterations * runtime.cpu_generation_seconds(arch, job.population * job.prompts, new) / engines
        return JobPlan(job, engines, None, 0, peak(phases), seconds, cpus=engines)
    if job.method == "grpo":
        completions = job.prompts * job.samples
        micro = job.micro_batch or completions
        phases = host.vllm_cpu(arch, "grpo", engines=1, weight_dtype=job.weight_dtype, train_micro_batch=micro,
                               prompt=job.prompt_tokens, new=new)
        step = (runtime.cpu_generation_seconds(arch, completions, new)
                + runtime.cpu_training_seconds(arch, completions * job.max_model_len))
        return JobPlan(job, 0, None, 0, peak(phases), start + job.iterations * step, micro_batch=micro,
                       grad_accum=completions // micro)
    phases = host.vllm_cpu(arch, "eval", engines=1, weight_dtype=job.weight_dtype)
    return JobPlan(job, 0, None, 0, peak(phases), start + runtime.cpu_generation_seconds(arch, job.prompts * job.samples, new))


def _plan_cpu(job: JobSpec) -> JobPlan:
    """Jobs that run on the CPU: everything is host memory (the phases of esgrpo.plan.host)."""
    arch, new = job.architecture, job.new_tokens
    if job.backend == "vllm" and job.method in ("es", "grpo", "eval"):
        return _plan_vllm_cpu(job)
    if job.method == "es":
        phases = host.es_cpu(arch, members=job.population, prompts=job.prompts, prompt=job.prompt_tokens,
                             new=new, weight_dtype=job.weight_dtype, in_place=job.es_arithmetic != "exact")
        seconds = job.iterations * runtime.cpu_generation_seconds(arch, job.population * job.prompts, new)
        return JobPlan(job, 0, None, 0, peak(phases), seconds)
    if job.method == "grpo":
        completions = job.prompts * job.samples
        micro = job.micro_batch or completions
        phases = host.grpo_cpu(arch, completions=completions, micro_batch=micro, prompt=job.prompt_tokens, new=new)
        step = (runtime.cpu_generation_seconds(arch, completions, new)
                + runtime.cpu_training_seconds(arch, completions * job.max_model_len))
        return JobPlan(job, 0, None, 0, peak(phases), job.iterations * step, micro_batch=micro,
                       grad_accum=completions // micro)
    if job.method == "eval":
        batch = min(job.eval_batch, job.prompts * job.samples)
        phases = host.eval_cpu(arch, batch=batch, prompt=job.prompt_tokens, new=new, weight_dtype=job.weight_dtype)
        if job.rule in ("analysis_sparsity", "analysis_interpolation"):
            # the checkpoints and deltas it combines, beside the evaluator's model: planned without them, the
            # rehearsal's sparsity job used twice its plan (docs/rehearsal.md, "Fixed by the first run")
            phases["generate"].update(host.analysis_held(arch, job.rule))
        seconds = runtime.cpu_generation_seconds(arch, job.prompts * job.samples, new)
        return JobPlan(job, 0, None, 0, peak(phases), seconds)
    if job.method == "score":  # forward passes only: 2 x parameters FLOPs a token
        # each model's [batch, tokens, vocab] fp32 logits and their log-softmax, as on a GPU: the models alone
        # left the rehearsal's KL jobs above their plan (docs/rehearsal.md, fix 11)
        batch = max(1, min(job.eval_batch, job.prompts * job.samples))
        phases = host.compare_cpu(arch, job.copies)
        phases["compare"]["logits and log-softmax (fp32)"] = job.copies * 2 * batch * job.max_model_len * arch.vocab_size * 4
        tokens = job.prompts * job.samples * job.max_model_len
        return JobPlan(job, 0, None, 0, peak(phases), job.copies * 2 * arch.parameters * tokens / runtime.CPU_FLOPS)
    # compare: drift reads `copies` fp32 checkpoints; cosine holds `copies` runs' deltas beside the base
    phases = host.cosine_cpu(arch, job.copies) if job.rule == "analysis_cosine" else host.compare_cpu(arch, job.copies)
    seconds = runtime.START_SECONDS + job.copies * 4 * arch.parameters / runtime.LOAD_BYTES_PER_S
    return JobPlan(job, 0, None, 0, peak(phases), seconds)
