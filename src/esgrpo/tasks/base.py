"""What a task is: rows of {id, prompt (chat messages), answer, meta} plus the verifier that grades them.

Every source (offline generators, Hugging Face datasets) yields rows of this one shape, so
ES, GRPO, evaluation and analyses never look at where a task came from.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Row = dict[str, Any]  # {"id": str, "prompt": list[{"role","content"}], "answer": str, "meta": dict}

BOXED_SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."


def make_row(row_id: str, question: str, answer: str, meta: dict | None = None,
             system: str | None = None, template: str | None = None, fields: dict | None = None) -> Row:
    """One task row; the prompt is a chat conversation (optional system turn + user turn).

    The user turn is `question` (the task's own wording) unless a `template` is given: then it is
    the template with the row's `fields` filled in (`str.format`, checked by `prompt_setting`).
    """
    messages = []
    if system:
        messages.append({"role": "system", "content": system})
    user = question if template is None else template.format(**(fields or {}))
    messages.append({"role": "user", "content": user})
    return {"id": row_id, "prompt": messages, "answer": str(answer), "meta": dict(meta or {})}


def template_fields(template: str) -> list[str]:
    """The `{field}` names a user template uses; a ValueError for broken braces or `{}` / `{0}`."""
    names = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    positional = [name for name in names if not name.isidentifier()]
    if positional:
        raise ValueError(f"fields must be names such as {{question}}, got {{{positional[0]}}}")
    return names


def prompt_setting(prompt: dict | None, default_system: str | None,
                   fields: Sequence[str]) -> tuple[str | None, str | None]:
    """(system prompt, user template) from a task's `prompt` option {system, template}.

    A key left out keeps the task's default (its system prompt, its own user wording); `system: null`
    drops the system turn. The template may use only `fields`, the values every row of the task fills.
    """
    prompt = dict(prompt or {})
    unknown = sorted(set(prompt) - {"system", "template"})
    if unknown:
        raise ValueError(f"prompt: unknown keys {unknown}; allowed: ['system', 'template']")
    template = prompt.get("template")
    if template is not None:
        try:
            used = template_fields(template)
        except ValueError as err:
            raise ValueError(f"prompt.template: {err}") from None
        stray = sorted(set(used) - set(fields))
        if stray:
            raise ValueError(f"prompt.template: unknown fields {stray}; this task fills {sorted(fields)}")
    return prompt.get("system", default_system), template


@dataclass(frozen=True)
class TaskSpec:
    """A task name bound to a loader and a verifier name (see `esgrpo.tasks.rewards.VERIFIERS`)."""

    name: str
    verifier: str
    loader: Callable[..., list[Row]]  # loader(split, size, seed, **options) -> rows
    description: str = ""
    splits: tuple[str, ...] = ("train", "test")  # the splits the source has (DeepScaleR: train only)
    prompt_fields: tuple[str, ...] = ()  # the fields a `prompt.template` may use; () = no `prompt` option
    selections: tuple[str, ...] = ()  # values of the `selection` option (how train rows are chosen)
    hub_ids: Mapping[str, str] = field(default_factory=dict)  # split -> Hub dataset (pinned files: esgrpo.pins)

