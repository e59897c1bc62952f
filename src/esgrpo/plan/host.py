"""Host memory (RSS) of a job, phase by phase: what `mem_mb` must cover.

The CPU terms (transformers backend, no vLLM) are checked against measured peaks by
`benchmarks/plan_memory.py` and `tests/plan/test_host.py`; the GPU-job terms (CUDA libraries, vLLM
processes, host copies next to GPU training) are estimates until run on a GPU node.
"""

from __future__ import annotations

from esgrpo.analysis.settings import delta_bytes_per_parameter
from esgrpo.plan.architecture import Architecture, dtype_bytes
from esgrpo.plan.memory import (
    GIB,
    MIB,
    es_update_bytes,
    hf_generation,
    population_generation,
    population_kept,
    training_activations,
)

# Resident memory of a trainer process before it loads a model: Python, torch, transformers and the
# project's modules. Measured on this project's CPU machines (torch 2.13 CPU, transformers 5.24,
# TRL 1.16) as the peak RSS of importing what each job imports (`benchmarks/plan_memory.py
# --imports`): ES 516 MB, GRPO (with TRL's GRPOTrainer) 550 MB, evaluation 516 MB. TRL's trainer
# set-up adds ~2 MB more (measured on the tiny model); the comparison analyses import as evaluation does.
PROCESS_BASE = {"es": 516 * 10**6, "grpo": 550 * 10**6, "eval": 516 * 10**6, "compare": 516 * 10**6}
# A job that reads metrics files only (the norm-theory analysis: pandas, no torch): its script's peak PSS
# in the rehearsal grid's Snakemake benchmark files, 53-80 MiB over nine jobs (docs/rehearsal.md).
METRICS_PROCESS_BYTES = 72 * 2**20
# A process that initialises CUDA maps the CUDA, cuBLAS and cuDNN libraries: ~1.5-2 GiB of RSS
# (estimate; the GPU smoke script prints it).
CUDA_LIBRARIES_BYTES = 2 * GIB
# One vLLM engine's host processes (the V1 front end and its EngineCore, each with torch and CUDA
# loaded; with Ray a worker as well): estimate.
VLLM_ENGINE_PROCESS_BYTES = 4 * GIB


# vLLM's CPU build (`make vllm-env`; plan.gpu_type: cpu). One engine's processes before its model: the
# front end and its EngineCore process, each with torch and vLLM imported (a Ray worker, for ES, in place
# of the front end): estimate, checked by the rehearsal grid (docs/rehearsal.md, scripts/plan_vs_measured.py).
VLLM_CPU_ENGINE_PROCESS_BYTES = int(1.5 * GIB)
# The KV cache each engine allocates on the CPU build (esgrpo.engines.vllm_engine.CPU_KV_CACHE_GIB, 1 GiB).
VLLM_CPU_KV_CACHE_BYTES = 1 * GIB
# Ray's own processes on the ES job's node (GCS, raylet, dashboard agents): estimate, as above.
RAY_PROCESSES_BYTES = 1 * GIB


def vllm_cpu(arch: Architecture, method: str, *, engines: int, weight_dtype: str,
             train_micro_batch: int = 0, prompt: int = 0, new: int = 0,
             in_place: bool = False) -> dict[str, dict[str, int]]:
    """Host memory of a job whose vLLM engines run on this host (vLLM's CPU build): each engine holds its
    processes, its weights in `weight_dtype` and its KV cache. es: the driver's fp32 master and export beside
    `engines` engines on Ray (`esgrpo.es.vllm_backend`); grpo: TRL's CPU training state (`grpo_cpu`, one
    micro-batch) beside its colocated engine; eval: one engine and the weights being loaded. in_place: ES with
    a paper's arithmetic (`esgrpo.es.arithmetic`), no master, theta0 and the weights before an iteration's
    members (what the update's step agreement is counted from) in the weights' dtype."""
    p = arch.parameters
    engine = {"vLLM engine processes": engines * VLLM_CPU_ENGINE_PROCESS_BYTES,
              f"engine weights ({weight_dtype})": engines * p * dtype_bytes(weight_dtype),
              "engine KV cache": engines * VLLM_CPU_KV_CACHE_BYTES}
    if method == "es":
        # Every engine's worker holds the fp32 master theta and, beside vLLM's packed copy of each linear
        # layer, the live weights the perturbations are written into (ESWorkerExtension._es_unpack_cpu_linears);
        # engine 0 keeps theta0 on the host. Exports and checkpoints stream tensor by tensor.
        return {"train": {"driver process": PROCESS_BASE["es"], "Ray processes": RAY_PROCESSES_BYTES, **engine,
                          f"live weights beside the packed ones ({weight_dtype})": engines * p * dtype_bytes(weight_dtype),
                          **({"theta0 (engine 0, in the weights' dtype)": p * dtype_bytes(weight_dtype),
                              "the weights at the iteration's start (step agreement, in their dtype)":
                                  p * dtype_bytes(weight_dtype)} if in_place
                             else {"fp32 master theta (one per engine)": engines * 4 * p,
                                   "theta0 (engine 0, fp32)": 4 * p})}}
    if method == "grpo":
        phases = grpo_cpu(arch, completions=train_micro_batch, micro_batch=train_micro_batch, prompt=prompt, new=new)
        return {name: {**terms, **engine} for name, terms in phases.items() if name != "generate"}
    return {"generate": {"process (Python, torch, vLLM)": PROCESS_BASE["eval"], **engine,
                         "weights being loaded": 4 * p}}


def es_cpu(arch: Architecture, *, members: int, prompts: int, prompt: int, new: int,
           weight_dtype: str = "float32", in_place: bool = False) -> dict[str, dict[str, int]]:
    """Phases of `esgrpo.es.loop.train_es` on the transformers backend, everything in host memory.

    `esgrpo.es.hf_backend.HFESBackend` keeps the model, the fp32 starting point theta0 and the fp32
    master theta (two clones); an iteration adds the population (`memory.population_generation`), whose
    buffers stay through the update (`memory.population_kept`: the next iteration reuses them); the update
    (`esgrpo.es.ops.apply_update`) and the distance from theta0 work one tensor at a time
    (`memory.es_update_bytes`). Loading maps the checkpoint file while the model is built. In place (a paper's
    arithmetic, `esgrpo.es.arithmetic`) theta0 and theta are copies in the weights' dtype, not fp32.
    """
    p = arch.parameters
    width = dtype_bytes(weight_dtype)
    thetas = f"theta0 and theta ({weight_dtype if in_place else 'fp32'})"
    base = {"process (Python, torch, transformers)": PROCESS_BASE["es"], "model weights": p * width,
            thetas: 2 * p * (width if in_place else 4)}
    return {
        "load": {**{k: v for k, v in base.items() if k != thetas},
                 "checkpoint file (mapped)": p * 4},
        "generate": {**base, **population_generation(arch, members, prompts, prompt, new)},
        "update": {**base, **population_kept(arch, members, prompts, prompt, new),
                   "update or distance of one tensor": es_update_bytes(arch, "hf")},
    }


def grpo_cpu(arch: Architecture, *, completions: int, micro_batch: int, prompt: int,
             new: int) -> dict[str, dict[str, int]]:
    """Phases of `esgrpo.grpo.trainer.train_grpo` (TRL, fp32, no checkpointing, as it runs on a CPU).

    Steady state (from the second step on): the model, AdamW's two moments (allocated at the
    first optimiser step), and the metrics callback's fp32 theta0 copy; generation adds
    transformers' generate over all the step's completions at once (TRL's generation batch);
    the backward adds the gradients and one micro-batch's activations (with scores: CPU
    attention keeps its probabilities); the optimiser step adds the callback's pre-step copy.
    transformers 5 trains with torch's fused AdamW (`adamw_torch_fused`, its default from torch
    2.8 on: transformers/training_args.py), which updates in place without temporaries.
    """
    p = arch.parameters
    steady = {"process (Python, torch, TRL)": PROCESS_BASE["grpo"],
              "model weights (fp32)": 4 * p, "AdamW moments (fp32)": 8 * p, "callback theta0 (fp32)": 4 * p}
    activations = training_activations(arch, micro_batch, prompt + new, checkpointing=False, act_bytes=4,
                                       residual_bytes=4, scores=True, triton=False)
    return {
        "load": {"process (Python, torch, TRL)": PROCESS_BASE["grpo"], "model weights (fp32)": 4 * p,
                 "checkpoint file (mapped)": 4 * p},
        "generate": {**steady, **hf_generation(arch, completions, prompt, new, 4)},
        "backward": {**steady, "gradients (fp32)": 4 * p, **activations},
        "optimizer": {**steady, "gradients (fp32)": 4 * p, "callback pre-step copy (fp32)": 4 * p},
    }


def eval_cpu(arch: Architecture, *, batch: int, prompt: int, new: int, weight_dtype: str) -> dict[str, dict[str, int]]:
    """`esgrpo.engines.rollout.HFEngine`: generate with output_logits keeps every step's [batch, vocab] fp32
    logits (for the entropies) until the batch ends."""
    width = dtype_bytes(weight_dtype)
    return {"generate": {"process (Python, torch, transformers)": PROCESS_BASE["eval"],
                         "model weights": arch.parameters * width,
                         **hf_generation(arch, batch, prompt, new, width),
                         "kept logits (output_logits)": batch * new * arch.vocab_size * 4}}


def compare_cpu(arch: Architecture, copies: int) -> dict[str, dict[str, int]]:
    """Analyses that compare checkpoints (drift, cosine): `copies` fp32 models side by side; with no copies
    (the norm theory) a process that reads metrics files only."""
    if copies == 0:
        return {"compare": {"process (Python, pandas; no model)": METRICS_PROCESS_BYTES}}
    return {"compare": {"process (Python, torch, transformers)": PROCESS_BASE["compare"],
                        f"{copies} fp32 copies of the model": copies * 4 * arch.parameters}}


def analysis_held(arch: Architecture, rule: str) -> dict[str, int]:
    """What the sparsity and interpolation analyses hold beside their evaluator's model
    (`esgrpo.workflow.stages.analysis`): sparsity the base, the run, one sparsified point and the run's delta
    (float64 to DELTA_F64_LIMIT parameters); interpolation the base, one point, and the ES, GRPO and random
    directions as deltas. Planned as 3 and 5 fp32 copies before: the rehearsal measured the sparsity jobs above
    that (4.06-4.16 GiB PSS against 3.4), the interpolation jobs below (5.2-6.2 against 7.9, whose evaluation
    batch counted every point at once)."""
    p = arch.parameters
    delta = delta_bytes_per_parameter(p)
    if rule == "analysis_sparsity":
        return {"base, run and the sparsified point (fp32)": 3 * 4 * p, f"the run's delta ({delta * 8}-bit)": delta * p}
    return {"base and the point evaluated (fp32)": 2 * 4 * p,
            f"ES, GRPO and random directions ({delta * 8}-bit)": 3 * delta * p}


def cosine_cpu(arch: Architecture, runs: int) -> dict[str, dict[str, int]]:
    """The cosine analysis (`esgrpo.workflow.stages.analysis.cosine_stage`): the base (fp32), each run's delta
    from it (float64 up to DELTA_F64_LIMIT parameters, float32 above) kept for every pair, and the run being loaded.
    Planned as 4 fp32 copies before: 2.5 GiB against 3.81 GiB PSS measured (two float64 deltas, SmolLM2)."""
    p = arch.parameters
    delta = delta_bytes_per_parameter(p)
    return {"compare": {"process (Python, torch, transformers)": PROCESS_BASE["compare"], "base (fp32)": 4 * p,
                        "run being loaded (fp32)": 4 * p, f"{runs} deltas ({delta * 8}-bit)": runs * delta * p}}


def gpu_job_host(arch: Architecture, method: str, *, processes: int, engines: int, reference: bool = False,
                 sharded: bool = False) -> dict[str, dict[str, int]]:
    """Host memory of a GPU job (estimates: nothing here was measured on a GPU node).

    grpo: every training process loads the fp32 model on the host before it moves to its GPU or
    is sharded (`esgrpo.grpo.distributed.load_policy`); rank 0 keeps the metrics callback's two fp32
    copies (theta0 and the pre-step copy, `esgrpo.grpo.distributed.host_copy`) and assembles the fp32
    export. With `reference` (beta > 0) TRL loads its reference model on the host too (in the policy's
    fp32, `from_pretrained` without a device map) before `prepare` moves or shards it: beside each
    process's own policy when `sharded` (the policy waits on the host for FSDP), after it otherwise.
    es (vLLM): one host fp32 master per job (issue 12, item 4), the vLLM engine processes,
    the fp32 state dict of an export. eval: the engine's processes and the weights being loaded.
    """
    p = arch.parameters
    cuda_process = PROCESS_BASE.get(method, PROCESS_BASE["eval"]) + CUDA_LIBRARIES_BYTES
    if method == "grpo":
        load = {"processes (Python, torch, CUDA)": processes * cuda_process,
                "fp32 model being loaded (per process)": processes * 4 * p}
        if reference and sharded:
            load["reference model being loaded (fp32, per process)"] = processes * 4 * p
        return {
            "load": load,
            "train": {"processes (Python, torch, CUDA)": processes * cuda_process,
                      "callback theta0 + pre-step copies (fp32, rank 0)": 8 * p,
                      "export (fp32 state dict, rank 0)": 4 * p},
        }
    if method == "es":
        return {"train": {"driver process": PROCESS_BASE["es"] + CUDA_LIBRARIES_BYTES,
                          "vLLM engine processes": engines * VLLM_ENGINE_PROCESS_BYTES,
                          "fp32 master (one per job)": 4 * p, "export (fp32 state dict)": 4 * p}}
    return {"generate": {"process (Python, torch, CUDA)": cuda_process,
                         "vLLM engine processes": engines * VLLM_ENGINE_PROCESS_BYTES,
                         "weights being loaded": 4 * p}}


def es_gpu_hf_host(arch: Architecture, weight_dtype: str) -> dict[str, dict[str, int]]:
    """ES on the transformers backend on a GPU (the smoke script): the model is loaded on the host
    before it moves to the GPU, and a checkpoint copies theta to the host (`es._save_tensors`)."""
    p = arch.parameters
    base = PROCESS_BASE["es"] + CUDA_LIBRARIES_BYTES
    return {"load": {"process (Python, torch, CUDA)": base, "model being loaded": p * dtype_bytes(weight_dtype),
                     "checkpoint file (mapped)": p * dtype_bytes(weight_dtype)},
            "checkpoint": {"process (Python, torch, CUDA)": base, "theta on the host (fp32)": 4 * p}}


def mem_mb(total_bytes: int, margin: float = 0.15) -> int:
    """`mem_mb` for Snakemake/SLURM (SLURM reads M as MiB): the peak plus a margin, rounded up to 100."""
    mib = total_bytes * (1 + margin) / MIB
    return int(-(-mib // 100) * 100)
