"""What a task is: rows of {id, prompt (chat messages), answer, meta} plus the verifier that grades them.

Every source (offline generators, Hugging Face datasets) yields rows of this one shape, so
ES, GRPO, evaluation and analyses never look at where a task came from.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Row = dict[str, Any]  # {"id": str, "prompt": list[{"role","content"}], "answer": str, "meta": dict}

BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def make_row(row_id: str, question: str, answer: str, meta: dict | None = None,
             system: str | None = None) -> Row:
    """One task row; the prompt is a chat conversation (optional system turn + user turn)."""
    messages = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": question})
    return {"id": row_id, "prompt": messages, "answer": str(answer), "meta": dict(meta or {})}


@dataclass(frozen=True)
class TaskSpec:
    """A task name bound to a loader and a verifier name (see `esgrpo.rewards.VERIFIERS`)."""

    name: str
    verifier: str
    loader: Callable[..., list[Row]]  # loader(split, size, seed, **options) -> rows
    description: str = ""
    splits: tuple[str, ...] = ("train", "test")  # the splits the source has (DeepScaleR: train only)

