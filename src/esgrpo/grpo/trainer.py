"""GRPO post-training through TRL's `GRPOTrainer`, logged and checkpointed like the ES trainer.

TRL does the algorithm (group sampling, group-normalised advantages, clipped surrogate,
optional KL); this module only wires the project into it:

- `GRPOSettings` (`esgrpo.grpo.settings`): the run's settings under TRL's names, validated up
  front so a typo in a config fails with the field's name instead of deep inside TRL;
- `make_reward_function`: the project's one reward (`esgrpo.tasks.rewards.reward`) on the
  completion text only, in the calling convention TRL expects;
- `rows_to_dataset`: task rows -> a `datasets.Dataset` (per-task `meta` as JSON text, since
  Arrow needs one schema for every row);
- `train_grpo`: load, train, write `metrics.jsonl` rows of the record ES writes too (`esgrpo.run_record`,
  through `esgrpo.grpo.callbacks`: one table reads both methods), resume from TRL checkpoints after a kill (the
  progress folder: `esgrpo.progress`), save the final model in HF layout; return the run's summary.

The prompt order is decided here, not by TRL's sampler: TRL reshuffles each epoch from a
stateful generator that a resumed run does not fast-forward, so a run resumed after its
first pass over the rows would see other prompts than an uninterrupted one. Handing TRL one
pre-ordered "epoch" of exactly `steps` batches makes a resumed run replay the same batches.

Memory on a GPU (`GRPOSettings`, chosen per job by `esgrpo.plan`): bf16 autocast over fp32 weights
and AdamW state, activation checkpointing, the step's completions in micro-batches (TRL generates
them together and takes one optimiser step on them whatever the micro-batch), and the colocated vLLM
engine's share of the GPU and its context (prompt + completion). A run with num_processes > 1 is
this same function in one process per GPU, started by `esgrpo.grpo.launch` (accelerate: DDP,
ZeRO-3 or FSDP); rank 0 writes every file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from esgrpo.engines.vllm_engine import on_vllm_cpu, size_cpu_kv_cache
from esgrpo.files import read_jsonl, write_jsonl
from esgrpo.grpo.callbacks import MetricsRows, callback_class
from esgrpo.grpo.distributed import load_policy, main_first, rank, save_policy, world_size
from esgrpo.grpo.settings import GRPOSettings
from esgrpo.live import LiveLog, LiveSettings
from esgrpo.progress import ProgressFolder, fingerprint
from esgrpo.run_record import RunSummary
from esgrpo.tasks.rewards import DEFAULT_RULES, SCHEMES, VERIFIERS, check_rules, reward

__all__ = [
    "grpo_trainer",
    "make_reward_function",
    "prompt_order",
    "rows_to_dataset",
    "train_grpo",
]

Row = dict[str, Any]


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


def make_reward_function(verifier: str, scheme: str = "binary", format_bonus: float = 0.0,
                         rules: str = DEFAULT_RULES) -> Callable[..., list[float]]:
    """A TRL reward function ``fn(completions, answer, meta=None, **kw) -> list[float]``.

    It is `esgrpo.tasks.rewards.reward(verifier, completion_text, answer, meta, scheme, format_bonus, rules)`
    per completion, the same function ES and evaluation use. `meta` entries may be JSON text
    (as stored by `rows_to_dataset`) or dicts. TRL logs the mean under ``rewards/<__name__>``.
    """
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; allowed: {sorted(VERIFIERS)}")
    if scheme not in SCHEMES:
        raise ValueError(f"unknown reward scheme {scheme!r}; allowed: {list(SCHEMES)}")
    check_rules(rules)
    bonus = float(format_bonus)

    def reward_fn(completions: Sequence[Any], answer: Sequence[Any], meta: Sequence[Any] | None = None,
                  **kwargs: Any) -> list[float]:
        metas = meta if meta is not None else [None] * len(completions)
        if not len(completions) == len(answer) == len(metas):
            raise ValueError(f"{len(completions)} completions, {len(answer)} answers, {len(metas)} metas")
        return [reward(verifier, _completion_text(c), str(a), _decode_meta(m), scheme, bonus, rules)
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
# progress_dir/run.json           fingerprint of the run the checkpoints belong to (`esgrpo.progress`)

CHECKPOINT_PREFIX = "checkpoint-"


# Where a checkpoint keeps its optimiser state: one process or DDP (optimizer.pt), FSDP (optimizer.bin
# or the sharded optimizer_0/), DeepSpeed (global_step<N>/ with every rank's partition).
_OPTIMIZER_STATE = ("optimizer.pt", "optimizer.bin", "optimizer_0", "global_step*")


def _complete(checkpoint: Path) -> bool:
    """Whether TRL finished writing this checkpoint: trainer_state.json is its last file."""
    try:
        json.loads((checkpoint / "trainer_state.json").read_text())
    except (OSError, ValueError):
        return False
    return any(any(checkpoint.glob(pattern)) for pattern in _OPTIMIZER_STATE)


def _last_complete_checkpoint(progress: ProgressFolder, log: Callable[[str], Any]) -> tuple[int, Path] | None:
    """The newest whole checkpoint; torn ones (a kill mid-save) are deleted so TRL never picks them."""
    for step, path in reversed(progress.checkpoints()):
        if _complete(path):
            return step, path
        log(f"grpo: removing incomplete checkpoint {path}")
        shutil.rmtree(path, ignore_errors=True)
    return None


def _resume_point(progress: ProgressFolder, run_id: str, settings: GRPOSettings,
                  log: Callable[[str], Any], main: bool = True) -> tuple[tuple[int, Path] | None, list[dict]]:
    """(the checkpoint to resume, the metrics rows up to it) of this very run, or (None, []) after
    clearing the folder for a fresh start (another run's checkpoints, or rows that do not cover one).

    Only the main process (rank 0) clears and writes; the other ranks, which look after it, read.
    """
    metrics_path = progress.path / "metrics.jsonl"
    if not main:
        found = progress.checkpoints() if progress.holds(run_id) else []
        resume = next(((step, path) for step, path in reversed(found) if _complete(path)), None)
        return resume, []
    if progress.holds(run_id) and (resume := _last_complete_checkpoint(progress, log)) is not None:
        kept = read_jsonl(metrics_path) if metrics_path.exists() else []
        rows_so_far = [r for r in kept if r["iteration"] <= resume[0]]
        if [r["iteration"] for r in rows_so_far] == list(range(1, resume[0] + 1)):
            log(f"grpo: resuming after step {resume[0]} of {settings.steps} from {resume[1]}")
            return resume, rows_so_far
        # Cumulative totals would be wrong without every earlier row: restart rather than guess.
        log(f"grpo: metrics of {progress.path} do not cover checkpoint {resume[0]}; starting afresh")
    elif not progress.holds(run_id) and (progress.checkpoints() or metrics_path.exists()):
        log(f"grpo: {progress.path} holds another run (settings, rows or start model differ); starting afresh")
    progress.start_fresh(run_id, also=("metrics.jsonl",))
    write_jsonl(metrics_path, [])
    return None, []


# --------------------------------------------------------------------------- the trainer


def _checkpointing_field() -> str:
    """TrainingArguments' name for activation checkpointing: `activation_checkpointing` from transformers
    5.18, `gradient_checkpointing` before (the GPU env pins 5.17, where the new name is a TypeError)."""
    from trl import GRPOConfig

    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    return "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"


def grpo_config_kwargs(settings: GRPOSettings, progress_dir: Path, cuda: bool,
                       max_model_len: int | None = None) -> dict[str, Any]:
    """TRL's GRPOConfig arguments for the project's settings, with CPU-safe overrides of TRL's GPU defaults.

    Batching: TRL's generation batch is per_device_train_batch_size x processes x
    gradient_accumulation_steps (steps_per_generation defaults to the accumulation), and it generates
    that batch once per optimiser step; so the micro-batch is the step's completions / (processes x
    accumulation) and every step still samples prompts_per_step x num_generations completions.
    max_model_len: the colocated vLLM engine's context (prompt + completion; see `grpo_trainer`).
    """
    s = settings
    bf16 = cuda if s.bf16 is None else s.bf16
    checkpointing = cuda if s.activation_checkpointing is None else s.activation_checkpointing
    kwargs: dict[str, Any] = {}
    if s.use_vllm:
        kwargs.update(use_vllm=True, vllm_mode="colocate", vllm_gpu_memory_utilization=s.vllm_gpu_memory_utilization,
                      vllm_max_model_length=max_model_len)
    return dict(
        output_dir=str(progress_dir),
        max_steps=s.steps,
        per_device_train_batch_size=s.micro_batch,
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
        # bf16 autocast over the fp32 model (accelerate keeps fp32 weights, gradients and AdamW state).
        bf16=bool(bf16),
        # TRL's default is on; off on a CPU, where memory is not short and recomputing costs time. Under
        # FSDP the accelerate config checkpoints instead (transformers refuses both at once).
        **{_checkpointing_field(): bool(checkpointing) and s.sharding != "fsdp"},
        use_cpu=not cuda,
        logging_steps=1,
        # Live curves go through the callback (`esgrpo.live`), under the tags ES writes too; TRL's own
        # integrations would log a second copy of the same curves under TRL's names.
        report_to="none",
        disable_tqdm=True,
        save_strategy="steps" if s.save_every else "no",
        save_steps=s.save_every or 1,
        # Two, so a kill while the newest is being written still leaves a whole one behind.
        save_total_limit=2,
        dataloader_num_workers=0,
        **kwargs,
    )


def _grpo_config(settings: GRPOSettings, progress_dir: Path, cuda: bool, max_model_len: int | None = None):
    """TRL's GRPOConfig (`grpo_config_kwargs`), checked to sample the step's completions in one generation batch."""
    from trl import GRPOConfig

    config = GRPOConfig(**grpo_config_kwargs(settings, progress_dir, cuda, max_model_len))
    if config.generation_batch_size != settings.completions_per_step or config.num_iterations != 1:
        raise RuntimeError(f"TRL would generate {config.generation_batch_size} completions per optimiser step "
                           f"(x {config.num_iterations} iterations) on {config.world_size} process(es), not "
                           f"{settings.completions_per_step}: launch num_processes={settings.num_processes}")
    return config


def _vllm_max_model_len(settings: GRPOSettings, tokenizer: Any, rows: Sequence[Row]) -> int:
    """The colocated engine's context: the settings' (the plan's), checked, or the longest prompt + completion."""
    from esgrpo.engines.vllm_engine import context_length, prompt_token_ids

    lengths = (len(ids) for ids in prompt_token_ids(tokenizer, rows))
    return context_length(lengths, settings.max_new_tokens, settings.vllm_max_model_length, settings.max_prompt_tokens)


def _check_vllm_dtype(trainer: Any, settings: GRPOSettings) -> None:
    """vLLM must generate in bf16 beside bf16 training, also from an fp32 checkpoint (an earlier stage's).

    TRL builds the colocated LLM with vLLM's dtype "auto", which casts an fp32 config to the platform's
    first dtype (bf16 on Ampere and later: vllm/config/model.py `_resolve_auto_dtype` in vLLM 0.31); a
    platform that keeps fp32 would double vLLM's weights and halve its KV cache, so it is an error.
    """
    engine = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    dtype = engine.llm_engine.model_config.dtype if engine is not None else None
    if settings.bf16 is not False and dtype is not None and dtype != torch.bfloat16:
        raise RuntimeError(f"TRL's colocated vLLM engine runs {dtype}, not bfloat16 (training is bf16)")


def _current_checkpointing_name(model: torch.nn.Module) -> None:
    """Answer TRL's `model.is_gradient_checkpointing` with transformers' current name for it.

    TRL 1.16 reads `is_gradient_checkpointing` before every generation (trl/models/utils.py:
    `unwrap_model_for_generation`, `disable_gradient_checkpointing`). From transformers 5.18 that property
    is a deprecated alias of `is_activation_checkpointing` that warns (transformers/modeling_utils.py);
    the warning shows once, then again after every checkpoint save, because the Trainer saves the
    scheduler inside `warnings.catch_warnings()`, which resets Python's once-per-location registry. The
    model's class gets a same-named subclass whose `is_gradient_checkpointing` is the current property:
    the same value, no deprecated call. (The class name is what `save_pretrained` writes to the config's
    `architectures`, so it stays the same.) On transformers < 5.18 there is nothing to do.
    """
    cls = type(model)
    current = getattr(cls, "is_activation_checkpointing", None)
    if current is None or cls.__dict__.get("_esgrpo_current_name"):
        return
    model.__class__ = type(cls.__name__, (cls,), {"is_gradient_checkpointing": current,
                                                  "_esgrpo_current_name": True, "__module__": cls.__module__})


@contextlib.contextmanager
def _colocated_engine_on_cpu(active: bool):
    """While TRL builds its colocated engine on vLLM's CPU build (`active`): a KV cache of its own size
    (`size_cpu_kv_cache`), and linear layers that keep their weights, so that TRL's weight sync works.

    vLLM's CPU backend packs each linear layer's weight for oneDNN after loading and leaves an empty
    `weight` Parameter without its `weight_loader` (dispatch_cpu_unquantized_gemm in
    vllm/model_executor/layers/utils.py, vLLM 0.31); TRL's colocated sync (`model.load_weights` in
    trl/generation/vllm_generation.py) then fails with "'Parameter' object has no attribute
    'weight_loader'" at the first generation (TRL's server mode is no way out: its weight sync needs
    CUDA's NCCL, `VLLMClient.init_communicator`). vLLM's own `_cpu_skip_gemm_dispatch` switch (set for
    MLA's kv_b_proj) keeps the weight and computes F.linear on it: set on every linear layer while the
    engine, which runs in this process (TRL's "external_launcher"), is built.
    """
    if not active:
        yield
        return
    from vllm.model_executor.layers.linear import LinearBase

    size_cpu_kv_cache()
    before = LinearBase.__dict__.get("_cpu_skip_gemm_dispatch")
    LinearBase._cpu_skip_gemm_dispatch = True
    try:
        yield
    finally:
        if before is None:
            del LinearBase._cpu_skip_gemm_dispatch
        else:
            LinearBase._cpu_skip_gemm_dispatch = before


def train_grpo(model_dir_or_ref: str | os.PathLike, rows: Sequence[Row], verifier: str,
               settings: GRPOSettings | Mapping[str, Any], out_dir: str | os.PathLike,
               progress_dir: str | os.PathLike, log: Callable[[str], Any] = print,
               live: LiveSettings | None = None) -> RunSummary | None:
    """Run GRPO from `model_dir_or_ref` and write `out_dir`/{model/, metrics.jsonl}; returns the run's
    summary (None on the ranks other than 0 of a multi-process launch; the training stage writes it).

    rows: task rows {id, prompt (chat messages), answer, meta}; verifier: a name in
    `esgrpo.tasks.rewards.VERIFIERS`. TRL checkpoints go to `progress_dir` every
    `settings.save_every` steps; a rerun with the same settings, rows and start model resumes
    from the newest whole checkpoint (another run's leftovers are cleared). The folder takes one
    writer at a time (`esgrpo.progress.WriterLock`; in a multi-process launch, rank 0's). `live`:
    where rank 0 writes the live curves (`esgrpo.live`; None: nowhere).
    """
    settings = settings if isinstance(settings, GRPOSettings) else GRPOSettings.from_dict(settings)
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; allowed: {sorted(VERIFIERS)}")
    if not rows:
        raise ValueError("no training rows")
    rows = list(rows)
    cuda = torch.cuda.is_available()
    if settings.bf16 and not cuda:
        raise ValueError("GRPOSettings.bf16 needs a CUDA GPU; set it to false on CPU")
    if settings.use_vllm and not cuda and not on_vllm_cpu():
        raise ValueError("GRPOSettings.use_vllm needs a CUDA GPU or vLLM's CPU build (`make vllm-env`); "
                         "set it to false here")
    if settings.num_processes != world_size():
        raise ValueError(f"GRPOSettings.num_processes is {settings.num_processes} but {world_size()} process(es) "
                         f"run: launch it with esgrpo.grpo.launch.launch_grpo")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with ProgressFolder(progress_dir, CHECKPOINT_PREFIX, lock=rank() == 0) as progress:
        return _train(model_dir_or_ref, rows, verifier, settings, out_dir, progress, cuda, log, live)


def grpo_trainer(model: torch.nn.Module, tokenizer: Any, train_rows: list[Row], verifier: str,
                 settings: GRPOSettings, output_dir: Path, cuda: bool, callbacks: Sequence[Any] = ()) -> Any:
    """TRL's GRPOTrainer over the rows in training order (`prompt_order`), with its colocated vLLM engine
    when `settings.use_vllm` (on vLLM's CPU build through `_colocated_engine_on_cpu`)."""
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    max_model_len = _vllm_max_model_len(settings, tokenizer, train_rows) if settings.use_vllm else None
    with _colocated_engine_on_cpu(settings.use_vllm and not cuda):
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[make_reward_function(verifier, settings.reward_scheme, settings.format_bonus,
                                              settings.reward_rules)],
            args=_grpo_config(settings, output_dir, cuda, max_model_len),
            train_dataset=rows_to_dataset(train_rows),
            processing_class=tokenizer,  # without it TRL would look for a tokenizer on the Hub
            callbacks=list(callbacks),
        )
    if settings.use_vllm:
        _check_vllm_dtype(trainer, settings)
    trainer.remove_callback(PrinterCallback)  # it prints every raw log dict; the callback logs a line instead
    return trainer


def _train(model_dir_or_ref: str | os.PathLike, rows: list[Row], verifier: str, settings: GRPOSettings,
           out_dir: Path, progress: ProgressFolder, cuda: bool, log: Callable[[str], Any],
           live: LiveSettings | None = None) -> RunSummary | None:
    main = rank() == 0
    order = prompt_order(len(rows), settings.steps, settings.prompts_per_step, settings.seed)
    model, tokenizer = load_policy(model_dir_or_ref, settings, cuda)
    _current_checkpointing_name(model)
    use_cache = getattr(model.config, "use_cache", True)
    theta0 = {n: p.detach().to(torch.float32) for n, p in model.named_parameters()}
    run_id = fingerprint({"settings": settings.trajectory_settings(), "rows": rows}, theta0)
    with main_first(cuda):  # rank 0 clears or keeps the folder; the others then read what it decided
        resume, rows_so_far = _resume_point(progress, run_id, settings, log, main)
    if resume is None and main:
        (out_dir / "metrics.jsonl").unlink(missing_ok=True)  # a previous run's rows must not linger
        log(f"grpo: fresh run, {sum(t.numel() for t in theta0.values()):,} parameters, "
            f"{settings.prompts_per_step} prompts x {settings.num_generations} completions, {settings.steps} steps, "
            f"micro-batch {settings.micro_batch} x {settings.gradient_accumulation_steps} x "
            f"{settings.num_processes} process(es)")
    del theta0

    train_rows = [rows[i] for i in order]
    metrics_paths = [progress.path / "metrics.jsonl", out_dir / "metrics.jsonl"]
    curves = LiveLog(live if main else None, resume[0] if resume is not None else 0, log)
    callback = callback_class()(model, settings, rows_so_far, metrics_paths, log, main, curves)
    trainer = grpo_trainer(model, tokenizer, train_rows, verifier, settings, progress.path, cuda, [callback])
    with curves:
        trainer.train(resume_from_checkpoint=str(resume[1]) if resume is not None else None)
    return _finish(trainer, callback, tokenizer, use_cache, settings, out_dir, resume, main)


def _finish(trainer: Any, callback: MetricsRows, tokenizer: Any, use_cache: bool, settings: GRPOSettings,
            out_dir: Path, resume: tuple[int, Path] | None, main: bool) -> RunSummary | None:
    """Save the model and every metrics row (rank 0); returns the summary (rank 0's; None elsewhere)."""
    metrics = callback.rows
    if main and [r["iteration"] for r in metrics] != list(range(1, settings.steps + 1)):
        raise RuntimeError(f"grpo: expected one metrics row per step 1..{settings.steps}, "
                           f"got {[r['iteration'] for r in metrics]}")
    trained = trainer.model
    trained.eval()
    # Training turns the KV cache off in the config; the saved model should generate as the base did.
    trained.config.use_cache = use_cache
    save_policy(trained, tokenizer, out_dir / "model", main)
    distance = callback._norm_to(callback.theta0)  # every rank: a gather when the model is sharded
    if not main:
        return None
    write_jsonl(out_dir / "metrics.jsonl", metrics)
    last = metrics[-1]
    return RunSummary(method="grpo", iterations=settings.steps, updates=last["updates"],
                      trainable_parameters=sum(t.numel() for t in callback.theta0.values()),
                      distance_from_init=distance, **RunSummary.fitness(metrics), rollouts=last["rollouts"],
                      generated_tokens=last["generated_tokens"], seconds=last["seconds"],
                      resumed_from=resume[0] if resume is not None else None, settings=settings.to_dict())
