"""Paper A's graders, rule for rule: what its reward code counts as correct, quirks included.

Paper A ("Matching Accuracy, Different Geometry", github.com/Bhoy1/ESvsGRPO at 43eed8c, its
`src/es_vs_grpo/tasks/{countdown,math,chemistry,boolq}.py`, `compute_reward`) grades the generated
text alone in training and evaluation alike. These functions are written here from a reading of
that code (none of it is copied) and are checked against its own verdicts on a corpus of 2,404
completions (tests/data/rewards/, tests/tasks/test_paper_rewards.py): they agree on every case.

Where its code and its prompt or comments disagree, this module follows the code (`rewards.rules:
paper_a` means "count what paper A's tables count"); docs/rewards.md lists those places:
- chemistry reads the first letter of any word in the JSON field ("answer": "acetone" is A) and, with
  no answer statement at all, the last stand-alone letter a-d anywhere (the article "a" is A);
- countdown's expression is evaluated by Python, so `**` and `//` (written with the allowed `*` and
  `/`) count although the prompt lists + - * / only; its box ends at the first `}`;
- MATH reads the last `\\boxed{` even when it never closes (then the answer is empty, hence wrong),
  compares with Python's float() (which reads "1_000" and "10112" for 1011_2), and reads a leading
  \\frac{a}{b} of a longer answer as a/b.
The only departure is a guard paper A lacks: a countdown power whose result would exceed
_MAX_POWER_BITS bits is not evaluated (Python would compute for minutes or run out of memory; no
such number can equal a Countdown target anyway unless cancelled by another equally huge one).
"""

from __future__ import annotations

import ast
import math
import operator
import re

# ----------------------------------------------------------------------------------------------
# Boxes. Countdown and BoolQ read the last `\boxed{...}` up to the FIRST `}` (no nesting, no space
# before the brace); MATH counts braces from the last `\boxed{`.

_FLAT_BOX = re.compile(r"\\boxed\{([^}]*)\}")


def last_flat_box(text: str) -> str | None:
    """Content of the last `\\boxed{` ... first `}` match (regex matches do not overlap), or None."""
    found = _FLAT_BOX.findall(text)
    return found[-1] if found else None


def last_counted_box(text: str) -> str:
    """Content of the box opened by the LAST `\\boxed{`, braces counted; "" when it never closes."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return ""
    depth, i = 1, start + len("\\boxed{")
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{"):i]
        i += 1
    return ""


# ----------------------------------------------------------------------------------------------
# Countdown

_COUNTDOWN_CHARS = re.compile(r"[0-9+\-*/() ]+")
_MAX_POWER_BITS = 1 << 20  # ~10^315,000: far past any float; computing it takes milliseconds
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv}


def _power(base, exponent):
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1 \
            and exponent * math.log2(abs(base)) > _MAX_POWER_BITS:
        raise OverflowError("power too large to evaluate")
    return base ** exponent


def _python_value(node: ast.AST):
    """The value Python's eval gives an expression of integers and + - * / // ** (ints stay ints,
    / gives floats); anything else raises, as eval would (a call, say) or as eval could not."""
    if isinstance(node, ast.Expression):
        return _python_value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _python_value(node.operand)
        return -value if isinstance(node.op, ast.USub) else +value
    if isinstance(node, ast.BinOp):
        left, right = _python_value(node.left), _python_value(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if type(node.op) in _BINARY:
            return _BINARY[type(node.op)](left, right)
    raise ValueError(f"not evaluated: {type(node).__name__}")


def grade_countdown(completion: str, numbers: list[int], target: int) -> bool:
    """The last flat box holds only 0-9 + - * / ( ) and spaces, uses exactly `numbers`, and Python
    evaluates it to within 1e-5 of `target`."""
    box = last_flat_box(completion)
    if box is None:
        return False
    expression = box.strip()
    if _COUNTDOWN_CHARS.fullmatch(expression) is None:
        return False
    if sorted(int(t) for t in re.findall(r"\d+", expression)) != sorted(numbers):
        return False
    try:
        value = _python_value(ast.parse(expression, mode="eval"))
        return abs(float(value) - float(target)) < 1e-5
    except Exception:  # what eval raises (SyntaxError, ZeroDivisionError, TypeError, OverflowError, ...)
        return False


# ----------------------------------------------------------------------------------------------
# MATH

_TEXT = re.compile(r"\\text\{([^}]*)\}")
_LEADING_FRAC = re.compile(r"\\frac\{([^}]+)\}\{([^}]+)\}")  # matched at the start, not the whole answer


def normalize_math(answer: str) -> str:
    """Paper A's normal form: strip, unwrap \\text{}, drop spaces, "5.0" -> "5", drop $ % and degree
    marks, \\dfrac / \\tfrac -> \\frac (in this order: "$5.0$" keeps its ".0")."""
    s = _TEXT.sub(r"\1", answer.strip()).replace(" ", "")
    if "." in s and not any(c.isalpha() for c in s):
        try:
            value = float(s)
            if value == int(value):
                s = str(int(value))
        except (ValueError, OverflowError):
            pass
    for mark in ("\\$", "$", "\\%", "%", "^{\\circ}", "^\\circ", "\\circ"):
        s = s.replace(mark, "")
    return s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")


def _leading_fraction(s: str) -> float | None:
    match = _LEADING_FRAC.match(s)
    if match is None:
        return None
    try:
        return float(match.group(1)) / float(match.group(2))
    except (ValueError, ZeroDivisionError):
        return None


def _number(s: str) -> float:
    """A leading \\frac{a}{b} as a/b, else Python's float() of the text without commas (raises)."""
    value = _leading_fraction(s)
    return float(s.replace(",", "")) if value is None else value


def _slash_value(s: str) -> float:
    parts = s.split("/")
    return float(parts[0]) / float(parts[1])  # "1/2/3" reads 1/2, as paper A's split does


def math_equal(pred: str, gold: str) -> bool:
    """Equal normal forms, else equal numbers (within 1e-6), else an "a/b" on one side only."""
    pred, gold = normalize_math(pred), normalize_math(gold)
    if pred == gold:
        return True
    try:
        if abs(_number(pred) - _number(gold)) < 1e-6:
            return True
    except (ValueError, ZeroDivisionError, OverflowError):
        pass
    try:
        if "/" in pred and "/" not in gold:
            return abs(_slash_value(pred) - float(gold)) < 1e-6
        if "/" in gold and "/" not in pred:
            return abs(_slash_value(gold) - float(pred)) < 1e-6
    except (ValueError, ZeroDivisionError, OverflowError):
        pass
    return False


def grade_math(completion: str, gold: str) -> bool:
    """The box of the last `\\boxed{` (braces counted) is non-empty and equals `gold` (math_equal)."""
    predicted = last_counted_box(completion)
    return bool(predicted) and math_equal(predicted, str(gold))


# ----------------------------------------------------------------------------------------------
# Multiple choice (chemistry) and yes/no (BoolQ)

_CHOICE_JSON = re.compile(r'"answer"\s*:\s*"?([A-Da-d])"?', re.IGNORECASE)
_CHOICE_COLON = re.compile(r"answer\s*:\s*([A-Da-d])\b", re.IGNORECASE)
_CHOICE_ANY = re.compile(r"\b([A-Da-d])\b")


def chosen_letter(completion: str) -> str | None:
    """The last JSON `"answer": X`; else the last `answer: X`; else the last stand-alone a-d."""
    for pattern in (_CHOICE_JSON, _CHOICE_COLON, _CHOICE_ANY):
        found = pattern.findall(completion)
        if found:
            return found[-1].upper()
    return None


def grade_choice(completion: str, gold_letter: str) -> bool:
    return chosen_letter(completion) == str(gold_letter).upper()


_YES_WORDS = frozenset({"yes", "true", "1", "correct", "right"})
_NO_WORDS = frozenset({"no", "false", "0", "incorrect", "wrong"})


def grade_yesno(completion: str, gold: str | bool) -> bool:
    """The last flat box, lower-cased, stripped and without punctuation, is one of the gold's words."""
    box = last_flat_box(completion)
    if box is None:
        return False
    word = re.sub(r"[^\w\s]", "", box.strip().lower().strip())
    if isinstance(gold, bool):
        gold_yes = gold
    else:
        gold_yes = str(gold).strip().lower() in {"yes", "true"}
    return word in (_YES_WORDS if gold_yes else _NO_WORDS)
