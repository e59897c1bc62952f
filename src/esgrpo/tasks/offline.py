"""Offline tasks for the embedded default: instances from reasoning-gym generators, re-templated short.

Four kinds mirror paper A's four tasks (Countdown, MATH, Chemistry MCQ, BoolQ) in miniature; a
fifth, of another kind (ordering words, no arithmetic), is the held-out task no run trains on:

| task        | generator (reasoning-gym) | answer                 | verifier  |
|-------------|---------------------------|------------------------|-----------|
| countdown3  | countdown, 3 numbers      | an expression (many)   | countdown |
| leg_count   | leg_counting              | a number               | math      |
| sum_choice  | chain_sum, 4 options      | a letter A-D           | choice    |
| sum_yesno   | chain_sum, claimed value  | yes / no               | yesno     |
| word_order  | word_sorting, 3 words     | a letter A-C           | choice    |

Prompts are rewritten from the generator's metadata because its own wording is far longer
than a tiny model's context. Every answer is recomputed with our own arithmetic (the
generators' conventions differ, see docs/references.md) and instances that disagree are dropped.

Splits never overlap: the pool is deduplicated by question and a stable hash of the
question text decides train or test, so the split of a question does not depend on the seed.
"""

from __future__ import annotations

import ast
import itertools
import operator
import random
import zlib
from collections.abc import Callable

from esgrpo.tasks.base import Row, make_row

TEST_FRACTION = 0.2

# Worked solutions used by the warm-up. `wrong_format` solutions end without \boxed{}: the
# base model then sometimes answers right in the wrong format, as instruct models do before RL.
WRONG_FORMAT_SUFFIX = "answer: {}"


def _split_of(question: str) -> str:
    return "test" if zlib.crc32(question.encode()) % 1000 < TEST_FRACTION * 1000 else "train"


_BINOPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
}


def evaluate_expression(expression: str) -> float:
    """Exact arithmetic of + - * / and parentheses with the usual precedence."""

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        raise ValueError(f"unsupported expression {expression!r}")

    return walk(ast.parse(expression, mode="eval"))


def _rg_dataset(name: str, size: int, seed: int, **options):
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=size, seed=seed, **options)


def _take(rows_by_question: dict[str, Row], split: str, size: int | None) -> list[Row]:
    rows = [r for q, r in rows_by_question.items() if _split_of(q) == split]
    return rows if size is None else rows[:size]


def _pool_size(size: int | None, split: str) -> int:
    wanted = size or 1000
    fraction = TEST_FRACTION if split == "test" else 1 - TEST_FRACTION
    return int(wanted / fraction * 1.6) + 64  # headroom for duplicates and dropped instances


def load_countdown3(split: str, size: int | None, seed: int, **_: object) -> list[Row]:
    """Reach a target with three one-digit numbers, each used once: many right answers."""
    pool = _rg_dataset("countdown", _pool_size(size, split), seed, min_numbers=3, max_numbers=3,
                       min_value=1, max_value=9, min_target=1, max_target=30)
    rows: dict[str, Row] = {}
    for entry in pool:
        meta = entry["metadata"]
        numbers, target = [int(n) for n in meta["numbers"]], int(meta["target"])
        expression = meta["expression"].replace(" ", "")
        if abs(evaluate_expression(expression) - target) > 1e-9:
            continue
        question = f"Use {' '.join(map(str, numbers))} to make {target}."
        solutions = countdown_solutions(numbers, target)
        rows.setdefault(question, make_row(
            f"countdown3-{zlib.crc32(question.encode()):08x}", question, expression,
            {"numbers": numbers, "target": target, "solutions": solutions,
             "solution": f"{expression}={target}", "final": expression}))
    return _take(rows, split, size)


def countdown_solutions(numbers: list[int], target: int) -> list[str]:
    """Every expression of the three numbers (each once, two bracketings) that hits the target."""
    found: list[str] = []
    for a, b, c in sorted(set(itertools.permutations(numbers))):
        for op1, op2 in itertools.product("+-*/", repeat=2):
            for expression in (f"({a}{op1}{b}){op2}{c}", f"{a}{op1}({b}{op2}{c})"):
                try:
                    value = evaluate_expression(expression)
                except ZeroDivisionError:
                    continue
                if abs(value - target) < 1e-9:
                    found.append(_drop_redundant_brackets(expression))
    return sorted(set(found))


def _drop_redundant_brackets(expression: str) -> str:
    """`(a+b)+c` -> `a+b+c` where removing the brackets keeps the value and the order of operations."""
    if expression.startswith("("):
        inner, rest = expression[1:].split(")", 1)
        bare = inner + rest
    else:
        head, inner = expression[:-1].split("(", 1)
        bare = head + inner
    if ast.dump(ast.parse(bare, mode="eval")) == ast.dump(ast.parse(expression, mode="eval")):
        return bare
    return expression


def load_leg_count(split: str, size: int | None, seed: int, **_: object) -> list[Row]:
    """Count the legs of a few animals: memorised facts plus multiply-and-add."""
    pool = _rg_dataset("leg_counting", _pool_size(size, split), seed, min_animals=1, max_animals=2,
                       max_instances=3)
    legs_per_animal = _legs_table(pool)
    rows: dict[str, Row] = {}
    for entry in pool:
        animals = entry["metadata"]["animals"]
        if any(name not in legs_per_animal for name in animals):
            continue
        total = sum(count * legs_per_animal[name] for name, count in animals.items())
        if total != int(entry["answer"]):
            continue
        listed = " and ".join(f"{count} {name}" for name, count in animals.items())
        question = f"Legs of {listed}?"
        steps = "+".join(f"{count}*{legs_per_animal[name]}" for name, count in animals.items())
        rows.setdefault(question, make_row(
            f"leg_count-{zlib.crc32(question.encode()):08x}", question, str(total),
            {"solution": f"{steps}={total}", "final": str(total)}))
    return _take(rows, split, size)


def _legs_table(pool) -> dict[str, int]:
    """Legs per animal, read off single-species instances (the generator's own facts)."""
    table: dict[str, int] = {}
    for entry in pool:
        animals = entry["metadata"]["animals"]
        if len(animals) == 1:
            (name, count), = animals.items()
            table[name] = int(entry["answer"]) // count
    return table


def _chain_sums(split: str, size: int | None, seed: int) -> dict[str, tuple[str, int]]:
    pool = _rg_dataset("chain_sum", _pool_size(size, split), seed, min_terms=2, max_terms=3,
                       min_digits=1, max_digits=1)
    sums: dict[str, tuple[str, int]] = {}
    for entry in pool:
        expression = entry["metadata"]["expression"].replace(" ", "")
        value = evaluate_expression(expression)
        if value != int(entry["answer"]):
            continue
        sums.setdefault(expression, (expression, int(value)))
    return sums


def load_sum_choice(split: str, size: int | None, seed: int, **_: object) -> list[Row]:
    """A sum with four options: a multiple-choice task (one letter is right)."""
    rows: dict[str, Row] = {}
    for expression, value in _chain_sums(split, size, seed).values():
        rng = random.Random(zlib.crc32(expression.encode()) ^ seed)
        options = {value}
        while len(options) < 4:
            options.add(value + rng.choice([-3, -2, -1, 1, 2, 3]))
        ordered = sorted(options)
        rng.shuffle(ordered)
        letter = "ABCD"[ordered.index(value)]
        choices = " ".join(f"{'ABCD'[i]}){o}" for i, o in enumerate(ordered))
        question = f"{expression}=? {choices}"
        rows.setdefault(question, make_row(
            f"sum_choice-{zlib.crc32(question.encode()):08x}", question, letter,
            {"solution": f"{expression}={value}", "final": letter}))
    return _take(rows, split, size)


def load_sum_yesno(split: str, size: int | None, seed: int, **_: object) -> list[Row]:
    """Is a claimed sum right? Half the claims are off by one to three."""
    rows: dict[str, Row] = {}
    for expression, value in _chain_sums(split, size, seed + 7919).values():
        rng = random.Random(zlib.crc32(expression.encode()) ^ (seed + 1))
        truthful = rng.random() < 0.5
        claimed = value if truthful else value + rng.choice([-3, -2, -1, 1, 2, 3])
        question = f"Is {expression}={claimed}?"
        answer = "yes" if truthful else "no"
        rows.setdefault(question, make_row(
            f"sum_yesno-{zlib.crc32(question.encode()):08x}", question, answer,
            {"solution": f"{expression}={value}", "final": answer}))
    return _take(rows, split, size)


def load_word_order(split: str, size: int | None, seed: int, **_: object) -> list[Row]:
    """Which of three short lowercase words comes first in a-z (or z-a) order, as a letter A-C.

    The generator's word-sorting instances, asked for the first word of the order only and as a
    choice, because the tiny model cannot write the words out beside the four other tasks
    (docs/references.md, CPU measurements: the warm-up). Only words of letters with distinct first
    letters are kept, so the worked solution (the first letters in order) decides the answer.
    """
    from reasoning_gym.algorithmic.word_sorting import TextTransformation

    pool = _rg_dataset("word_sorting", _pool_size(size, split), seed, min_words=3, max_words=3,
                       min_word_length=3, max_word_length=5, transformation=TextTransformation.LOWERCASE)
    rows: dict[str, Row] = {}
    for entry in pool:
        meta = entry["metadata"]
        words, descending = list(meta["transformed_words"]), meta["direction"] == "descending"
        if not all(w.isalpha() for w in words) or len({w[0] for w in words}) < len(words):
            continue
        ordered = sorted(words, reverse=descending)
        if ordered != meta["sorted_words"]:
            continue
        letter = "ABC"[words.index(ordered[0])]
        options = " ".join(f"{'ABC'[i]}){word}" for i, word in enumerate(words))
        question = f"First {'z-a' if descending else 'a-z'}: {options}"
        steps = (">" if descending else "<").join(w[0] for w in ordered)
        rows.setdefault(question, make_row(
            f"word_order-{zlib.crc32(question.encode()):08x}", question, letter,
            {"solution": steps, "final": letter}))
    return _take(rows, split, size)


def worked_solution(row: Row, wrong_format: bool = False, rng: random.Random | None = None) -> str:
    """The warm-up target for a row: its working, then the final answer boxed (or not).

    Rows with several right answers (countdown) draw one at random when `rng` is given, so
    the warmed-up model has diverse solution paths for sampling to find.
    """
    meta = row["meta"]
    solution, final = meta["solution"], meta["final"]
    if rng is not None and meta.get("solutions"):
        final = rng.choice(meta["solutions"])
        solution = f"{final}={meta['target']}"
    ending = WRONG_FORMAT_SUFFIX.format(final) if wrong_format else f"\\boxed{{{final}}}"
    return f"{solution} {ending}"
