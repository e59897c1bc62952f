"""Memory of one job, term by term: what each process holds at its peak, on the GPU and on the host.

Every term is a named number of bytes, so a plan row can say where a job's memory goes. A
job's peak is the largest of its phases (loading, generating, training, the optimiser step,
exporting); the functions here return the terms of one phase, `peak` picks the largest.

The constants below say where they come from. "Measured" ones were measured on this
project's CPU machines with `benchmarks/plan_memory.py`; "estimate" ones could not be measured
without a GPU and are what `scripts/gpu_smoke.sh` prints next to its measurements.
Nothing here imports torch: the Snakemake DAG parse reads this module.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from esgrpo.engines.groups import member_group_size
from esgrpo.plan.architecture import Architecture, dtype_bytes

GIB = 2**30
MIB = 2**20

# --------------------------------------------------------------------------- training state

# Full fine-tuning with AdamW in mixed precision holds 16 bytes per parameter: 2 (bf16 weights)
# + 2 (bf16 gradients) + 12 (fp32 master weights and the two fp32 moments), the "2+2+K, K=12" of
# Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
# sec. 3.1. fp32 weights + fp32 gradients + two fp32 moments (autocast over an fp32 model, as
# transformers' Trainer does with bf16=True) is also 4 + 4 + 8 = 16.
TRAINING_STATE_BYTES_PER_PARAM = 16
# ZeRO-3 gathers parameters layer by layer for the forward and backward; DeepSpeed's default
# `stage3_max_live_parameters` (DeepSpeed config docs, ZeRO section) bounds them to 1e9 elements
# resident at once, held in bf16.
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000
# TRL 1.16 computes per-token log-probs through a fused LM head in tiles of 4,096 tokens x 32,768
# vocabulary columns (trl/kernels/chunked_logprob.py, TOKEN_CHUNK_SIZE and
# trl/trainer/utils.py, _CHUNKED_LOGPROB_CHUNK_SIZE): the full logits are never materialised.
TRL_LOGPROB_TOKENS = 4096
TRL_LOGPROB_VOCAB = 32768

# --------------------------------------------------------------------------- processes (estimates)

# A CUDA process: context, cuBLAS/cuDNN workspaces, and the caching allocator's rounding. The
# CUDA context alone is a few hundred MiB on Hopper; 1 GiB covers it with the workspaces (estimate).
CUDA_PROCESS_BYTES = 1 * GIB
# NCCL communicators and buffers of a process in a multi-GPU job (estimate).
NCCL_BYTES = GIB // 2
# Fragmentation of PyTorch's caching allocator under changing sequence lengths: a share of the
# tensors a process holds (estimate; `expandable_segments` lowers it).
ALLOCATOR_SLACK = 0.05

# --------------------------------------------------------------------------- ES weight math

# vLLM pads the embedding and lm_head rows to a multiple of 64 (vllm/model_executor/layers/
# vocab_parallel_embedding.py, DEFAULT_VOCAB_PADDING_SIZE); the ES master copies them padded.
VLLM_VOCAB_PADDING = 64


def es_tensors(arch: Architecture, layout: str) -> list[tuple[int, bool]]:
    """(elements, assembled) of each distinct tensor shape an ES master holds: the HF tensors
    (`layout` "hf"), or vLLM's (`"vllm"`: q/k/v and gate/up fused, the vocabulary padded).
    `assembled`: its noise is built from pieces (`esgrpo.engines.vllm_layout.fused_noise`: the
    parts' noise concatenated, or zeros with the rows' noise written in), so it briefly takes
    twice the tensor."""
    h, inter, q, kv = arch.hidden_size, arch.intermediate_size, arch.q_dim, arch.kv_dim
    rows = arch.vocab_size
    if layout == "vllm":
        rows = math.ceil(rows / VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING
        qkv = [((q + 2 * kv) * h, True)] + ([(q + 2 * kv, True)] if arch.qkv_bias else [])
        mlp = [(2 * inter * h, True), (h * inter, False)]
    else:
        qkv = [(q * h, False), (kv * h, False)] + ([(q, False), (kv, False)] if arch.qkv_bias else [])
        mlp = [(h * inter, False)]
    vocab = (rows * h, rows != arch.vocab_size)
    return [vocab, *qkv, (h * q, False), *mlp, (h, False)]


def es_tensor_bytes(n: int, assembled: bool, agreement: bool = False) -> dict[str, int]:
    """Bytes beside the fp32 master while ES works on one tensor of n elements, by operation
    (c = min(n, NORM_CHUNK_ELEMENTS)):

    - perturb (`ESWorkerExtension.es_perturb`, a member of `perturbed_population`): the noise 4n
      and the member 4n (an assembled noise's pieces are freed before the member is made);
    - update (`esgrpo.es.ops.apply_update`): the fp32 step 4n and one noise draw 4n (an assembled tensor's
      step is its parts' sums, each built beside one part's draw, then concatenated: also 8n), then the
      norm's float64 chunk, squared in place, 8c; with `agreement` (`esgrpo.distance.StepAgreement`, which
      both backends count every update) also what theta takes of the step, 4c, beside float64 copies of a
      quarter chunk of it and of the step, 16 * min(n, c/4);
    - distance from theta0 (`esgrpo.distance.distance`): subtracted in float64 a chunk at a time (theta's
      chunk, theta0's chunk cast for the subtraction: 16c), on either backend (vLLM engine 0 keeps theta0 on
      the host).
    Counted from the code; `benchmarks/es_update_memory.py` measures each (tests/plan/test_plan.py).
    """
    from esgrpo.distance import NORM_CHUNK_ELEMENTS

    c = min(n, NORM_CHUNK_ELEMENTS)
    agreed = 4 * c + 16 * min(n, NORM_CHUNK_ELEMENTS // 4) if agreement else 0
    return {"perturb": 8 * n,
            "update": 4 * n + max(4 * n, 8 * c, agreed),
            "distance": 16 * c}


def es_update_bytes(arch: Architecture, layout: str = "vllm") -> int:
    """The largest of `es_tensor_bytes` over the master's tensors: ES's working set beside theta."""
    return max(max(es_tensor_bytes(n, assembled, agreement=True).values())  # both backends measure it
               for n, assembled in es_tensors(arch, layout))


def es_master_bytes(arch: Architecture, layout: str = "vllm") -> int:
    """The fp32 master theta: every parameter, in vLLM's layout with its padded vocabulary rows."""
    rows = arch.vocab_size
    if layout == "vllm":
        rows = math.ceil(rows / VLLM_VOCAB_PADDING) * VLLM_VOCAB_PADDING
    padding = (rows - arch.vocab_size) * arch.hidden_size * (1 if arch.tie_word_embeddings else 2)
    return 4 * (arch.parameters + padding)


# --------------------------------------------------------------------------- vLLM

# vLLM's KV cache is allocated in blocks of 16 tokens (vLLM EngineArgs block_size default).
VLLM_BLOCK_TOKENS = 16
# Tokens of one scheduler step, which bounds vLLM's profiled activation peak: TRL's colocated
# engine passes max_num_batched_tokens=4096 (trl/generation/vllm_generation.py); a plain
# `vllm.LLM` takes 16,384 on GPUs of >= 70 GiB other than the A100 and 8,192 elsewhere
# (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults), and max_num_seqs 1,024 / 256.
VLLM_TRL_BATCHED_TOKENS = 4096
VLLM_LARGE_GPU_BATCHED_TOKENS, VLLM_LARGE_GPU_MAX_SEQS = 16384, 1024
VLLM_SMALL_GPU_BATCHED_TOKENS, VLLM_SMALL_GPU_MAX_SEQS = 8192, 256
# CUDA graphs captured for decoding, and memory vLLM does not allocate through torch (estimate:
# vLLM's start-up log reports both; 0.5-1 GiB each for models of a few billion parameters).
VLLM_CUDA_GRAPH_BYTES = 1 * GIB
VLLM_NON_TORCH_BYTES = GIB // 2
# vLLM's default gpu_memory_utilization (EngineArgs), a share of the device total (`granted_bytes`);
# the plan never asks an engine for more.
VLLM_MAX_UTILIZATION = 0.9


@dataclass(frozen=True)
class Memory:
    """Bytes by term at a job's peak phase (per GPU for GPU memory, per job for host memory)."""

    parts: dict[str, int]
    phase: str = ""

    @property
    def total(self) -> int:
        return int(sum(self.parts.values()))

    @property
    def gib(self) -> float:
        return self.total / GIB

    def describe(self, limit: int = 4) -> str:
        """The largest terms, e.g. 'training state 113.5 GiB, vLLM 41.7 GiB, ...'."""
        top = sorted(self.parts.items(), key=lambda kv: -kv[1])[:limit]
        return ", ".join(f"{name} {_size(value)}" for name, value in top if value > 0)


def _size(value: int) -> str:
    return f"{value / GIB:.1f} GiB" if value >= GIB else f"{value / MIB:.0f} MiB"


def peak(phases: dict[str, dict[str, int]]) -> Memory:
    """The phase whose terms sum highest (memory freed between phases is reused by the next)."""
    phase, parts = max(phases.items(), key=lambda kv: sum(kv[1].values()))
    return Memory({k: int(v) for k, v in parts.items()}, phase)


# --------------------------------------------------------------------------- activations


def layer_activation_bytes(arch: Architecture, act_bytes: int, residual_bytes: int, scores: int = 0) -> int:
    """Bytes one decoder layer keeps for its backward, per token.

    Counted from the Llama/Qwen layer: each RMSNorm keeps its input and normalised output (2H,
    in the residual stream's dtype); q, k, v, the attention output and the o_proj input
    (3q + 2kv, with q and k kept after rotary); the gated MLP keeps gate, up, SiLU(gate) and
    their product (4I). `scores`: attention probabilities kept per token (heads x key length,
    twice: softmax input and output) when attention runs without a fused kernel, as
    `scaled_dot_product_attention` does on the CPU with a padding mask; flash attention on a
    GPU keeps none.
    """
    residual = 2 * 2 * arch.hidden_size * residual_bytes
    attention = (3 * arch.q_dim + 2 * arch.kv_dim) * act_bytes
    mlp = 4 * arch.intermediate_size * act_bytes
    probabilities = 2 * arch.num_attention_heads * scores * act_bytes
    return residual + attention + mlp + probabilities


def logprob_head_bytes(arch: Architecture, tokens: int, act_bytes: int, triton: bool = True) -> int:
    """TRL's fused log-prob head (trl/kernels/chunked_logprob.py) at its largest, in the backward: the
    forward's and the backward's [tokens, vocab] tile buffers, the fp32 gradient accumulators of the
    LM head weight [vocab, hidden] and of the hidden states, and the fp32 hidden states it reads.
    Without Triton (CPU) each tile is folded with torch ops, which hold about three more fp32
    tile-sized temporaries (the transformed logits, their exponentials, their product)."""
    rows, cols = min(tokens, TRL_LOGPROB_TOKENS), min(arch.vocab_size, TRL_LOGPROB_VOCAB)
    tiles = 2 * rows * cols * act_bytes + (0 if triton else 3 * rows * cols * 4)
    return tiles + arch.vocab_size * arch.hidden_size * 4 + 2 * tokens * arch.hidden_size * 4


def training_activations(arch: Architecture, micro_batch: int, seq_len: int, *, checkpointing: bool,
                         act_bytes: int, residual_bytes: int, scores: bool, triton: bool = True) -> dict[str, int]:
    """Activations of one micro-batch of `micro_batch` sequences of `seq_len` tokens.

    Without checkpointing every layer keeps its activations until its backward. With it
    (transformers' gradient checkpointing, one checkpoint per decoder layer) only each layer's
    input survives the forward, and one layer at a time is recomputed in the backward
    (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost"); its activation
    gradients are about as large again.
    """
    tokens = micro_batch * seq_len
    per_layer = layer_activation_bytes(arch, act_bytes, residual_bytes, seq_len if scores else 0)
    if checkpointing:
        kept = arch.num_hidden_layers * tokens * arch.hidden_size * residual_bytes
        live = 2 * tokens * per_layer
        parts = {"activations (layer inputs, checkpointed)": kept, "activations (one layer recomputed)": live}
    else:
        parts = {"activations (all layers)": arch.num_hidden_layers * tokens * per_layer,
                 "activation gradients (one layer)": tokens * per_layer}
    parts["log-prob head (tiles, fp32 gradients)"] = logprob_head_bytes(arch, tokens, act_bytes, triton)
    return parts


def fsdp_unsharded_parameters(arch: Architecture) -> int:
    """Parameters FSDP holds whole at once: the root unit (embedding, untied LM head, final norm), which
    FSDP2 keeps unsharded from the forward to the backward (torch `fully_shard`: the root is not
    resharded after forward), and two decoder layers (the one computing, the next prefetched)."""
    root = arch.parameters - arch.num_hidden_layers * arch.layer_parameters
    return root + 2 * arch.layer_parameters


def training_state(arch: Architecture, gpus: int, sharding: str) -> dict[str, int]:
    """Weights, gradients and AdamW state, sharded over `gpus` with ZeRO-3 / FSDP full sharding."""
    p = arch.parameters
    if sharding == "none" or gpus == 1:
        return {"training state (weights, grads, AdamW; 16 B/param)": TRAINING_STATE_BYTES_PER_PARAM * p}
    if sharding == "fsdp":
        # accelerate's FSDP2 (esgrpo.grpo.launch, one unit per decoder layer); the gathered units and
        # their gradients before the reduce-scatter are counted in fp32, an upper bound: under bf16
        # mixed precision they may be gathered in bf16 (estimate until scripts/gpu_smoke.sh measures it).
        return {
            f"training state (16 B/param / {gpus} GPUs, FSDP)": math.ceil(TRAINING_STATE_BYTES_PER_PARAM * p / gpus),
            "FSDP gathered units and their gradients (fp32)": 2 * 4 * fsdp_unsharded_parameters(arch),
            "NCCL buffers": NCCL_BYTES,
        }
    return {
        f"training state (16 B/param / {gpus} GPUs, ZeRO-3)": math.ceil(TRAINING_STATE_BYTES_PER_PARAM * p / gpus),
        "ZeRO-3 gathered parameters (bf16)": 2 * min(p, ZERO3_MAX_LIVE_PARAMETERS),
        "NCCL buffers": NCCL_BYTES,
    }


def autocast_weight_copies(arch: Architecture, sharding: str) -> dict[str, int]:
    """bf16 copies of the fp32 weights that autocast keeps to the end of a forward.

    torch's autocast caches its bf16 cast of every fp32 leaf tensor that requires grad until the
    autocast region ends (aten/src/ATen/autocast_mode.cpp, `cached_cast`; no grad-mode test), and
    accelerate wraps the whole forward of a prepared model in one region (bf16 mixed precision). So a
    forward of the fp32 policy on one GPU, the training forward and TRL's no-grad log-prob forwards
    alike, ends holding a bf16 copy of every weight a matmul reads: 2 bytes per parameter of the
    linear layers and the LM head (the embedding lookup and the RMSNorms run uncast; a tied embedding
    is cast as the head). `benchmarks/autocast_memory.py` measures it on this CPU (tests/plan/test_plan.py).
    Sharded over FSDP the gathered units are already bf16 (accelerate's MixedPrecisionPolicy), so
    nothing is cast.
    """
    if sharding != "none":
        return {}
    norms = (2 * arch.num_hidden_layers + 1) * arch.hidden_size
    norms += 2 * arch.head_dim * arch.num_hidden_layers if arch.qk_norm else 0
    uncast = norms + (0 if arch.tie_word_embeddings else arch.embedding_parameters)
    return {"autocast bf16 copies of the fp32 weights (to the forward's end)": 2 * (arch.parameters - uncast)}


# TRL 1.16 builds the reference model of beta > 0 in the policy's dtype (trl/trainer/grpo_trainer.py,
# `model_init_kwargs.setdefault("dtype", self.model.dtype)`): fp32 here, where the policy is loaded in
# fp32 for bf16 autocast (`esgrpo.grpo.distributed.load_policy`).
REFERENCE_DTYPE = "float32"


def reference_model(arch: Architecture, gpus: int, sharding: str) -> tuple[dict[str, int], dict[str, int]]:
    """TRL's reference model (beta > 0): (what stays on each GPU, what its forward adds there).

    One process: the whole model in the policy's dtype, on the GPU (`accelerator.prepare_model`), and
    its forward's autocast copies (`autocast_weight_copies`: its parameters require grad, as
    `from_pretrained` leaves them). FSDP: TRL's `prepare_fsdp` calls `fully_shard` on the root module
    only, so the whole model is one FSDP unit: a 1/gpus shard stays and every reference forward
    all-gathers all of it, in bf16 (the mixed-precision policy). ZeRO-3 (`prepare_deepspeed`): a bf16
    shard, gathered up to DeepSpeed's live-parameter bound.
    """
    p, width = arch.parameters, dtype_bytes(REFERENCE_DTYPE)
    if sharding == "none" or gpus == 1:
        return ({f"reference model ({REFERENCE_DTYPE}, beta > 0)": width * p},
                {"reference forward: autocast bf16 copies": 2 * p})
    if sharding == "fsdp":
        return ({f"reference model ({REFERENCE_DTYPE} / {gpus} GPUs, FSDP)": math.ceil(width * p / gpus)},
                {"reference forward: the whole model gathered (bf16, one FSDP unit)": 2 * p})
    return ({f"reference model (bf16 / {gpus} GPUs, ZeRO-3)": math.ceil(2 * p / gpus)},
            {"reference forward: gathered parameters (bf16)": 2 * min(p, ZERO3_MAX_LIVE_PARAMETERS)})


def scoring_forward(arch: Architecture, micro_batch: int, seq_len: int, act_bytes: int = 2) -> dict[str, int]:
    """One chunk of TRL's no-grad log-prob forwards (the importance-sampling and reference forwards run in
    chunks of the micro-batch: `_get_per_token_logps_and_entropies(batch_size=per_device_train_batch_size)`):
    one layer's activations and the fused log-prob head's forward: one [tokens, vocab] tile and the
    fp32 hidden states it reads (`logprob_head_bytes` without the backward's buffers)."""
    tokens = micro_batch * seq_len
    rows, cols = min(tokens, TRL_LOGPROB_TOKENS), min(arch.vocab_size, TRL_LOGPROB_VOCAB)
    return {"log-prob forward (one layer, no grad)": tokens * layer_activation_bytes(arch, act_bytes, 4),
            "log-prob forward head (tile, fp32 hidden states)": rows * cols * act_bytes + tokens * arch.hidden_size * 4}


# --------------------------------------------------------------------------- generation


def hf_generation(arch: Architecture, sequences: int, prompt: int, new: int, act_bytes: int) -> dict[str, int]:
    """transformers `generate` of `sequences` sequences at once (KV cache, logits, one layer).

    DynamicCache concatenates each layer's keys and values every step, so one layer's cache is
    briefly held twice; generate keeps only the last position's logits, and the sampling
    processors make a few [sequences, vocab] fp32 copies (temperature, top-p sort, softmax).
    """
    context = prompt + new
    kv_layer = sequences * context * 2 * arch.kv_dim * act_bytes
    prefill_layer = sequences * prompt * (arch.hidden_size + arch.q_dim + 2 * arch.kv_dim
                                          + 2 * arch.intermediate_size) * act_bytes
    scores = sequences * arch.num_attention_heads * prompt * prompt * 4
    return {
        "KV cache": arch.num_hidden_layers * kv_layer + kv_layer,
        "generation logits": 5 * sequences * arch.vocab_size * 4,
        "prefill (one layer)": prefill_layer + scores,
    }


def population_kept(arch: Architecture, members: int, prompts: int, prompt: int, new: int) -> dict[str, int]:
    """What the population engine keeps from one ES iteration to the next (`esgrpo.engines.member_values.
    MemberBuffers`, held by the default evaluator of `esgrpo.es.hf_backend`), full-rank members.

    The members are built from theta and their seeds in the engine's fp32 layout (`prepare_population`),
    never stacked: one group of them at a time (`esgrpo.engines.groups`), each member holding every layer,
    its embedding table and its head; the scratch of one member's build (the noise draw of the largest
    tensor, the embedding table, and a fused gate/up block with its two parts' draws); the fp32 KV cache of
    N x B rows. Low-rank members (`ESConfig.noise`) share one copy of the matrices and keep less: this is
    their bound too. Members are rounded to the model's dtype but held in fp32.
    """
    n, h, v = members, arch.hidden_size, arch.vocab_size
    per_member = 4 * (arch.num_hidden_layers * arch.layer_parameters + 2 * v * h)
    group = member_group_size(n, per_member)
    slots = prompt + new - 1
    return {
        "population (one group of members, fp32 layout, kept)": group * per_member,
        "population (one member's noise and fold scratch, kept)": 4 * (v * h + 4 * h * arch.intermediate_size),
        "KV cache (population, kept)": arch.num_hidden_layers * n * prompts * slots * 2 * arch.kv_dim * 4,
    }


def population_generation(arch: Architecture, members: int, prompts: int, prompt: int, new: int) -> dict[str, int]:
    """ES on the transformers backend (`esgrpo.engines.population.population_generate`), full-rank members:
    what it keeps (`population_kept`), the step's logits and their log-softmax, the prefill's attention scores
    and, for an untied head, one member's head being built (its noise, the member and the folded copy)."""
    rows = members * prompts
    v, h = arch.vocab_size, arch.hidden_size
    return {
        **population_kept(arch, members, prompts, prompt, new),
        "generation logits": 4 * rows * v * 4,
        "prefill attention scores": min(256 * MIB, rows * arch.num_attention_heads * prompt * prompt * 4),
        **({} if arch.tie_word_embeddings else {"untied head of one member (noise, member, fold)": 3 * 4 * v * h}),
    }


def vllm_engine(arch: Architecture, dtype: str, max_model_len: int, sequences: int,
                batched_tokens: int) -> dict[str, int]:
    """What one vLLM engine needs inside its gpu_memory_utilization budget.

    Weights in `dtype`; the activation peak of its profiling run, one scheduler step of
    `batched_tokens` tokens through a layer (MLP and qkv outputs) plus the sampler's logits of
    up to that many rows; CUDA graphs and non-torch memory; and a KV cache for `sequences`
    sequences of `max_model_len` tokens (rounded up to whole blocks), the number running at once.
    """
    width = dtype_bytes(dtype)
    blocks = math.ceil(max_model_len / VLLM_BLOCK_TOKENS) * VLLM_BLOCK_TOKENS
    activation = batched_tokens * (2 * arch.intermediate_size + arch.q_dim + 2 * arch.kv_dim
                                   + 2 * arch.hidden_size) * width
    sampler = min(batched_tokens, VLLM_LARGE_GPU_MAX_SEQS) * arch.vocab_size * 4 * 2
    return {
        "vLLM weights": arch.parameters * width,
        "vLLM activation peak": activation + sampler,
        "vLLM CUDA graphs and non-torch": VLLM_CUDA_GRAPH_BYTES + VLLM_NON_TORCH_BYTES,
        "vLLM KV cache": sequences * blocks * arch.kv_bytes_per_token(dtype),
    }


def vllm_sequences_that_fit(arch: Architecture, dtype: str, max_model_len: int, budget: int,
                            batched_tokens: int) -> int:
    """How many sequences of `max_model_len` tokens an engine's KV cache holds within `budget` bytes."""
    fixed = vllm_engine(arch, dtype, max_model_len, 0, batched_tokens)
    per_sequence = vllm_engine(arch, dtype, max_model_len, 1, batched_tokens)["vLLM KV cache"]
    return max(0, int((budget - sum(fixed.values())) // per_sequence))


def utilization_for(need: int, total_bytes: int) -> float:
    """vLLM's gpu_memory_utilization that grants `need` bytes on a GPU whose device total is
    `total_bytes` (`GpuType.total_bytes`, not the usable memory: see `granted_bytes`), rounded up
    to a hundredth (in integers, so a need of exactly 0.9 x total asks for 0.9, not 0.91)."""
    return -(-100 * int(need) // int(total_bytes)) / 100


def granted_bytes(utilization: float, total_bytes: int) -> int:
    """What vLLM takes for an engine: ceil(gpu_memory_utilization x the device total), its
    `requested_memory` (vllm/v1/worker/utils.py `request_memory`; vLLM 0.31), inside which it fits
    weights, activation peak, non-torch memory and the KV cache."""
    return math.ceil(utilization * total_bytes)
