"""`ESConfig`: every setting of one ES run, each documented where it is declared.

A light module (no torch, no transformers): `esgrpo.config.check_config` builds it to check a
config before any job runs. The fields follow the shape of TRL's `GRPOConfig`: one
``field(default=..., metadata={"help": ...})`` per setting. Defaults follow Qiu et al.
(N=30-32, sigma 1e-3, alpha 5e-4; docs/references.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from esgrpo.settings import FieldCheck, SettingsDataclass
from esgrpo.tasks.rewards import RULES, SCHEMES

__all__ = ["ARITHMETICS", "ESConfig", "LOWRANK_ON_VLLM", "NOISE_KINDS", "NOISE_SEEDINGS", "NORMALIZATIONS"]

NORMALIZATIONS = ("zscore", "rank", "none")
NOISE_KINDS = ("full", "lowrank")  # esgrpo.noise.Noise.kind
NOISE_SEEDINGS = ("per_tensor", "paper_a", "paper_b")  # esgrpo.noise.SEEDINGS
# How the weights are perturbed, restored and updated (esgrpo.es.arithmetic): "exact" is the fp32 master
# with an exact restore; the in-place ones have no master and work in the weights' dtype.
ARITHMETICS = ("exact", "inplace_sequential", "inplace_summed")
PROMPT_SCHEDULES = ("resample", "epochs")  # esgrpo.es.ops.prompt_batch
# Why es.backend vllm refuses low-rank noise (vLLM 0.31, read in its source: vllm/lora/); checked by
# esgrpo.config before any job and by the vLLM ES backend itself.
LOWRANK_ON_VLLM = (
    "ESConfig.noise 'lowrank' is not supported on es.backend vllm: serving members as LoRA adapters would need "
    "(1) LoRA on lm_head, which vLLM 0.31 does not replace (LogitsProcessorWithLoRA.can_replace_layer is False), "
    "so a tied embedding / lm_head cannot carry a member's A B^T; (2) the members' full-rank noise on 1-D "
    "tensors (norm weights, biases), which no adapter holds; (3) N adapters per iteration written to disk in "
    "PEFT layout (LoRARequest takes a lora_path). Run low-rank ES on es.backend hf, or full-rank noise on vllm")


@dataclass
class ESConfig(SettingsDataclass):
    """Every setting of one ES run (`esgrpo.es.loop.train_es`).

    The update is ``theta += alpha / N * sum_n w_n sign_n eps_n`` (no 1/sigma: it is folded into
    alpha, as in the papers).
    """

    LABEL = "ES"
    # Settings that do not change the trajectory: a run may be resumed with more iterations, other
    # checkpoint and log intervals, or more snapshots.
    NOT_FINGERPRINTED = ("iterations", "checkpoint_every", "log_every", "snapshots", "js_samples", "js_every")

    population_size: int = field(default=32, metadata={
        "help": "N, the members per iteration (antithetic: N/2 noise draws, each used with + and -)."})
    sigma: float = field(default=1e-3, metadata={
        "help": "Noise scale: member n has theta + sign_n * sigma * eps_n."})
    alpha: float = field(default=5e-4, metadata={
        "help": "Step size of theta += alpha / N * sum_n w_n sign_n eps_n (1/sigma folded in)."})
    iterations: int = field(default=100, metadata={
        "help": "ES iterations (one update each, unless every member scored the same)."})
    prompts_per_iteration: int | None = field(default=64, metadata={
        "help": "Prompts each member is scored on per iteration; None: every training row."})
    resample_prompts: bool = field(default=True, metadata={
        "help": "Draw a fresh prompt batch per iteration, seeded by (seed, iteration); false: the same "
                "first `prompts_per_iteration` rows every time."})
    prompt_schedule: str = field(default="resample", metadata={
        "help": f"How the iterations' prompts are chosen, one of {PROMPT_SCHEDULES}: 'resample' as "
                "resample_prompts says; 'epochs' (paper B's code) passes over the training rows in epochs, "
                "each a permutation from one numpy.random.default_rng(prompt_seed) shuffling "
                "arange(rows) once per epoch, cut into batches of prompts_per_iteration, the last one "
                "shorter: every row once per epoch."})
    prompt_seed: int | None = field(default=None, metadata={
        "help": "Seed of the 'epochs' schedule (paper B: 42, its training seed); None: the run seed."})
    normalization: str = field(default="zscore", metadata={
        "help": f"Fitness shaping into update weights, one of {NORMALIZATIONS}: z-score (population std), "
                "centred ranks in [-0.5, 0.5], or the raw fitness."})
    # Off by default: paper B's public code defines only the z-score (docs/references.md), so nothing
    # says its rank / raw ablation rescaled the weights; off, the ablation compares shaping and step size
    # together (at N=16 a rank step is ~3.3x smaller than a z-scored one), on, the direction alone.
    unit_rms_weights: bool = field(default=False, metadata={
        "help": "Scale rank / raw ('none') weights to the z-score's second moment (sum w^2 = N) so that, at "
                "the same alpha, every normalization takes steps of the same expected size and only the "
                "direction differs; z-scores are unchanged. False: the unscaled weights (ranks in [-0.5, 0.5], "
                "raw uncentred fitness)."})
    # Low-rank noise (EGGROLL, arXiv 2511.16652): the forward shares x W^T across all members' rows and
    # adds (x B_n) A_n^T per member, so a population runs near the speed of batch inference
    # (benchmarks/es_throughput.py); E||eps||^2 = m n still, so the norm theory holds unchanged.
    noise: str = field(default="full", metadata={
        "help": f"Member noise, one of {NOISE_KINDS}: full-rank standard normal for every tensor, or low-rank "
                "eps = A B^T / sqrt(rank) for every 2-D tensor (A, B standard normal, drawn from the member seed "
                "and the tensor name; 1-D tensors keep full-rank noise)."})
    rank: int = field(default=1, metadata={
        "help": "r of low-rank noise (noise: lowrank); ignored for full-rank noise."})
    # The papers' arithmetic (docs: esgrpo.es.arithmetic; PAPERS.md calls it a trap), to measure what it makes
    # of their geometry findings: the defaults are the exact arithmetic, and a run with them keeps its
    # fingerprint (trajectory_settings leaves both keys out).
    noise_seeding: str = field(default="per_tensor", metadata={
        "help": f"How a member's noise is seeded, one of {NOISE_SEEDINGS}: per_tensor, from (member seed, tensor "
                "name) mixed by a hash (independent tensors); paper_a, the member seed alone for every tensor, "
                "drawn in the weights' dtype (same-shaped tensors get identical noise); paper_b, member seed XOR "
                "blake2b-8(tensor name), drawn in fp32. Full-rank noise only."})
    arithmetic: str = field(default="exact", metadata={
        "help": f"How the weights are perturbed, restored and updated, one of {ARITHMETICS}: exact, an fp32 master "
                "theta, members built from it and the update summed in fp32 and applied to it; inplace_sequential "
                "(paper A's), no master, perturb and restore by adding and subtracting sign sigma eps in the "
                "weights' dtype, the update N sequential adds of alpha / N * w_n sign_n eps_n; inplace_summed "
                "(paper B's), the same perturb and restore, the update summed in fp32, cast to the weights' dtype "
                "once and added. Full-rank noise only."})
    antithetic: bool = field(default=False, metadata={
        "help": "Mirrored sampling: members come in (+eps, -eps) pairs; needs an even population_size."})
    fitness_temperature: float = field(default=0.0, metadata={
        "help": "Sampling temperature of the fitness rollouts; 0 is greedy."})
    fitness_top_p: float = field(default=1.0, metadata={
        "help": "Nucleus (top-p) mass of sampled fitness rollouts (ignored when greedy)."})
    # Paper B's population diversity (docs/references.md): member m's success probability p_mq on prompt
    # q, the generalised JS divergence of the members' Bernoulli(p_mq), averaged over prompts
    # (`esgrpo.estimators.population_js_diversity`). Greedy fitness makes p_mq the 0/1 outcome of the one
    # fitness rollout, exactly. Sampled, one rollout is a 0/1 draw whose JS is the entropy of the batch's
    # success rate even among identical members, so p_mq is estimated from js_samples rollouts: the
    # fitness one and js_samples - 1 more, drawn from a seed of their own (the trajectory is the same
    # for every value), every js_every iterations. The plug-in estimate still reads high by about the
    # binary entropy's small-sample bias (identical members at p = 0.5: 0.15 nats with 4 samples,
    # ln 2 = 0.69 with 1).
    js_samples: int = field(default=4, metadata={
        "help": "Sampled rollouts per member and prompt behind the population's JS diversity when fitness is "
                "sampled (fitness_temperature > 0): the fitness rollout and js_samples - 1 more, not counted "
                "in the run's rollouts. 1: the fitness rollout alone (a 0/1 proxy). Ignored when greedy."})
    js_every: int = field(default=10, metadata={
        "help": "Iterations between JS diversity measurements when fitness is sampled and js_samples > 1 "
                "(the extra rollouts cost (js_samples - 1) / js_every of the fitness rollouts); other rows "
                "log NaN. Greedy fitness measures it every iteration, at no extra cost."})
    max_new_tokens: int = field(default=64, metadata={
        "help": "Completion budget of one fitness rollout, in tokens."})
    reward_scheme: str = field(default="binary", metadata={
        "help": f"Reward of a completion, one of {SCHEMES} (esgrpo.tasks.rewards); read by the reward function "
                "the caller wires into the backend, kept here so one config describes the run."})
    format_bonus: float = field(default=0.0, metadata={
        "help": "Reward added for a well-formatted answer (esgrpo.tasks.rewards), read like reward_scheme."})
    reward_rules: str = field(default="esgrpo", metadata={
        "help": f"Whose rules grade a completion, one of {RULES} (esgrpo.tasks.rewards, docs/rewards.md); set "
                "by the config's rewards.rules for training and evaluation alike."})
    seed: int = field(default=0, metadata={
        "help": "Run seed (>= 0): every draw of iteration t (member seeds, prompts, rollouts) comes from "
                "(seed, t), so a killed run resumes bit for bit."})
    trainable: list[str] = field(default_factory=lambda: ["*"], metadata={
        "help": "Glob patterns over parameter names (as `named_parameters` gives them); only matching "
                "tensors are perturbed and updated. A lone string is taken as one pattern."})
    checkpoint_every: int = field(default=10, metadata={
        "help": "Iterations between checkpoints in the progress folder; 0: only the final one."})
    log_every: int = field(default=1, metadata={
        "help": "Iterations between log lines."})
    snapshots: list[int] = field(default_factory=list, metadata={
        "help": "Iterations after which the model is also exported (out_dir/snapshots/it{K}/model): the run "
                "after K iterations is exactly a K-iteration run, so one run gives several budgets."})

    @property
    def noise_spec(self):
        """The members' noise, an `esgrpo.noise.Noise` (imported here: this module stays free of torch)."""
        from esgrpo.noise import Noise

        return Noise(self.noise, self.rank if self.noise == "lowrank" else 1, self.noise_seeding)

    def trajectory_settings(self) -> dict:
        """As `SettingsDataclass`'s, without the noise keys for full-rank noise: a full-rank run keeps the
        fingerprint it had before low-rank noise existed (its checkpoints still resume), and its rank is moot."""
        settings = super().trajectory_settings()
        if self.noise == "full":
            settings.pop("noise"), settings.pop("rank")
        if self.noise_seeding == "per_tensor":
            settings.pop("noise_seeding")
        if self.arithmetic == "exact":
            settings.pop("arithmetic")
        if self.prompt_schedule == "resample":  # as before the schedules existed (prompt_seed is moot)
            settings.pop("prompt_schedule"), settings.pop("prompt_seed")
        return settings

    def __post_init__(self) -> None:
        check = FieldCheck(self)
        check.integer("population_size", 2)
        check.number("sigma", 0.0, low_open=True)
        check.number("alpha", 0.0, low_open=True)
        check.integer("iterations", 0)
        if self.prompts_per_iteration is not None:
            check.integer("prompts_per_iteration", 1)
        check.boolean("resample_prompts")
        check.choice("prompt_schedule", PROMPT_SCHEDULES)
        if self.prompt_seed is not None:
            check.integer("prompt_seed", 0)
        if self.prompt_schedule == "epochs" and (not self.resample_prompts or self.prompts_per_iteration is None):
            raise check.error("prompt_schedule", "'epochs' needs resample_prompts: true and a prompts_per_iteration "
                                                 "(its batch size)")
        check.boolean("antithetic")
        check.choice("noise", NOISE_KINDS)
        check.integer("rank", 1)
        check.choice("noise_seeding", NOISE_SEEDINGS)
        check.choice("arithmetic", ARITHMETICS)
        if self.noise == "lowrank" and (self.noise_seeding != "per_tensor" or self.arithmetic != "exact"):
            raise check.error("noise", "'lowrank' needs noise_seeding per_tensor and arithmetic exact (the papers' "
                                       "seedings and arithmetic are full-rank)")
        check.choice("normalization", NORMALIZATIONS)
        check.boolean("unit_rms_weights")
        if self.antithetic and self.population_size % 2:
            raise check.error("population_size", "must be even when antithetic is true (members come in +/- pairs)")
        check.number("fitness_temperature", 0.0)  # 0 = greedy
        check.number("fitness_top_p", 0.0, 1.0, low_open=True)
        check.integer("js_samples", 1)
        check.integer("js_every", 1)
        check.integer("max_new_tokens", 1)
        check.choice("reward_scheme", SCHEMES)
        check.number("format_bonus")
        check.choice("reward_rules", RULES)
        check.integer("seed", 0)  # non-negative: it seeds numpy SeedSequences
        if isinstance(self.trainable, str):  # a lone pattern from YAML; iterating it would glob per letter
            self.trainable = [self.trainable]
        if not isinstance(self.trainable, (list, tuple)) or not self.trainable \
                or not all(isinstance(p, str) and p for p in self.trainable):
            raise check.error("trainable", "must be a non-empty list of glob patterns over parameter names")
        self.trainable = list(self.trainable)
        check.integer("checkpoint_every", 0)
        check.integer("log_every", 1)
        if not isinstance(self.snapshots, (list, tuple)) or not all(
                isinstance(k, int) and not isinstance(k, bool) and 1 <= k < self.iterations for k in self.snapshots):
            raise check.error("snapshots", f"must be a list of iteration counts in 1..{self.iterations - 1} "
                                           "(the final model is the run itself)")
        self.snapshots = sorted(set(self.snapshots))
