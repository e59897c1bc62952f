"""The run record of both trainers: one `StepRow` per ES iteration or GRPO optimiser step (a line of
metrics.jsonl) and one `RunSummary` per run (summary.json), with the same field names for both methods,
so one table reads ES and GRPO side by side.

The trainers (`esgrpo.es.loop.train_es`, `esgrpo.grpo.trainer.train_grpo`) build them and return the
summary; the training stage (`esgrpo.workflow.stages.training.train_run`) writes summary.json, with
what the workflow adds (provenance, labels, the start model). Fields only one method measures go in
`extra` (ES: the fitness spread and skipped updates; GRPO: loss, gradient norm, learning rate).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["STEP_FIELDS", "RunSummary", "StepRow"]


def _flat(record: StepRow | RunSummary) -> dict[str, Any]:
    """A record as one flat dict: its shared fields in their order, then the method's own (`extra`)."""
    shared = {f.name: getattr(record, f.name) for f in dataclasses.fields(record) if f.name != "extra"}
    clash = shared.keys() & record.extra.keys()
    if clash:
        raise ValueError(f"{type(record).__name__}.extra repeats shared fields {sorted(clash)}")
    return {**shared, **record.extra}


@dataclass(frozen=True)
class StepRow:
    """One iteration (ES) or optimiser step (GRPO), as metrics.jsonl holds it.

    iteration: iterations or steps done, from 1; updates: how many of them changed the weights (ES
    skips an update when every member scored the same); prompts: prompts of this step.
    fitness_mean / fitness_std: mean reward and its spread, over a member's prompts (ES: across
    members) or over every completion of the step (GRPO). entropy: mean token entropy of the
    training rollouts. update_norm: ||theta_t - theta_{t-1}||; distance_from_init: ||theta_t - theta_0||
    (both `esgrpo.distance`). rollouts, generated_tokens, seconds: totals since the run began.
    """

    method: str
    iteration: int
    fitness_mean: float
    fitness_std: float
    update_norm: float
    distance_from_init: float
    updates: int
    rollouts: int
    generated_tokens: int
    seconds: float
    entropy: float
    prompts: int
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The metrics.jsonl row: the shared fields, then the method's own (`extra`)."""
        return _flat(self)


STEP_FIELDS = tuple(f.name for f in dataclasses.fields(StepRow) if f.name != "extra")


@dataclass(frozen=True)
class RunSummary:
    """What a trainer returns about a finished run (and the stage writes to summary.json).

    iterations: iterations or optimiser steps run; updates: how many changed the weights (as in
    `StepRow`); trainable_parameters: d, the parameters training
    changes; distance_from_init: ||theta_T - theta_0|| of the final weights; final_/best_fitness_mean:
    the last and the best step's fitness_mean; rollouts, generated_tokens, seconds: the run's totals;
    resumed_from: the step a checkpoint resumed it from (None: a fresh run); settings: the trainer's
    settings (`ESConfig.to_dict`, `GRPOSettings.to_dict`).
    """

    method: str
    iterations: int
    updates: int
    trainable_parameters: int
    distance_from_init: float
    final_fitness_mean: float
    best_fitness_mean: float
    rollouts: int
    generated_tokens: int
    seconds: float
    resumed_from: int | None
    settings: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)

    @staticmethod
    def fitness(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """final_fitness_mean and best_fitness_mean of metrics rows (NaN without rows)."""
        nan = float("nan")
        return {"final_fitness_mean": rows[-1]["fitness_mean"] if rows else nan,
                "best_fitness_mean": max((r["fitness_mean"] for r in rows), default=nan)}

    def to_dict(self) -> dict[str, Any]:
        """The summary.json record: the shared fields, then the method's own (`extra`)."""
        return _flat(self)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> RunSummary:
        """The summary a `to_dict` record holds (a field it lacks: KeyError naming it)."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
        missing = [n for n in names if n not in record]
        if missing:
            raise KeyError(f"run summary lacks {missing}")
        return cls(**{n: record[n] for n in names}, extra={k: v for k, v in record.items() if k not in names})

