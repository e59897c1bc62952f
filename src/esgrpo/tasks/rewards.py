"""The verifiers: pure functions that grade a COMPLETION (never prompt+completion), under one of three
sets of rules (RULES, the config's `rewards.rules`; docs/rewards.md): the project's own ("esgrpo", the
default), paper A's code ("paper_a", esgrpo.tasks.paper_a_rewards) or paper B's code ("paper_b",
esgrpo.tasks.paper_b_rewards: one grader for training rewards, another for evaluation verdicts).

Grading the completion alone matters: a prompt that shows an example `\\boxed{}` or `<answer>` tag
would otherwise earn format credit for text the model never wrote.

Every grader returns False for anything it cannot read, and none of them may hang: a rollout
batch holds thousands of completions and one pathological answer must not stall ES or GRPO.

Math answers go through math-verify, bounded in time in any thread by
`esgrpo.tasks.math_verify_runner`.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import Counter
from collections.abc import Callable, Iterable
from decimal import Decimal, InvalidOperation
from fractions import Fraction

from esgrpo.tasks import paper_a_rewards as paper_a
from esgrpo.tasks import paper_b_rewards as paper_b
from esgrpo.tasks.math_verify_runner import math_verify

__all__ = [
    "DEFAULT_RULES",
    "RULES",
    "SCHEMES",
    "VERIFIERS",
    "check_rules",
    "grade_choice",
    "grade_countdown",
    "grade_math",
    "grade_yesno",
    "has_box",
    "last_boxed",
    "reward",
    "verifier_for",
]

# ----------------------------------------------------------------------------------------------
# \boxed{...} extraction

_BOX_OPEN = re.compile(r"\\boxed\s*\{")


def _boxed_spans(text: str) -> list[tuple[int, int, int]]:
    """(start of `\\boxed`, start of content, end of content) of every balanced `\\boxed{...}`.

    One left-to-right pass with a brace stack, so an input such as `\\boxed{` * 10000 costs
    linear time. Escaped braces `\\{` and `\\}` are literal characters in LaTeX (sets), so they
    neither open nor close a group.
    """
    opens = {m.end() - 1: m.start() for m in _BOX_OPEN.finditer(text)}
    if not opens:
        return []
    spans = []
    stack: list[int] = []  # positions of "{" (only those of a \boxed matter)
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] in "{}":
            i += 2
            continue
        if ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pos = stack.pop()
            if pos in opens:
                spans.append((opens[pos], pos + 1, i))
        i += 1
    spans.sort()
    return spans


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` whose braces balance, or None."""
    if "boxed" not in text:  # fast exit: most graders call this first
        return None
    spans = _boxed_spans(text)
    if not spans:
        return None
    _, start, end = spans[-1]
    return text[start:end]


def has_box(completion: str) -> bool:
    """Whether the completion contains a complete `\\boxed{...}`."""
    return last_boxed(completion) is not None


# ----------------------------------------------------------------------------------------------
# Math (math-verify, with a fast numeric pre-check)

# Past this many characters of answer text, parsing costs more than any real answer needs.
_MAX_PRED_CHARS = 2000
_MAX_BOX_CHARS = 1000

_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[+-]?\.\d+")
_SPACE_GROUPED = re.compile(r"[+-]?\d{1,3}(?: \d{3})+(?:\.\d+)?")
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
# Answer phrasings that the fast path reads when the completion has no \boxed{}.
_ANSWER_PHRASES = re.compile(
    r"(?:####|answer\s*(?:is|:)|answer\s+is\s*:)\s*\$?\s*(?:\\\$)?\s*([+-]?[\d.,]*\d)", re.IGNORECASE
)
# Answers whose evaluation sympy cannot finish: power towers, huge exponents, huge factorials.
# (Only `^`: a `**` pattern would also match markdown bold such as "**72**".)
_POWER_TOWER = re.compile(r"\^\s*[{(]\s*[\d.]+\s*\^|\^\s*[\d.]+\s*\^")
_HUGE_EXPONENT = re.compile(r"\^\s*[{(]?\s*\d{5,}")
_HUGE_FACTORIAL = re.compile(r"\d{4,}\s*!")


def _as_number(text: str) -> Fraction | None:
    """A plain number written as `72`, `-3.5`, `1,000`, `$72`, `72.` -> exact Fraction; else None."""
    s = text.strip()
    s = _TEXT_WRAP.sub(r"\1", s)
    for junk in ("\\$", "$", "\\!", "\\,", "{,}", "\\ "):
        s = s.replace(junk, "" if junk != "{,}" else ",")
    s = s.strip().rstrip(".").strip()
    if _SPACE_GROUPED.fullmatch(s):  # 1 000 (SI thousands): math-verify reads a product, 1*000 = 0
        s = s.replace(" ", "")
    if not s or _NUMBER.fullmatch(s) is None:
        return None
    try:
        return Fraction(Decimal(s.replace(",", "")))
    except (InvalidOperation, ValueError):
        return None


def _fast_math(completion: str, box: str | None, gold: str) -> bool | None:
    """Decide cheaply when both the answer and the gold are plain numbers; None = undecided.

    A boxed plain number is decisive either way (math-verify also reads the box first). An
    unboxed "The answer is N" / "#### N" only decides a match; a mismatch goes to math-verify.
    """
    gold_value = _as_number(gold)
    if gold_value is None:
        return None
    if box is not None:
        value = _as_number(box)
        return None if value is None else value == gold_value
    matches = _ANSWER_PHRASES.findall(completion[-_MAX_PRED_CHARS:])
    if matches:
        value = _as_number(matches[-1])
        if value is not None and value == gold_value:
            return True
    return None


# Misreadings of math-verify (0.9.0, measured on tests/data/rewards/corpus.jsonl) settled before it is
# asked (docs/rewards.md, "Fixed"; a text wrapper around a math answer: _unwrap_text_math):
# - it drops a base subscript, so \boxed{1011} "equals" 1011_2 (and so does \boxed{1011_3}): a number
#   with a base subscript equals only the same digits in the same base (a plain integer is base 10);
# - it reads a degree mark right after a number only with a space before it (\boxed{90\circ} and
#   \boxed{90°} wrong, \boxed{ 90\circ } right): degree marks after a number are dropped first, as
#   math-verify itself drops `^\circ` (\boxed{90^\circ} equals 90).
_DEGREES = re.compile(r"(?<=[0-9}])\s*(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|\u00b0)")
_SUBSCRIPT = re.compile(r"_\s*(?:\{\s*(?:\\(?:text|mathrm)\s*\{\s*(\d+)\s*\}|(\d+))\s*\}|\\(?:text|mathrm)\s*\{\s*(\d+)\s*\})")
_BASED = re.compile(r"([0-9A-Za-z]+)_(\d+)")
_BASED_IN_TEXT = re.compile(r"[0-9A-Za-z]+_\s*(?:\{[^{}]*(?:\{[^{}]*\}[^{}]*)?\}|\\(?:text|mathrm)\s*\{[^{}]*\}|\d+)")


def _without_degrees(text: str) -> str:
    return _DEGREES.sub("", text)


_TEXT_WRAPPED = re.compile(r"\s*\\(?:text|textbf|mathrm|mbox)\s*\{(.*)\}\s*", re.DOTALL)


def _unwrap_text_math(box: str) -> str:
    """`\\text{3\\sqrt{2}}` -> `3\\sqrt{2}`: a text wrapper around the whole answer whose content is
    math (a command, ^ or _, which text mode cannot hold, or no letter at all: `\\text{(1,2)}`) is
    dropped; math-verify reads such a wrapper for some answers (\\text{\\frac{1}{2}}) and not for
    others (\\text{3\\sqrt{2}}, \\text{1011_2}, \\text{(1,2)}). Words (\\text{Evelyn}) keep theirs."""
    match = _TEXT_WRAPPED.fullmatch(box)
    if match is None:
        return box
    inner = match.group(1)
    if not (any(mark in inner for mark in ("\\", "^", "_")) or not any(ch.isalpha() for ch in inner)):
        return box
    depth = 0
    for ch in inner:  # the wrapper's braces must be the outer pair: \text{a}^{b} is not wrapped
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return box
    return inner if depth == 0 else box


def _based_number(text: str) -> tuple[str, int] | None:
    """(digits, base) of `1011_2`, `1011_{2}`, `1011_\\text{2}` (digits valid in a base 2-36) or of a
    plain integer (base 10), leading zeros dropped; None for anything else."""
    s = _SUBSCRIPT.sub(lambda m: "_" + next(g for g in m.groups() if g), text).replace("$", "")
    s = re.sub(r"\s+", "", s)
    if s.isascii() and s.isdigit():
        return s.lstrip("0") or "0", 10
    match = _BASED.fullmatch(s)
    if match is None:
        return None
    digits, base = match.group(1).upper(), int(match.group(2))
    if not 2 <= base <= 36 or any(int(c, 36) >= base for c in digits):
        return None
    return digits.lstrip("0") or "0", base


def _base_verdict(completion: str, box: str | None, gold: str) -> bool | None:
    """The verdict when the gold or the boxed answer is a number in a base other than 10; else None.
    Without a box, the tail's last base-subscripted number is the answer."""
    based_gold = _based_number(gold)
    if box is None:
        if based_gold is None or based_gold[1] == 10:
            return None
        found = _BASED_IN_TEXT.findall(completion[-_MAX_PRED_CHARS:])
        return bool(found) and _based_number(found[-1]) == based_gold
    based_box = _based_number(box)
    if (based_box is None or based_box[1] == 10) and (based_gold is None or based_gold[1] == 10):
        return None
    return based_box == based_gold


def _pathological(text: str) -> bool:
    """Answers whose symbolic evaluation could run for minutes or exhaust memory."""
    return bool(_POWER_TOWER.search(text) or _HUGE_EXPONENT.search(text) or _HUGE_FACTORIAL.search(text))


def _prediction_text(completion: str, box: str | None) -> str | None:
    """The text math-verify parses: the last box if any, else the completion's tail."""
    if box is not None:
        if len(box) > _MAX_BOX_CHARS:
            return None
        text = "\\boxed{" + box + "}"
    else:
        text = _without_degrees(completion[-_MAX_PRED_CHARS:])
    return None if _pathological(text) else text


# A pure function of two strings, called for every sample, and most samples repeat an answer
# (docs/references.md counts it): remember the verdicts.
@functools.lru_cache(maxsize=1 << 16)
def grade_math(completion: str, gold: str) -> bool:
    """Whether the completion's final answer equals `gold` (math-verify semantics).

    Accepts `\\boxed{72}`, "The answer is 72", `#### 72`, fractions, "1,000". Base-subscripted
    numbers and plain numbers are decided first (exactly); everything else by math-verify.
    """
    gold = _without_degrees(str(gold).strip())
    if not gold or not completion:
        return False
    box = last_boxed(completion)
    if box is not None:
        box = _without_degrees(_unwrap_text_math(box))
    based = _base_verdict(completion, box, gold)
    if based is not None:
        return based
    fast = _fast_math(completion, box, gold)
    if fast is not None:
        return fast
    pred_text = _prediction_text(completion, box)
    return pred_text is not None and math_verify(pred_text, gold)


# ----------------------------------------------------------------------------------------------
# Countdown

_COUNTDOWN_CHARS = re.compile(r"[0-9+\-*/() ]+")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_MAX_EXPRESSION_CHARS = 300  # four numbers need far fewer; the cap bounds ast recursion


def _last_answer_tag(text: str) -> str | None:
    matches = _ANSWER_TAG.findall(text)
    return matches[-1] if matches else None


def _eval_arithmetic(node: ast.AST) -> Fraction:
    """Exact value of an expression tree of integers, + - * / and unary signs only."""
    if isinstance(node, ast.Expression):
        return _eval_arithmetic(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _eval_arithmetic(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _eval_arithmetic(node.left), _eval_arithmetic(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            if right == 0:
                raise ZeroDivisionError
            return left / right
    # ** and // are written with allowed characters but are not Countdown operations.
    raise ValueError(f"disallowed syntax: {type(node).__name__}")


def grade_countdown(completion: str, numbers: list[int], target: int) -> bool:
    """Whether the last `\\boxed{}` (else last `<answer>`) is an expression of exactly `numbers`
    (each used once) with + - * / and parentheses that evaluates to `target` (|diff| < 1e-5)."""
    expression = last_boxed(completion)
    if expression is None:
        expression = _last_answer_tag(completion)
    if expression is None:
        return False
    expression = expression.strip()
    if not expression or len(expression) > _MAX_EXPRESSION_CHARS:
        return False
    if _COUNTDOWN_CHARS.fullmatch(expression) is None:
        return False
    try:
        wanted = Counter(int(n) for n in numbers)
    except (TypeError, ValueError):
        return False
    if Counter(int(tok) for tok in re.findall(r"\d+", expression)) != wanted:
        return False
    try:
        value = _eval_arithmetic(ast.parse(expression, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError, MemoryError):
        return False
    try:
        return abs(float(value) - float(target)) < 1e-5
    except (OverflowError, TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------------------------
# Multiple choice and yes/no

_LETTERS = "ABCDEFGHIJ"
# Explicit statements of the choice; `(C)` alone is weaker (options are listed that way too).
_CHOICE_JSON = re.compile(r"[\"']answer[\"']\s*:\s*[\"']?\s*\(?([A-J])\)?(?![A-Za-z0-9])", re.IGNORECASE)
_CHOICE_STATED = re.compile(r"(?i:answer)\s*(?:(?i:is)\s*)?:?\s*\**\s*\(?([A-J])\)?(?![A-Za-z0-9])")
_CHOICE_PAREN = re.compile(r"\(([A-J])\)")
_BOX_LETTER = re.compile(r"\(?([A-J])\)?(?:[\s.:)]|$)")


def _unwrap_latex(text: str) -> str:
    previous = None
    while previous != text:
        previous = text
        text = _TEXT_WRAP.sub(r"\1", text)
    return text.strip()


def _chosen_letter(completion: str) -> str | None:
    """The letter stated last by `\\boxed{C}`, `"answer": "C"` or `Answer: C`; else the last `(C)`."""
    found: list[tuple[int, str]] = []
    for start, content_start, content_end in _boxed_spans(completion) if "boxed" in completion else []:
        letter = _BOX_LETTER.match(_unwrap_latex(completion[content_start:content_end]))
        if letter:
            found.append((start, letter.group(1).upper()))
    for pattern in (_CHOICE_JSON, _CHOICE_STATED):
        for match in pattern.finditer(completion):
            found.append((match.start(), match.group(1).upper()))
    if found:
        return max(found)[1]
    parens = _CHOICE_PAREN.findall(completion)
    return parens[-1] if parens else None


def grade_choice(completion: str, gold_letter: str) -> bool:
    """Whether the chosen letter (A-J) equals `gold_letter`."""
    gold = str(gold_letter).strip().strip("()").upper()
    if len(gold) != 1 or gold not in _LETTERS:
        return False
    return _chosen_letter(completion) == gold


_YES = {"yes", "true"}
_NO = {"no", "false"}
_YESNO_STATED = re.compile(r"answer\s*(?:is)?\s*:?\s*\**\s*(yes|no|true|false)\b", re.IGNORECASE)


def _yes_no(word: str) -> str | None:
    word = re.sub(r"[^a-z]", "", _unwrap_latex(word).lower())
    if word in _YES:
        return "yes"
    if word in _NO:
        return "no"
    return None


def grade_yesno(completion: str, gold: str | bool) -> bool:
    """Whether the final yes/no (`\\boxed{yes}`, true/false; else "answer is yes") equals `gold`."""
    gold_norm = ("yes" if gold else "no") if isinstance(gold, bool) else _yes_no(str(gold))
    if gold_norm is None:
        return False
    box = last_boxed(completion)
    if box is not None:
        return _yes_no(box) == gold_norm
    stated = _YESNO_STATED.findall(completion)
    return bool(stated) and _yes_no(stated[-1]) == gold_norm


# ----------------------------------------------------------------------------------------------
# Registry and reward


def _math(completion: str, answer: str, meta: dict) -> bool:
    return grade_math(completion, answer)


def _countdown_problem(meta: dict) -> tuple[list[int], int]:
    try:
        return list(meta["numbers"]), meta["target"]
    except (KeyError, TypeError):
        raise ValueError("the countdown verifier needs meta['numbers'] and meta['target']") from None


def _countdown(completion: str, answer: str, meta: dict) -> bool:
    return grade_countdown(completion, *_countdown_problem(meta))


def _choice(completion: str, answer: str, meta: dict) -> bool:
    return grade_choice(completion, answer)


def _yesno(completion: str, answer: str, meta: dict) -> bool:
    return grade_yesno(completion, answer)


# The project's own graders (rules "esgrpo"), one per verifier name of esgrpo.tasks.registry.
VERIFIERS: dict[str, Callable[[str, str, dict], bool]] = {
    "math": _math,
    "countdown": _countdown,
    "choice": _choice,
    "yesno": _yesno,
}

# Whose rules decide what is correct (the config's `rewards.rules`; docs/rewards.md): the project's
# own, paper A's code (esgrpo.tasks.paper_a_rewards), or paper B's code (esgrpo.tasks.paper_b_rewards;
# maths only, so its other kinds keep the project's graders). Under paper B's rules evaluation and
# training grade maths differently, as its code does: verifier_for gives the evaluation grader,
# _TRAINING_RULES the training one.
RULES = ("esgrpo", "paper_a", "paper_b")
DEFAULT_RULES = "esgrpo"

_PAPER_RULES: dict[str, dict[str, Callable[[str, str, dict], bool]]] = {
    "paper_a": {
        "math": lambda completion, answer, meta: paper_a.grade_math(completion, answer),
        "countdown": lambda completion, answer, meta: paper_a.grade_countdown(completion, *_countdown_problem(meta)),
        "choice": lambda completion, answer, meta: paper_a.grade_choice(completion, answer),
        "yesno": lambda completion, answer, meta: paper_a.grade_yesno(completion, answer),
    },
    "paper_b": {
        "math": lambda completion, answer, meta: paper_b.grade_eval(completion, answer),
    },
}

# (grader, box reader) of training rewards where a paper's code grades training otherwise than
# evaluation; the box reader decides what `boxed_partial` and `format_bonus` count as a box.
_TRAINING_RULES: dict[tuple[str, str], tuple[Callable[[str, str, dict], bool], Callable[[str], bool]]] = {
    ("paper_b", "math"): (lambda completion, answer, meta: paper_b.grade_training(completion, answer),
                          lambda completion: paper_b.training_box(completion) is not None),
}


def check_rules(rules: str) -> str:
    """`rules` when it is one of RULES; a ValueError naming the allowed ones otherwise."""
    if rules not in RULES:
        raise ValueError(f"unknown reward rules {rules!r}; allowed: {list(RULES)}")
    return rules


def own_graders_under(rules: str, verifiers: Iterable[str]) -> list[str]:
    """The verifiers among `verifiers` that `rules` (paper_a, paper_b) has no grader of, which the project's
    own graders then grade (paper B grades maths only; a task added since has none in paper A's code)."""
    table = _PAPER_RULES.get(check_rules(rules))
    return [] if table is None else sorted({v for v in verifiers if v not in table})


def verifier_for(verifier: str, rules: str = DEFAULT_RULES) -> Callable[[str, str, dict], bool]:
    """The grader `(completion, answer, meta) -> bool` of `verifier` under `rules`."""
    table = _PAPER_RULES.get(check_rules(rules), {})
    if verifier in table:
        return table[verifier]
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; allowed: {sorted(VERIFIERS)}")
    return VERIFIERS[verifier]


SCHEMES = ("binary", "boxed_partial")


def reward(verifier: str, completion: str, answer: str, meta: dict | None = None,
           scheme: str = "binary", format_bonus: float = 0.0, rules: str = DEFAULT_RULES) -> float:
    """Scalar training reward of one completion, graded under `rules` (RULES).

    scheme "binary": 1 if correct else 0. scheme "boxed_partial" (paper B): 1 for a correct
    boxed answer, 0.1 for a box with a wrong answer, 0 without a box. `format_bonus` is added
    whenever the completion contains a `\\boxed{}`. Under paper B's rules a maths completion's
    box and verdict are its training grader's (`boxed_partial` is then its `score_training_response`).
    """
    grade = verifier_for(verifier, rules)
    if scheme not in SCHEMES:
        raise ValueError(f"unknown reward scheme {scheme!r}; allowed: {list(SCHEMES)}")
    boxed_reader = has_box
    if (rules, verifier) in _TRAINING_RULES:
        grade, boxed_reader = _TRAINING_RULES[(rules, verifier)]
    boxed = boxed_reader(completion)
    if scheme == "boxed_partial" and not boxed:
        value = 0.0
    else:
        correct = grade(completion, answer, dict(meta or {}))
        if scheme == "binary":
            value = 1.0 if correct else 0.0
        else:
            value = 1.0 if correct else 0.1
    if boxed:
        value += float(format_bonus)
    return value
