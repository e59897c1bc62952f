"""`GRPOSettings`: every setting of one GRPO run, each documented where it is declared.

A light module (no torch, transformers or TRL): `esgrpo.config.check_config` builds it to check
a config before any job runs, so a typo fails with the field's name instead of deep inside TRL.
Settings TRL has carry TRL's names; the fields follow the shape of TRL's `GRPOConfig`: one
``field(default=..., metadata={"help": ...})`` per setting. Defaults are tuned for the tiny CPU
model (learning rate 5e-4); paper values (lr 1e-5 or 3e-6, 63 prompts x 8, top_p 0.95, 1024
tokens; docs/references.md) belong in the paper configs. The memory settings (micro-batches,
checkpointing, vLLM's share and context, processes and sharding) are what the resource plan
(`esgrpo.plan`) chooses per job; their defaults are the single-process CPU run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from esgrpo.settings import FieldCheck, SettingsDataclass
from esgrpo.tasks.rewards import RULES, SCHEMES

__all__ = ["GRPOSettings", "LOSS_TYPES", "LR_SCHEDULERS", "SCALE_REWARDS", "SHARDINGS"]

# Only the losses whose meaning the papers' GRPO shares (token-level clipped surrogate);
# TRL's others (cispo, sapo, ...) change the algorithm being compared.
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")
SCALE_REWARDS = ("group", "batch", "none")
LR_SCHEDULERS = ("linear", "constant", "constant_with_warmup", "cosine")
# How a multi-process run splits the training state: none (DDP: every GPU holds it all), DeepSpeed
# ZeRO-3 or FSDP (each GPU holds 1/num_processes of weights, gradients and AdamW moments).
SHARDINGS = ("none", "zero3", "fsdp")


@dataclass
class GRPOSettings(SettingsDataclass):
    """Every setting of one GRPO run (`esgrpo.grpo.trainer.train_grpo`).

    A step samples `num_generations` completions for each of `prompts_per_step` prompts and takes
    one optimiser step on them (on-policy, TRL's `num_iterations` = 1 as in both papers).
    """

    LABEL = "GRPO"
    # Settings that do not change the trajectory. `steps` does (the linear schedule depends on it); so do
    # the number of processes (per-process sampling seeds) and the sharding (checkpoint layout).
    NOT_FINGERPRINTED = ("save_every", "activation_checkpointing", "vllm_gpu_memory_utilization",
                         "vllm_max_model_length", "max_prompt_tokens")

    num_generations: int = field(default=8, metadata={
        "help": "Completions per prompt (the group); >= 2, as group-normalised advantages need two."})
    prompts_per_step: int = field(default=16, metadata={
        "help": "Distinct prompts per optimiser step (the order is fixed up front: `esgrpo.grpo.trainer.prompt_order`)."})
    learning_rate: float = field(default=5e-4, metadata={
        "help": "AdamW's peak learning rate."})
    lr_scheduler_type: str = field(default="linear", metadata={
        "help": f"Learning-rate schedule, one of {LR_SCHEDULERS}."})
    warmup_ratio: float = field(default=0.0, metadata={
        "help": "Fraction of the steps spent warming the learning rate up, in [0, 1)."})
    weight_decay: float = field(default=0.0, metadata={
        "help": "AdamW's decoupled weight decay."})
    beta: float = field(default=0.0, metadata={
        "help": "KL coefficient against the reference model; paper A uses 0 (KL only tracked)."})
    epsilon: float = field(default=0.2, metadata={
        "help": "Clipping range of the importance ratio in the surrogate."})
    loss_type: str = field(default="dapo", metadata={
        "help": f"TRL's loss normalisation, one of {LOSS_TYPES}."})
    scale_rewards: str = field(default="group", metadata={
        "help": f"Standard deviation the advantages are divided by, one of {SCALE_REWARDS}."})
    max_grad_norm: float = field(default=1.0, metadata={
        "help": "Gradient clipping norm; 0 disables clipping, as in transformers."})
    steps: int = field(default=60, metadata={
        "help": "Optimiser steps (TRL's max_steps)."})
    temperature: float = field(default=1.0, metadata={
        "help": "Sampling temperature of the training completions (> 0: greedy groups would all agree)."})
    top_p: float = field(default=1.0, metadata={
        "help": "Nucleus (top-p) mass of the training completions."})
    max_new_tokens: int = field(default=24, metadata={
        "help": "Completion budget in tokens (TRL's max_completion_length); the evaluation's default: train "
                "on what is graded."})
    reward_scheme: str = field(default="binary", metadata={
        "help": f"Reward of a completion, one of {SCHEMES} (esgrpo.tasks.rewards), the same function ES uses."})
    format_bonus: float = field(default=0.0, metadata={
        "help": "Reward added for a well-formatted answer (esgrpo.tasks.rewards)."})
    reward_rules: str = field(default="esgrpo", metadata={
        "help": f"Whose rules grade a completion, one of {RULES} (esgrpo.tasks.rewards, docs/rewards.md); set "
                "by the config's rewards.rules for training and evaluation alike."})
    seed: int = field(default=0, metadata={
        "help": "Seed of TRL's sampling and of the prompt order."})
    save_every: int = field(default=10, metadata={
        "help": "Steps between TRL checkpoints in the progress folder; 0 saves none (a killed run then "
                "restarts from step 0)."})
    gradient_accumulation_steps: int = field(default=1, metadata={
        "help": "Backward passes each process splits its share of the step's completions into: the micro-batch "
                "is prompts_per_step * num_generations / (num_processes * this). The completions are still "
                "generated together and the step is the same (TRL's generation batch = one optimiser step)."})
    use_vllm: bool = field(default=False, metadata={
        "help": "Generate with vLLM inside the training process (TRL's vllm_mode='colocate'); a GPU, or vLLM's "
                "CPU build (esgrpo.grpo.trainer._colocated_engine_on_cpu)."})
    bf16: bool | None = field(default=None, metadata={
        "help": "bf16 mixed precision (autocast) over fp32 weights and AdamW state; None: on with a GPU, off on "
                "a CPU. vLLM then runs bf16 too."})
    activation_checkpointing: bool | None = field(default=None, metadata={
        "help": "Recompute each layer's activations in the backward pass instead of keeping them (transformers' "
                "activation_checkpointing, gradient_checkpointing before 5.18); None: on with a GPU, off on a CPU."})
    vllm_gpu_memory_utilization: float = field(default=0.3, metadata={
        "help": "Share of the GPU the colocated vLLM engine takes (weights, activations, KV cache); TRL's default."})
    vllm_max_model_length: int | None = field(default=None, metadata={
        "help": "The colocated engine's max_model_len; None: the longest training prompt (or max_prompt_tokens) "
                "+ max_new_tokens. Never the model's own context (Qwen3-4B: 262,144 tokens of KV cache)."})
    max_prompt_tokens: int | None = field(default=None, metadata={
        "help": "The longest prompt the run takes, in tokens (chat template included); a longer one is an "
                "error. None: measured from the training rows."})
    num_processes: int = field(default=1, metadata={
        "help": "Training processes, one per GPU of the job, launched through `accelerate launch` "
                "(esgrpo.grpo.launch) when > 1."})
    sharding: str = field(default="none", metadata={
        "help": f"How {'/'.join(SHARDINGS)} split the training state over the processes: none (DDP), DeepSpeed "
                "ZeRO-3 or FSDP; zero3 and fsdp need num_processes > 1."})

    def __post_init__(self) -> None:
        check = FieldCheck(self)
        check.integer("num_generations", 2)
        check.integer("prompts_per_step", 1)
        check.number("learning_rate", 0.0, low_open=True)
        check.choice("lr_scheduler_type", LR_SCHEDULERS)
        # transformers reads warmup_steps < 1 as a fraction of the run, so a ratio of 1 would mean "1 step".
        check.number("warmup_ratio", 0.0, 1.0, high_open=True)
        check.number("weight_decay", 0.0)
        check.number("beta", 0.0)
        check.number("epsilon", 0.0, low_open=True)
        check.choice("loss_type", LOSS_TYPES)
        check.choice("scale_rewards", SCALE_REWARDS)
        check.number("max_grad_norm", 0.0)
        check.integer("steps", 1)
        check.number("temperature", 0.0, low_open=True)
        check.number("top_p", 0.0, 1.0, low_open=True)
        check.integer("max_new_tokens", 1)
        check.choice("reward_scheme", SCHEMES)
        check.number("format_bonus")
        check.choice("reward_rules", RULES)
        check.integer("seed", 0)
        check.integer("save_every", 0)
        check.integer("gradient_accumulation_steps", 1)
        check.integer("num_processes", 1)
        if self.completions_per_step % (self.num_processes * self.gradient_accumulation_steps):
            raise check.error("gradient_accumulation_steps",
                              f"times num_processes ({self.num_processes}) must divide prompts_per_step * "
                              f"num_generations = {self.completions_per_step}")
        check.choice("sharding", SHARDINGS)
        if self.sharding != "none" and self.num_processes < 2:
            raise check.error("sharding", "needs num_processes > 1 (one process has nothing to shard with)")
        check.boolean("use_vllm")
        for name in ("bf16", "activation_checkpointing"):
            if getattr(self, name) is not None:
                check.boolean(name)
        check.number("vllm_gpu_memory_utilization", 0.0, 1.0, low_open=True)
        for name in ("vllm_max_model_length", "max_prompt_tokens"):
            if getattr(self, name) is not None:
                check.integer(name, 1)
        if self.vllm_max_model_length is not None and \
                self.vllm_max_model_length < (self.max_prompt_tokens or 1) + self.max_new_tokens:
            raise check.error("vllm_max_model_length", f"must hold max_prompt_tokens ({self.max_prompt_tokens}) "
                                                       f"+ max_new_tokens ({self.max_new_tokens})")

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations

    @property
    def micro_batch(self) -> int:
        """Completions in one backward pass of one process (TRL's per_device_train_batch_size)."""
        return self.completions_per_step // (self.num_processes * self.gradient_accumulation_steps)
