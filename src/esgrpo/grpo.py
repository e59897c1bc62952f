"""GRPO post-training through TRL's `GRPOTrainer`, logged and checkpointed like the ES trainer.

TRL does the algorithm (group sampling, group-normalised advantages, clipped surrogate,
optional KL); this module only wires the project into it:

- `GRPOSettings`: the run's settings under TRL's names, validated up front so a typo in a
  config fails with the field's name instead of deep inside TRL;
- `make_reward_function`: the project's one reward (`esgrpo.rewards.reward`) on the
  completion text only, in the calling convention TRL expects;
- `rows_to_dataset`: task rows -> a `datasets.Dataset` (per-task `meta` as JSON text, since
  Arrow needs one schema for every row);
- `train_grpo`: load, train, write `metrics.jsonl` rows in the ES schema where the two
  overlap (so one table reads both methods), resume from TRL checkpoints after a kill, save
  the final model in HF layout and a `summary.json`.

The prompt order is decided here, not by TRL's sampler: TRL reshuffles each epoch from a
stateful generator that a resumed run does not fast-forward, so a run resumed after its
first pass over the rows would see other prompts than an uninterrupted one. Handing TRL one
pre-ordered "epoch" of exactly `steps` batches makes a resumed run replay the same batches.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esgrpo.io import read_jsonl, write_json, write_jsonl
from esgrpo.rewards import SCHEMES, VERIFIERS, reward
from esgrpo.settings import FieldCheck, dataclass_from_dict

__all__ = [
    "ES_SHARED_KEYS",
    "GRPOSettings",
    "LOSS_TYPES",
    "LR_SCHEDULERS",
    "SCALE_REWARDS",
    "make_reward_function",
    "prompt_order",
    "rows_to_dataset",
    "train_grpo",
]

Row = dict[str, Any]

# --------------------------------------------------------------------------- settings

# Only the losses whose meaning the papers' GRPO shares (token-level clipped surrogate);
# TRL's others (cispo, sapo, ...) change the algorithm being compared.
LOSS_TYPES = ("dapo", "grpo", "dr_grpo", "bnpo")
SCALE_REWARDS = ("group", "batch", "none")
LR_SCHEDULERS = ("linear", "constant", "constant_with_warmup", "cosine")

# metrics.jsonl keys that mean the same thing in an ES row (`esgrpo.es.train_es`), so a table
# can put the two methods side by side. fitness_* is a mean reward in both: for ES the mean
# over a member's prompts, for GRPO over every completion of the step.
ES_SHARED_KEYS = ("method", "iteration", "fitness_mean", "fitness_std", "entropy", "rollouts",
                  "generated_tokens", "seconds", "distance_from_init", "update_norm", "updates", "prompts")


@dataclass
class GRPOSettings:
    """Every setting of one GRPO run, named as in TRL's `GRPOConfig` where TRL has the setting.

    A step samples `num_generations` completions for each of `prompts_per_step` prompts and
    takes one optimiser step on them (on-policy, TRL's `num_iterations` = 1 as in both papers).
    Defaults are tuned for the tiny CPU model (learning rate 5e-4); paper values (lr 1e-5 or
    3e-6, 63 prompts x 8, top_p 0.95, 1024 tokens) belong in the paper configs.
    `gradient_accumulation_steps` splits the step's completions into that many backward passes
    (memory on a GPU); the completions are still generated together and the step is the same.
    `save_every` 0 saves no intermediate checkpoint (a killed run then restarts from step 0).
    """

    num_generations: int = 8
    prompts_per_step: int = 16
    learning_rate: float = 5e-4
    lr_scheduler_type: str = "linear"
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    beta: float = 0.0  # KL coefficient; paper A uses 0 (KL only tracked)
    epsilon: float = 0.2
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    max_grad_norm: float = 1.0
    steps: int = 60
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 24  # the evaluation's default budget: train on what is graded
    reward_scheme: str = "binary"
    format_bonus: float = 0.0
    seed: int = 0
    save_every: int = 10
    gradient_accumulation_steps: int = 1
    use_vllm: bool = False  # GPU only; runs vLLM inside the training process (vllm_mode="colocate")
    bf16: bool = False  # mixed precision (fp32 master weights); GPU only

    def __post_init__(self) -> None:
        check = FieldCheck(self)
        # Group-normalised advantages need at least two completions per prompt.
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
        check.number("max_grad_norm", 0.0)  # 0 disables clipping, as in transformers
        check.integer("steps", 1)
        check.number("temperature", 0.0, low_open=True)  # GRPO samples; greedy groups would all agree
        check.number("top_p", 0.0, 1.0, low_open=True)
        check.integer("max_new_tokens", 1)
        check.choice("reward_scheme", SCHEMES)
        check.number("format_bonus")
        check.integer("seed", 0)
        check.integer("save_every", 0)
        check.integer("gradient_accumulation_steps", 1)
        if (self.prompts_per_step * self.num_generations) % self.gradient_accumulation_steps:
            raise check.error("gradient_accumulation_steps",
                              f"must divide prompts_per_step * num_generations = "
                              f"{self.prompts_per_step * self.num_generations}")
        check.boolean("use_vllm")
        check.boolean("bf16")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GRPOSettings:
        """Build from a plain mapping (a config section); unknown keys are an error, not ignored."""
        return dataclass_from_dict(cls, d, "GRPO")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def completions_per_step(self) -> int:
        return self.prompts_per_step * self.num_generations


# --------------------------------------------------------------------------- reward and data


def _completion_text(completion: Any) -> str:
    """The text the model wrote: a plain string, or the content of a conversational completion.

    TRL hands conversational completions as ``[{"role": "assistant", "content": text}]``; the
    prompt is never part of it, so the verifier grades the completion alone.
    """
    if isinstance(completion, str):
        return completion
    parts: list[str] = []
    for message in completion:
        if message.get("role", "assistant") != "assistant":
            continue
        content = message.get("content", "")
        if isinstance(content, str):
            parts.append(content)
        else:  # content blocks: keep the text ones
            parts.extend(block.get("text", "") for block in content if block.get("type") == "text")
    return "".join(parts)


def _decode_meta(meta: Any) -> dict:
    """Row meta as a dict: the JSON text `rows_to_dataset` stores, or a dict given directly."""
    if meta is None:
        return {}
    if isinstance(meta, str):
        return json.loads(meta) if meta else {}
    return dict(meta)


def make_reward_function(verifier: str, scheme: str = "binary",
                         format_bonus: float = 0.0) -> Callable[..., list[float]]:
    """A TRL reward function ``fn(completions, answer, meta=None, **kw) -> list[float]``.

    It is `esgrpo.rewards.reward(verifier, completion_text, answer, meta, scheme, format_bonus)`
    per completion, the same function ES and evaluation use. `meta` entries may be JSON text
    (as stored by `rows_to_dataset`) or dicts. TRL logs the mean under ``rewards/<__name__>``.
    """
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; allowed: {sorted(VERIFIERS)}")
    if scheme not in SCHEMES:
        raise ValueError(f"unknown reward scheme {scheme!r}; allowed: {list(SCHEMES)}")
    bonus = float(format_bonus)

    def reward_fn(completions: Sequence[Any], answer: Sequence[Any], meta: Sequence[Any] | None = None,
                  **kwargs: Any) -> list[float]:
        metas = meta if meta is not None else [None] * len(completions)
        if not len(completions) == len(answer) == len(metas):
            raise ValueError(f"{len(completions)} completions, {len(answer)} answers, {len(metas)} metas")
        return [reward(verifier, _completion_text(c), str(a), _decode_meta(m), scheme, bonus)
                for c, a, m in zip(completions, answer, metas, strict=True)]

    reward_fn.__name__ = f"{verifier}_reward"
    reward_fn.__qualname__ = reward_fn.__name__
    return reward_fn


def rows_to_dataset(rows: Sequence[Row]):
    """A `datasets.Dataset` with columns prompt (chat messages), answer, meta (JSON text), id."""
    from datasets import Dataset

    if not rows:
        raise ValueError("no rows")
    records = []
    for i, row in enumerate(rows):
        missing = [k for k in ("prompt", "answer") if k not in row]
        if missing:
            raise ValueError(f"row {i} ({row.get('id')!r}) lacks {missing}")
        records.append({
            "id": str(row.get("id", i)),
            "prompt": row["prompt"],
            "answer": str(row["answer"]),
            # One schema for every row: meta dicts differ per task (numbers/target, solution, ...).
            "meta": json.dumps(row.get("meta") or {}, sort_keys=True),
        })
    return Dataset.from_list(records)


def prompt_order(n_rows: int, steps: int, prompts_per_step: int, seed: int) -> list[int]:
    """Row indices in training order: `steps` batches of `prompts_per_step` distinct rows.

    Passes over the rows in a fresh seeded permutation each; a pass's tail that cannot fill a
    batch is dropped (as TRL's sampler does), so no batch repeats a prompt.
    """
    if prompts_per_step > n_rows:
        raise ValueError(f"GRPOSettings.prompts_per_step must be <= the {n_rows} training rows, "
                         f"got {prompts_per_step}")
    per_pass = n_rows // prompts_per_step
    order: list[int] = []
    for epoch in range(math.ceil(steps / per_pass)):
        perm = np.random.default_rng(np.random.SeedSequence([int(seed), epoch, 7])).permutation(n_rows)
        order.extend(int(i) for i in perm[:per_pass * prompts_per_step])
    return order[:steps * prompts_per_step]


# --------------------------------------------------------------------------- progress folder
# progress_dir/checkpoint-N/      TRL checkpoints (model, optimiser, scheduler, RNG, trainer_state.json)
# progress_dir/metrics.jsonl      every logged step so far (rewritten atomically each step)
# progress_dir/run.json           fingerprint of the run the checkpoints belong to

_CHECKPOINT = "checkpoint-"
# Settings that do not change the trajectory. `steps` does (the linear schedule depends on it).
_NOT_FINGERPRINTED = ("save_every",)


def _checkpoints(progress_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in progress_dir.glob(f"{_CHECKPOINT}*"):
        suffix = path.name[len(_CHECKPOINT):]
        if path.is_dir() and suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def _complete(checkpoint: Path) -> bool:
    """Whether TRL finished writing this checkpoint: trainer_state.json is its last file."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return (checkpoint / "optimizer.pt").exists()


def _last_complete_checkpoint(progress_dir: Path, log: Callable[[str], Any]) -> tuple[int, Path] | None:
    """The newest whole checkpoint; torn ones (a kill mid-save) are deleted so TRL never picks them."""
    for step, path in reversed(_checkpoints(progress_dir)):
        if _complete(path):
            return step, path
        log(f"grpo: removing incomplete checkpoint {path}")
        shutil.rmtree(path, ignore_errors=True)
    return None


def _fingerprint(settings: GRPOSettings, rows: Sequence[Row], theta0: Mapping[str, torch.Tensor]) -> str:
    digest = hashlib.blake2b(digest_size=16)
    kept = {k: v for k, v in settings.to_dict().items() if k not in _NOT_FINGERPRINTED}
    digest.update(json.dumps({"settings": kept, "rows": list(rows)}, sort_keys=True, default=str).encode())
    for name, value in theta0.items():  # the starting weights: another init model is another run
        digest.update(name.encode())
        digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _prepare_progress(progress_dir: Path, fingerprint: str, log: Callable[[str], Any]) -> tuple[int, Path] | None:
    """Keep the progress of the same run, clear anything else; return the checkpoint to resume."""
    run_file = progress_dir / "run.json"
    previous = None
    if run_file.exists():
        try:
            previous = json.loads(run_file.read_text()).get("fingerprint")
        except ValueError:
            previous = None
    if previous != fingerprint:
        if _checkpoints(progress_dir) or (progress_dir / "metrics.jsonl").exists():
            log(f"grpo: {progress_dir} holds another run (settings, rows or start model differ); starting afresh")
        for _, path in _checkpoints(progress_dir):
            shutil.rmtree(path, ignore_errors=True)
        (progress_dir / "metrics.jsonl").unlink(missing_ok=True)
        write_json(run_file, {"fingerprint": fingerprint})
        return None
    return _last_complete_checkpoint(progress_dir, log)


# --------------------------------------------------------------------------- metrics callback


def _float(value: Any) -> float:
    if value is None:
        return math.nan
    return float(value.item() if hasattr(value, "item") else value)


def _callback_class():
    """The callback, built lazily so importing this module does not import transformers."""
    from transformers import TrainerCallback

    class GRPOMetricsCallback(TrainerCallback):
        """Writes one ES-schema row per optimiser step to metrics.jsonl (progress_dir and out_dir).

        Geometry is measured here because TRL does not: distance_from_init against an fp32
        copy of the starting weights, update_norm against an fp32 copy taken just before the
        optimiser step. Cumulative totals (rollouts, tokens, seconds) continue from the rows
        of the checkpoint a run resumes from.
        """

        def __init__(self, model: torch.nn.Module, settings: GRPOSettings, rows_so_far: list[dict],
                     metrics_paths: Sequence[Path], log: Callable[[str], Any]) -> None:
            self.model = model
            self.settings = settings
            self.rows = rows_so_far
            self.metrics_paths = list(metrics_paths)
            self.log = log
            self.theta0 = self._snapshot()
            self.before: dict[str, torch.Tensor] = {}
            last = rows_so_far[-1] if rows_so_far else {}
            self.totals = {k: last.get(k, 0) for k in ("rollouts", "generated_tokens", "seconds")}
            self.step_began = 0.0
            self.pending: dict[str, float] = {}

        def _snapshot(self) -> dict[str, torch.Tensor]:
            """fp32 copies of every parameter (tied weights once, as in ES), kept in CPU memory.

            On a GPU the two copies would cost 8 bytes per parameter next to the optimiser
            state and vLLM; in host memory they cost one transfer per step.
            """
            return {n: p.detach().to("cpu", torch.float32, copy=True) for n, p in self.model.named_parameters()}

        def _norm_to(self, reference: Mapping[str, torch.Tensor]) -> float:
            """||theta - reference||_2 over all parameters, one tensor at a time on the parameter's device."""
            total = 0.0
            for name, p in self.model.named_parameters():
                ref = reference[name].to(p.device)
                total += float((p.detach().to(torch.float32) - ref).double().pow(2).sum())
            return math.sqrt(total)

        def on_step_begin(self, args, state, control, **kwargs):
            self.step_began = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            self.before = self._snapshot()

        def on_step_end(self, args, state, control, **kwargs):
            # Timed from step begin (generation + scoring + backward + optimiser), not logging/saving, as ES.
            seconds = time.perf_counter() - self.step_began
            self.pending = {
                "seconds_step": seconds,
                "update_norm": self._norm_to(self.before) if self.before else math.nan,
                "distance_from_init": self._norm_to(self.theta0),
            }
            self.before = {}

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "reward" not in logs:  # the end-of-training summary log, not a step
                return
            s = self.settings
            step = int(state.global_step)
            completions = s.completions_per_step
            mean_length = _float(logs.get("completions/mean_length"))
            self.totals["rollouts"] += completions
            # TRL's num_tokens also counts prompt tokens; mean length x count is the exact completion total.
            self.totals["generated_tokens"] += int(round(mean_length * completions))
            self.totals["seconds"] += self.pending.get("seconds_step", 0.0)
            row = {
                "method": "grpo",
                "iteration": step,
                "updates": step,
                "prompts": s.prompts_per_step,
                "fitness_mean": _float(logs.get("reward")),
                "fitness_std": _float(logs.get("reward_std")),
                "entropy": _float(logs.get("entropy")),
                "frac_reward_zero_std": _float(logs.get("frac_reward_zero_std")),
                "loss": _float(logs.get("loss")),
                "grad_norm": _float(logs.get("grad_norm")),
                "learning_rate": _float(logs.get("learning_rate")),
                "completion_mean_length": mean_length,
                "truncated_fraction": _float(logs.get("completions/clipped_ratio")),
                "update_norm": self.pending.get("update_norm", math.nan),
                "distance_from_init": self.pending.get("distance_from_init", math.nan),
                "rollouts": self.totals["rollouts"],
                "generated_tokens": self.totals["generated_tokens"],
                "seconds": self.totals["seconds"],
                "seconds_step": self.pending.get("seconds_step", math.nan),
            }
            if s.beta != 0.0:
                row["kl"] = _float(logs.get("kl"))
            self.pending = {}
            # Rows are keyed by step: a step replayed after a resume replaces, never duplicates.
            self.rows = [r for r in self.rows if r["iteration"] < step] + [row]
            for path in self.metrics_paths:  # progress_dir's copy is the one a resume reads
                write_jsonl(path, self.rows)
            self.log(f"grpo step {step}/{s.steps} reward {row['fitness_mean']:.4f}±{row['fitness_std']:.4f} "
                     f"zero-std {row['frac_reward_zero_std']:.2f} entropy {row['entropy']:.3f} "
                     f"|step| {row['update_norm']:.3e} dist {row['distance_from_init']:.3e} "
                     f"len {mean_length:.1f} {row['seconds_step']:.2f}s")

    return GRPOMetricsCallback


# --------------------------------------------------------------------------- the trainer


def _grpo_config(settings: GRPOSettings, progress_dir: Path, cuda: bool):
    """TRL's GRPOConfig with the project's settings and CPU-safe overrides of TRL's GPU defaults."""
    from trl import GRPOConfig

    s = settings
    kwargs: dict[str, Any] = {}
    if s.use_vllm:
        kwargs.update(use_vllm=True, vllm_mode="colocate")
    return GRPOConfig(
        output_dir=str(progress_dir),
        max_steps=s.steps,
        per_device_train_batch_size=s.completions_per_step // s.gradient_accumulation_steps,
        gradient_accumulation_steps=s.gradient_accumulation_steps,
        num_generations=s.num_generations,
        max_completion_length=s.max_new_tokens,
        learning_rate=s.learning_rate,
        lr_scheduler_type=s.lr_scheduler_type,
        warmup_steps=s.warmup_ratio,  # transformers 5: a value < 1 is a fraction of max_steps
        weight_decay=s.weight_decay,
        max_grad_norm=s.max_grad_norm,
        beta=s.beta,
        epsilon=s.epsilon,
        loss_type=s.loss_type,
        scale_rewards=s.scale_rewards,
        temperature=s.temperature,
        top_p=s.top_p,
        seed=s.seed,
        data_seed=s.seed,
        # The prompt order is fixed by `prompt_order` (see the module docstring).
        shuffle_dataset=False,
        # CPU-hostile defaults of TRL/transformers, and no logging services.
        bf16=bool(s.bf16 and cuda),
        # TRL defaults to checkpointing on; transformers 5 names it activation_checkpointing.
        activation_checkpointing=False,
        use_cpu=not cuda,
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        save_strategy="steps" if s.save_every else "no",
        save_steps=s.save_every or 1,
        # Two, so a kill while the newest is being written still leaves a whole one behind.
        save_total_limit=2,
        dataloader_num_workers=0,
        **kwargs,
    )


def train_grpo(model_dir_or_ref: str | os.PathLike, rows: Sequence[Row], verifier: str,
               settings: GRPOSettings | Mapping[str, Any], out_dir: str | os.PathLike,
               progress_dir: str | os.PathLike, log: Callable[[str], Any] = print) -> dict[str, Any]:
    """Run GRPO from `model_dir_or_ref` and write `out_dir`/{model/, metrics.jsonl, summary.json}.

    rows: task rows {id, prompt (chat messages), answer, meta}; verifier: a name in
    `esgrpo.rewards.VERIFIERS`. TRL checkpoints go to `progress_dir` every
    `settings.save_every` steps; a rerun with the same settings, rows and start model resumes
    from the newest whole checkpoint (another run's leftovers are cleared). Returns the summary.
    """
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    from esgrpo.models import load_model, save_model

    settings = settings if isinstance(settings, GRPOSettings) else GRPOSettings.from_dict(settings)
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; allowed: {sorted(VERIFIERS)}")
    if not rows:
        raise ValueError("no training rows")
    rows = list(rows)
    cuda = torch.cuda.is_available()
    if (settings.use_vllm or settings.bf16) and not cuda:
        raise ValueError("GRPOSettings.use_vllm and .bf16 need a CUDA GPU; set them to false on CPU")
    order = prompt_order(len(rows), settings.steps, settings.prompts_per_step, settings.seed)
    out_dir, progress_dir = Path(out_dir), Path(progress_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress_dir.mkdir(parents=True, exist_ok=True)

    # fp32 weights: with bf16 on, TRL/accelerate autocast and keep fp32 master weights.
    model, tokenizer = load_model(model_dir_or_ref, dtype="float32", device="cuda" if cuda else "cpu")
    use_cache = getattr(model.config, "use_cache", True)
    theta0 = {n: p.detach().to(torch.float32) for n, p in model.named_parameters()}
    fingerprint = _fingerprint(settings, rows, theta0)
    resume = _prepare_progress(progress_dir, fingerprint, log)
    metrics_path = progress_dir / "metrics.jsonl"
    rows_so_far: list[dict] = []
    if resume is not None:
        resumed_step = resume[0]
        kept = read_jsonl(metrics_path) if metrics_path.exists() else []
        rows_so_far = [r for r in kept if r["iteration"] <= resumed_step]
        if [r["iteration"] for r in rows_so_far] != list(range(1, resumed_step + 1)):
            # Cumulative totals would be wrong without every earlier row: restart rather than guess.
            log(f"grpo: metrics of {progress_dir} do not cover checkpoint {resumed_step}; starting afresh")
            for _, path in _checkpoints(progress_dir):
                shutil.rmtree(path, ignore_errors=True)
            resume, rows_so_far = None, []
        else:
            log(f"grpo: resuming after step {resumed_step} of {settings.steps} from {resume[1]}")
    if resume is None:
        write_jsonl(metrics_path, [])
        (out_dir / "metrics.jsonl").unlink(missing_ok=True)  # a previous run's rows must not linger
        log(f"grpo: fresh run, {sum(t.numel() for t in theta0.values()):,} parameters, "
            f"{settings.prompts_per_step} prompts x {settings.num_generations} completions, {settings.steps} steps")

    dataset = rows_to_dataset([rows[i] for i in order])
    callback = _callback_class()(model, settings, rows_so_far, [metrics_path, out_dir / "metrics.jsonl"], log)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[make_reward_function(verifier, settings.reward_scheme, settings.format_bonus)],
        args=_grpo_config(settings, progress_dir, cuda),
        train_dataset=dataset,
        processing_class=tokenizer,  # without it TRL would look for a tokenizer on the Hub
        callbacks=[callback],
    )
    trainer.remove_callback(PrinterCallback)  # it prints every raw log dict; the callback logs a line instead
    trainer.train(resume_from_checkpoint=str(resume[1]) if resume is not None else None)

    metrics = callback.rows
    if [r["iteration"] for r in metrics] != list(range(1, settings.steps + 1)):
        raise RuntimeError(f"grpo: expected one metrics row per step 1..{settings.steps}, "
                           f"got {[r['iteration'] for r in metrics]}")
    trained = trainer.model
    trained.eval()
    # Training turns the KV cache off in the config; the saved model should generate as the base did.
    trained.config.use_cache = use_cache
    save_model(trained, tokenizer, out_dir / "model")
    write_jsonl(out_dir / "metrics.jsonl", metrics)
    last = metrics[-1]
    summary = {
        "method": "grpo",
        "steps": settings.steps,
        "iterations": settings.steps,  # the ES summary's name for the same count
        "parameters": sum(t.numel() for t in callback.theta0.values()),
        "final_fitness_mean": last["fitness_mean"],
        "best_fitness_mean": max(r["fitness_mean"] for r in metrics),
        "rollouts": last["rollouts"],
        "generated_tokens": last["generated_tokens"],
        "seconds": last["seconds"],
        "distance_from_init": callback._norm_to(callback.theta0),
        "resumed_from": resume[0] if resume is not None else None,
        "settings": settings.to_dict(),
    }
    write_json(out_dir / "summary.json", summary)
    return summary
