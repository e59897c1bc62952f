"""GRPO's metrics.jsonl rows: one `esgrpo.run_record.StepRow` per optimiser step, the ES trainer's
record, so one table reads both methods, with the geometry TRL does not measure (distance from the
initial weights, the step's update norm). `callback_class` is the TRL callback that writes them;
`esgrpo.grpo.trainer` installs it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from esgrpo.files import write_jsonl
from esgrpo.grpo.distributed import host_copy, norm_to
from esgrpo.grpo.settings import GRPOSettings
from esgrpo.live import Eta, LiveLog
from esgrpo.run_record import StepRow

__all__ = ["MetricsRows", "callback_class"]


def _float(value: Any) -> float:
    if value is None:
        return math.nan
    return float(value.item() if hasattr(value, "item") else value)


class MetricsRows:
    """Writes one `StepRow` per optimiser step to metrics.jsonl (progress_dir and out_dir).

    Geometry is measured here because TRL does not: distance_from_init against an fp32
    copy of the starting weights, update_norm against an fp32 copy taken as the step begins
    (the weights the optimiser step starts from). Cumulative totals (rollouts, tokens, seconds) continue from the rows
    of the checkpoint a run resumes from. In a multi-process run only rank 0 (`main`) keeps
    the copies and writes; every rank joins the gathers of a sharded model. Each row also goes to the
    live curves (`curves`, `esgrpo.live`: the tags ES writes) and its log line carries an ETA.
    """

    def __init__(self, model: torch.nn.Module, settings: GRPOSettings, rows_so_far: list[dict],
                 metrics_paths: Sequence[Path], log: Callable[[str], Any], main: bool = True,
                 curves: LiveLog | None = None) -> None:
        self.model = model
        self.settings = settings
        self.rows = rows_so_far
        self.metrics_paths = list(metrics_paths)
        self.log = log
        self.main = main
        self.curves = curves or LiveLog(None)
        self.eta = Eta(settings.steps, len(rows_so_far))
        self.theta0 = self._snapshot()  # taken before the trainer shards (or resumes) the model
        self.before: dict[str, torch.Tensor] | None = None
        self.snapped = False
        last = rows_so_far[-1] if rows_so_far else {}
        self.totals = {k: last.get(k, 0) for k in ("rollouts", "generated_tokens", "seconds")}
        self.step_began = 0.0
        self.pending: dict[str, float] = {}

    def _snapshot(self) -> dict[str, torch.Tensor] | None:
        """fp32 copies of every parameter (tied weights once, as in ES), kept in CPU memory (rank 0's).

        On a GPU the two copies would cost 8 bytes per parameter next to the optimiser
        state and vLLM; in host memory they cost one transfer per step.
        """
        return host_copy(self.model, self.main)

    def _norm_to(self, reference: Mapping[str, torch.Tensor] | None) -> float:
        """||theta - reference||_2 (`esgrpo.grpo.distributed.norm_to`; NaN on ranks that keep no reference)."""
        return norm_to(self.model, reference)

    def on_step_begin(self, args, state, control, **kwargs):
        # The weights before this step's update. Taken here, not at on_pre_optimizer_step: under DeepSpeed
        # the engine steps inside the last backward pass, before that event.
        self.step_began = time.perf_counter()
        self.before, self.snapped = self._snapshot(), True

    def on_step_end(self, args, state, control, **kwargs):
        # Timed from step begin (generation + scoring + backward + optimiser), not logging/saving, as ES.
        seconds = time.perf_counter() - self.step_began
        self.pending = {
            "seconds_step": seconds,
            "update_norm": self._norm_to(self.before) if self.snapped else math.nan,
            "distance_from_init": self._norm_to(self.theta0),
        }
        self.before, self.snapped = None, False

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "reward" not in logs or not self.main:  # the end-of-training summary log, not a step; rank 0 writes
            return
        s = self.settings
        step = int(state.global_step)
        completions = s.completions_per_step
        mean_length = _float(logs.get("completions/mean_length"))
        self.totals["rollouts"] += completions
        # TRL's num_tokens also counts prompt tokens; mean length x count is the exact completion total.
        self.totals["generated_tokens"] += int(round(mean_length * completions))
        self.totals["seconds"] += self.pending.get("seconds_step", 0.0)
        extra = {
            "frac_reward_zero_std": _float(logs.get("frac_reward_zero_std")),
            "loss": _float(logs.get("loss")),
            "grad_norm": _float(logs.get("grad_norm")),
            "learning_rate": _float(logs.get("learning_rate")),
            "completion_mean_length": mean_length,
            "truncated_fraction": _float(logs.get("completions/clipped_ratio")),
            "seconds_step": self.pending.get("seconds_step", math.nan),
        }
        if s.beta != 0.0:
            extra["kl"] = _float(logs.get("kl"))
        row = StepRow(
            method="grpo", iteration=step, fitness_mean=_float(logs.get("reward")),
            fitness_std=_float(logs.get("reward_std")), update_norm=self.pending.get("update_norm", math.nan),
            distance_from_init=self.pending.get("distance_from_init", math.nan), updates=step,
            rollouts=self.totals["rollouts"], generated_tokens=self.totals["generated_tokens"],
            seconds=self.totals["seconds"], entropy=_float(logs.get("entropy")), prompts=s.prompts_per_step,
            extra=extra).to_dict()
        self.pending = {}
        # Rows are keyed by step: a step replayed after a resume replaces, never duplicates.
        self.rows = [r for r in self.rows if r["iteration"] < step] + [row]
        for path in self.metrics_paths:  # progress_dir's copy is the one a resume reads
            write_jsonl(path, self.rows)
        self.curves.row(row)
        self.log(f"grpo step {step}/{s.steps} reward {row['fitness_mean']:.4f}±{row['fitness_std']:.4f} "
                 f"zero-std {row['frac_reward_zero_std']:.2f} entropy {row['entropy']:.3f} "
                 f"|step| {row['update_norm']:.3e} dist {row['distance_from_init']:.3e} "
                 f"len {mean_length:.1f} {row['seconds_step']:.2f}s {self.eta(step)}")


def callback_class():
    """The callback: `MetricsRows` on transformers' `TrainerCallback` (whose other events do nothing),
    built lazily so importing this module does not import transformers."""
    from transformers import TrainerCallback

    return type("GRPOMetricsCallback", (MetricsRows, TrainerCallback), {})
