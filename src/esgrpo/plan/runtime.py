"""Expected runtime of a job from a small throughput model, anchored on measured ES speed.

GPU decoding (vLLM, one engine per GPU). A decode step of B running sequences reads the weights
once and every sequence's KV cache, and pays a per-sequence cost (sampling, scheduling,
attention kernels, the reward), so

    t_step = (weight bytes + B x context x KV bytes per token) / (f x bandwidth) + B x c

and a member's rollout (ES) or a generation batch (GRPO, evaluation) takes a prefill
(2 x parameters x prompt tokens FLOPs per sequence) plus `max_new_tokens` steps: every
completion is costed at the cap, an upper bound (a batch decodes until its longest sequence
ends; GSM8K answers end far earlier, DeepScaleR's run to the cap).

f (share of the measured copy bandwidth reached) and c (seconds per sequence per step) are not
guessed: they are solved from two measured ES speeds of es-at-scale on 8 H200 (docs/references.md:
N=30, 200 prompts, <= 1,024 tokens; 500 iterations took 3 node-hours at 1.5B and 6 at 7B, i.e.
~21.6 s and 43.2 s per iteration; the ~22 s per iteration at 1.5B is the same figure), assuming
prompts of ~150 tokens (Countdown's question and chat template). The third figure (3B: 4
node-hours, 28.8 s per iteration) is a check: the model gives 27.2 s (tests/plan/test_runtime.py).

Training (GRPO): 6 x parameters x tokens FLOPs for forward and backward, + 2 x parameters x
tokens for the recomputed forward under activation checkpointing, at half the bf16 matmul rate
PyTorch reaches (395 TFLOP/s on an H200: half of docs/references.md's ~790), plus FSDP's
parameter gathers and gradient reduce-scatter, the AdamW step (memory-bound) and TRL's weight
push into vLLM every step (estimates: no GPU measured them here). Before training on them, TRL
scores the step's completions with no-grad forwards (2 x parameters x tokens each, in chunks of
the micro-batch): the policy's importance-sampling forward whenever vLLM generates (GRPOConfig
`vllm_importance_sampling_correction`, default True in TRL 1.16; `_generate_and_score_completions`
computes `old_per_token_logps` for it), and the reference model's when beta > 0.

CPU (the offline default, SmolLM2): generation at ~20 GFLOP/s of model arithmetic plus ~67 us of
Python per generated token (docs/references.md: 4.2M params ~2,000 tok/s, SmolLM2-135M ~85 tok/s,
0.14M ~13,000 tok/s are reproduced within ~15%); training at the same 20 GFLOP/s.
"""

from __future__ import annotations

import math

from esgrpo.plan.architecture import Architecture, dtype_bytes
from esgrpo.plan.gpus import GPU_TYPES, GpuType

# --------------------------------------------------------------------------- the anchor

ANCHOR_GPU = "h200"
ANCHOR_GPUS = 8
ANCHOR_MEMBERS, ANCHOR_PROMPTS, ANCHOR_NEW, ANCHOR_PROMPT_TOKENS = 30, 200, 1024, 150
# (architecture file, seconds per iteration): 3 and 6 node-hours / 500 iterations.
ANCHOR_SECONDS = {"Qwen/Qwen2.5-1.5B-Instruct": 3 * 3600 / 500, "Qwen/Qwen2.5-7B-Instruct": 6 * 3600 / 500}
ANCHOR_CHECK = ("Qwen/Qwen2.5-3B-Instruct", 4 * 3600 / 500)

# Half the bf16 matmul rate PyTorch reaches, for prefill and training (~395 of docs/references.md's ~790 TFLOP/s).
MATMUL_SHARE = 0.5
# FSDP (as ZeRO-3) all-gathers the parameters for the forward and the backward and reduce-scatters
# the gradients: 3 x 2 bytes per parameter per micro-batch under bf16 mixed precision, over NVLink at
# ~150 GB/s per GPU as NCCL reaches it for these message sizes (estimate).
SHARDED_BYTES_PER_PARAM, SHARDED_LINK_BYTES_PER_S = 6, 150e9
# Fixed cost of one micro-batch's forward and backward beyond its FLOPs (kernel launches and
# autograd bookkeeping of ~30 checkpointed layers, TRL's per-batch Python): ~0.1 s (estimate). It
# is what makes the plan prefer fewer, larger micro-batches when memory allows. A no-grad scoring
# forward launches one of the four passes' kernels (forward, recomputed forward, backward ~ 2): a quarter.
MICRO_STEP_SECONDS = 0.1
SCORING_CHUNK_SECONDS = MICRO_STEP_SECONDS / 4
# A forward under FSDP all-gathers the parameters once, in bf16: a third of SHARDED_BYTES_PER_PARAM.
FORWARD_GATHER_BYTES_PER_PARAM = 2
# TRL's colocated weight push into vLLM every step: a gather and `load_weights` of 2 bytes per
# parameter at ~20 GB/s, plus ~2 s of fixed cost (estimate; docs/cluster.md assumed 15-20 s
# including scheduling, which the GPU smoke cannot measure without vLLM).
WEIGHT_SYNC_BYTES_PER_S, WEIGHT_SYNC_FIXED_S = 20e9, 2.0
# transformers `generate` against vLLM at the same batch: no paged attention or CUDA graphs, a
# Python loop per token; ~3x slower (estimate).
HF_GENERATE_SLOWDOWN = 3.0
# Reward scoring on the CPU: ~1 ms per completion with math-verify (docs/references.md).
REWARD_SECONDS = 1e-3
# Loading a model and starting an engine: a minute, plus reading the weights at ~1 GB/s from a
# shared file system (estimate).
START_SECONDS, LOAD_BYTES_PER_S = 60.0, 1e9
# vLLM's CPU build compiles a model's forward before its first request (torch.compile; ES engines run
# eager and skip it), for every checkpoint anew (its compile cache is keyed by the model's path, among
# others: vllm/config/model.py, ModelConfig.compute_hash): most of each evaluation job's time for
# SmolLM2-135M on one core of the rehearsal machine (measured: docs/rehearsal.md, fix 13).
VLLM_CPU_COMPILE_SECONDS = 240.0
# CPU (see the module docstring).
CPU_FLOPS, CPU_SECONDS_PER_TOKEN = 20e9, 1 / 15000


def _step_terms(arch: Architecture, gpu: GpuType, sequences: int, context: float) -> tuple[float, float]:
    """(bytes read per decode step, sequences) of a step: the two quantities t_step is linear in."""
    weights = arch.parameters * dtype_bytes("bfloat16")
    return weights + sequences * context * arch.kv_bytes_per_token("bfloat16"), sequences


def _prefill_seconds(arch: Architecture, gpu: GpuType, sequences: int, prompt: int) -> float:
    return 2 * arch.parameters * sequences * prompt / (MATMUL_SHARE * gpu.bf16_tflops * 1e12)


def _calibrate() -> tuple[float, float]:
    """Solve (f, c) from the two anchors (module docstring); members per engine = ceil(30 / 8)."""
    from esgrpo.plan.architecture import shipped

    gpu = GPU_TYPES[ANCHOR_GPU]
    per_engine = math.ceil(ANCHOR_MEMBERS / ANCHOR_GPUS)
    context = ANCHOR_PROMPT_TOKENS + ANCHOR_NEW / 2
    rows = []
    for source, seconds in ANCHOR_SECONDS.items():
        arch = shipped(source)
        member = seconds / per_engine - _prefill_seconds(arch, gpu, ANCHOR_PROMPTS, ANCHOR_PROMPT_TOKENS)
        read, seqs = _step_terms(arch, gpu, ANCHOR_PROMPTS, context)
        rows.append((read / (gpu.memory_tbps * 1e12), seqs, member / ANCHOR_NEW))
    (a1, b1, t1), (a2, b2, t2) = rows
    # t = a / f + b * c, two equations in (1/f, c)
    det = a1 * b2 - a2 * b1
    inv_f = (t1 * b2 - t2 * b1) / det
    c = (a1 * t2 - a2 * t1) / det
    return 1 / inv_f, c


BANDWIDTH_SHARE, SECONDS_PER_SEQUENCE_STEP = _calibrate()


# --------------------------------------------------------------------------- GPU


def decode_seconds(arch: Architecture, gpu: GpuType, sequences: int, prompt: int, new: int) -> float:
    """Prefill plus `new` decode steps of `sequences` sequences decoded together on one GPU."""
    if sequences <= 0 or new <= 0:
        return 0.0
    read, seqs = _step_terms(arch, gpu, sequences, prompt + new / 2)
    step = read / (BANDWIDTH_SHARE * gpu.memory_tbps * 1e12) + seqs * SECONDS_PER_SEQUENCE_STEP
    return _prefill_seconds(arch, gpu, sequences, prompt) + new * step


def batched_decode_seconds(arch: Architecture, gpu: GpuType, total: int, concurrent: int, prompt: int,
                           new: int) -> float:
    """`total` sequences through an engine that runs `concurrent` at a time (vLLM continuous batching:
    costed as successive full batches, each to the cap)."""
    if total <= 0:
        return 0.0
    concurrent = max(1, min(concurrent, total))
    full, rest = divmod(total, concurrent)
    return full * decode_seconds(arch, gpu, concurrent, prompt, new) + decode_seconds(arch, gpu, rest, prompt, new)


def es_iteration_seconds(arch: Architecture, gpu: GpuType, members: int, engines: int, prompts: int,
                         concurrent: int, prompt: int, new: int) -> float:
    """One ES iteration on vLLM engines: each engine evaluates its share of the members one after
    another (perturb, generate the batch, restore; perturbing is inside the anchored constants)."""
    per_engine = math.ceil(members / max(1, engines))
    return per_engine * batched_decode_seconds(arch, gpu, prompts, concurrent, prompt, new)


def grpo_training_seconds(arch: Architecture, gpu: GpuType, *, tokens: int, micro_steps: int,
                          checkpointing: bool) -> float:
    """Forward and backward of `tokens` tokens in `micro_steps` micro-batches on one GPU."""
    flops = (8 if checkpointing else 6) * arch.parameters * tokens
    return flops / (MATMUL_SHARE * gpu.bf16_tflops * 1e12) + micro_steps * MICRO_STEP_SECONDS


def scoring_seconds(arch: Architecture, gpu: GpuType, *, tokens: int, chunks: int, sharded: bool) -> float:
    """One of TRL's no-grad log-prob forwards over `tokens` tokens in `chunks` micro-batches on one GPU
    (the importance-sampling forward, or the reference model's), its FSDP gathers included."""
    flops = 2 * arch.parameters * tokens
    gather = chunks * FORWARD_GATHER_BYTES_PER_PARAM * arch.parameters / SHARDED_LINK_BYTES_PER_S if sharded else 0.0
    return flops / (MATMUL_SHARE * gpu.bf16_tflops * 1e12) + chunks * SCORING_CHUNK_SECONDS + gather


def grpo_step_seconds(arch: Architecture, gpu: GpuType, *, gpus: int, completions: int, concurrent: int,
                      prompt: int, new: int, micro_batch: int, checkpointing: bool, sharded: bool,
                      vllm: bool = True, reference: bool = False) -> float:
    """One GRPO step on `gpus` processes, each with a colocated vLLM engine (see the module docstring);
    vllm False: transformers generate in the training process (HF_GENERATE_SLOWDOWN, no weight push, and no
    importance-sampling forward: TRL corrects only vLLM's samples); reference: beta > 0, one more forward."""
    return sum(grpo_step_parts(arch, gpu, gpus=gpus, completions=completions, concurrent=concurrent, prompt=prompt,
                               new=new, micro_batch=micro_batch, checkpointing=checkpointing, sharded=sharded,
                               vllm=vllm, reference=reference).values())


def grpo_step_parts(arch: Architecture, gpu: GpuType, *, gpus: int, completions: int, concurrent: int,
                    prompt: int, new: int, micro_batch: int, checkpointing: bool, sharded: bool,
                    vllm: bool = True, reference: bool = False) -> dict[str, float]:
    """`grpo_step_seconds` term by term (seconds)."""
    per_process = completions // gpus
    micro_steps = per_process // micro_batch
    tokens = per_process * (prompt + new)
    generation = batched_decode_seconds(arch, gpu, per_process, concurrent, prompt, new)
    forward = scoring_seconds(arch, gpu, tokens=tokens, chunks=micro_steps, sharded=sharded)
    parts = {
        "generation": generation * (1 if vllm else HF_GENERATE_SLOWDOWN),
        "importance-sampling forward": forward if vllm else 0.0,
        "reference forward": forward if reference else 0.0,
        "training": grpo_training_seconds(arch, gpu, tokens=tokens, micro_steps=micro_steps,
                                          checkpointing=checkpointing),
        "FSDP gathers": micro_steps * SHARDED_BYTES_PER_PARAM * arch.parameters / SHARDED_LINK_BYTES_PER_S
        if sharded else 0.0,
        "AdamW": 3 * 16 * arch.parameters / gpus / (BANDWIDTH_SHARE * gpu.memory_tbps * 1e12),
        "weight sync": WEIGHT_SYNC_FIXED_S + 2 * arch.parameters / WEIGHT_SYNC_BYTES_PER_S if vllm else 0.0,
        "rewards": completions * REWARD_SECONDS / gpus,
    }
    return parts


def start_seconds(arch: Architecture) -> float:
    return START_SECONDS + arch.parameters * dtype_bytes("bfloat16") / LOAD_BYTES_PER_S


# --------------------------------------------------------------------------- CPU


def cpu_generation_seconds(arch: Architecture, sequences: int, new: int) -> float:
    """Generated tokens at the CPU rate (batched; the per-token Python cost is per generated token)."""
    tokens = sequences * new
    return tokens * (2 * arch.parameters / CPU_FLOPS + CPU_SECONDS_PER_TOKEN)


def cpu_training_seconds(arch: Architecture, tokens: int) -> float:
    return 6 * arch.parameters * tokens / CPU_FLOPS


def anchor_check() -> dict[str, float]:
    """Seconds per iteration the model gives at the three es-at-scale points, and the measured ones."""
    from esgrpo.plan.architecture import shipped

    gpu = GPU_TYPES[ANCHOR_GPU]
    out = {}
    for source, measured in [*ANCHOR_SECONDS.items(), ANCHOR_CHECK]:
        model = es_iteration_seconds(shipped(source), gpu, ANCHOR_MEMBERS, ANCHOR_GPUS, ANCHOR_PROMPTS,
                                     ANCHOR_PROMPTS, ANCHOR_PROMPT_TOKENS, ANCHOR_NEW)
        out[source] = model
        out[source + " (measured)"] = measured
    return out
