"""Paper B's two graders, rule for rule: its training reward and its evaluation verdict.

Paper B ("Understanding ES for LLM Reasoning", github.com/yunpengba7/understanding-es at 240d878,
`src/es_reproduction/rewards.py`) grades a maths completion twice, differently:
- training (`score_training_response`, called by its ES loop in `train.py` with `format_reward: 0.1`):
  the content of the LAST `\\boxed` (a `{` after optional spaces, braces counted, stripped) compared
  with the gold as strings, both put in a MATH-style normal form; no math-verify. No readable box: 0;
- evaluation (`is_gsm8k_correct`, called by `evaluation.py` for greedy and sampled completions):
  math-verify's parse of the WHOLE completion (LaTeX extraction with boxed priority and units, then
  plain expressions, first match) verified against the gold parsed as a plain expression; when that
  parse finds nothing, regular expressions read `#### N`, else the last box, else "answer/result is N",
  compared with the gold as normalised numbers.
These functions are written from a reading of that code (nothing copied) and are checked against its
own verdicts on a corpus of completions (tests/data/rewards/, tests/tasks/test_paper_rewards.py). Its code
grades GSM8K only; `rewards.rules: paper_b` applies the same two graders to every maths task (the hard
setting's DeepScaleR and benchmarks included; docs/rewards.md says what that does to LaTeX golds).
The math-verify part runs in `esgrpo.tasks.math_verify_runner` (bounded in time in any thread).
"""

from __future__ import annotations

import functools
import math
import re

from esgrpo.tasks.math_verify_runner import paper_b_verdict

__all__ = ["grade_eval", "grade_training", "numeric_form", "stated_answer", "training_box", "training_form"]


def training_box(text: str) -> str | None:
    """Content of the box opened by the last `\\boxed` of the text, stripped; None when that `\\boxed`
    is not followed (after spaces) by `{`, or its braces never close. An earlier complete box does not
    count: only the last `\\boxed` is read."""
    at = text.rfind("\\boxed")
    if at < 0:
        return None
    i = at + len("\\boxed")
    while i < len(text) and text[i].isspace():
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1:j].strip()
    return None


def _braced_fractions(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{2}` -> `\\frac{1}{2}`; a `\\frac` followed by a single
    character leaves the whole text as it was."""
    head, *rest = s.split("\\frac")
    out = [head]
    for part in rest:
        if part and part[0] != "{":
            if len(part) < 2:
                return s
            out.append("{" + part[0] + "}" + (part[1] if part[1] == "{" else "{" + part[1] + "}") + part[2:])
        else:
            out.append(part)
    return "\\frac".join(out)


def _braced_roots(s: str) -> str:
    """`\\sqrt2` -> `\\sqrt{2}` (one character)."""
    head, *rest = s.split("\\sqrt")
    return head + "".join("\\sqrt" + ("{" + p[0] + "}" + p[1:] if p and p[0] != "{" else p) for p in rest)


_DROPPED = (("\n", ""), ("\\!", ""), ("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""),
            ("\\right", ""), ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""), ("\\%", ""))


def training_form(value: str) -> str:
    """Paper B's normal form of a training answer (and gold), step by step in its order: line breaks,
    `\\!`, doubled backslashes, tfrac/dfrac, \\left/\\right, degree marks, `\\$`, `\\%` go; a
    `\\text{ ` unit (exactly one) is cut off; `.5` -> `0.5`; `x=` (at most two characters before the
    only `=`) goes; roots and fractions get braces; spaces go; `0.5` and `a/b` become `\\frac`."""
    s = str(value)
    for old, new in _DROPPED:
        s = s.replace(old, new)
    units = s.split("\\text{ ")
    if len(units) == 2:
        s = units[0]
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s.startswith("."):
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        s = sides[1]
    s = _braced_fractions(_braced_roots(s).replace(" ", ""))
    if s == "0.5":
        return "\\frac{1}{2}"
    parts = s.split("/")
    if len(parts) == 2 and all(p.lstrip("-").isdigit() for p in parts):
        s = "\\frac{" + parts[0] + "}{" + parts[1] + "}"
    return s


def grade_training(completion: str, gold: str) -> bool:
    """Paper B's training verdict: a readable last box whose normal form is the gold's. Its reward
    (`score_training_response`: 1, 0.1 for a readable wrong box, 0) is `esgrpo.tasks.rewards.reward`
    with scheme `boxed_partial` under `rules="paper_b"`, which reads the box with `training_box`."""
    box = training_box(completion)
    return box is not None and training_form(box) == training_form(str(gold))


# Its fallback when math-verify finds nothing: the last `#### N`, else the last box, else the last
# "answer is N" / "result = N" (any case).
_HASHES = re.compile(r"####\s*(-?[\d,]+\.?\d*)")
_STATED = re.compile(r"(?:answer|result)\s+(?:is|=)\s*(-?[\d,]+\.?\d*)", re.IGNORECASE)


def stated_answer(completion: str) -> str | None:
    """The answer paper B's regular expressions read (commas and trailing dots dropped), or None."""
    found = _HASHES.findall(completion)
    if not found:
        box = training_box(completion)
        found = [box] if box is not None else _STATED.findall(completion)
    return found[-1].replace(",", "").rstrip(".") if found else None


def numeric_form(value: str) -> str:
    """A number's canonical text (`16.0` -> `16`, `1e3` -> `1000`, Python's float() reading); any
    other text its lower-cased training normal form."""
    s = training_form(str(value).strip().replace(",", ""))
    try:
        number = float(s)
    except ValueError:
        return s.lower()
    if not math.isfinite(number):
        return s.lower()
    return str(int(number)) if number == int(number) else str(number)


# A pure function of two strings, called for every evaluation sample: remember the verdicts.
@functools.lru_cache(maxsize=1 << 16)
def grade_eval(completion: str, gold: str) -> bool:
    """Paper B's evaluation verdict (`is_gsm8k_correct`): math-verify on the whole completion, else
    its regular expressions."""
    verdict = paper_b_verdict(completion, str(gold))
    if verdict is not None:
        return verdict
    found = stated_answer(completion)
    return found is not None and numeric_form(found) == numeric_form(str(gold))
