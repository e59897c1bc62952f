"""Offline default tasks: deterministic, disjoint splits, short prompts, answers our own grader accepts."""

from __future__ import annotations

import random

import pytest

from esgrpo.rewards import reward
from esgrpo.tasks.offline import countdown_solutions, evaluate_expression, worked_solution
from esgrpo.tasks.registry import OFFLINE_TASKS, get_task


@pytest.fixture(scope="module")
def splits():
    return {name: {split: OFFLINE_TASKS[name].loader(split, 60, 0) for split in ("train", "test")}
            for name in OFFLINE_TASKS}


def test_generators_are_deterministic(splits):
    for name in OFFLINE_TASKS:
        assert OFFLINE_TASKS[name].loader("test", 60, 0) == splits[name]["test"]


def test_splits_never_overlap_even_across_seeds(splits):
    for name in OFFLINE_TASKS:
        other_seed_train = OFFLINE_TASKS[name].loader("train", 200, 1)
        test_questions = {r["prompt"][-1]["content"] for r in splits[name]["test"]}
        assert not test_questions & {r["prompt"][-1]["content"] for r in splits[name]["train"]}
        assert not test_questions & {r["prompt"][-1]["content"] for r in other_seed_train}


def test_worked_solutions_earn_full_reward_and_wrong_format_earns_none(splits):
    """Right answers outside \\boxed{} score 0 under paper B's boxed reward (the default's fitness)."""
    rng = random.Random(0)
    for name, spec in OFFLINE_TASKS.items():
        for row in splits[name]["train"][:30]:
            right = worked_solution(row, rng=rng)
            unboxed = worked_solution(row, wrong_format=True)
            assert reward(spec.verifier, right, row["answer"], row["meta"], scheme="boxed_partial") == 1.0
            assert reward(spec.verifier, unboxed, row["answer"], row["meta"], scheme="boxed_partial") == 0.0


def test_countdown_solutions_are_all_right_and_include_the_generators():
    numbers, target = [3, 4, 5], 17
    solutions = countdown_solutions(numbers, target)
    assert "3*4+5" in solutions
    for expression in solutions:
        assert abs(evaluate_expression(expression) - target) < 1e-9
        assert sorted(int(c) for c in expression if c.isdigit()) == sorted(numbers)


def test_prompts_and_answers_are_short_in_the_default_tokenizer(splits):
    from esgrpo.models import prompt_texts, train_tokenizer

    rows = [r for name in splits for r in splits[name]["train"]]
    tokenizer = train_tokenizer([r["prompt"][-1]["content"] + " " + worked_solution(r) for r in rows])
    for row, text in zip(rows, prompt_texts(tokenizer, rows), strict=True):
        assert len(tokenizer(text)["input_ids"]) < 48, text
        assert len(tokenizer(worked_solution(row))["input_ids"]) < 48


def test_registry_names_unknown_task():
    with pytest.raises(KeyError, match="unknown task 'nope'"):
        get_task("nope")
