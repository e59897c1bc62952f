"""Offline default tasks: deterministic, disjoint splits, short prompts, answers our own grader accepts."""

from __future__ import annotations

import random
import re

import pytest

from esgrpo.tasks.offline import countdown_solutions, evaluate_expression, worked_solution
from esgrpo.tasks.registry import OFFLINE_TASKS, get_task
from esgrpo.tasks.rewards import reward
from tests.conftest import REPO


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
    from esgrpo.engines.rollout import prompt_texts
    from esgrpo.models.default import train_tokenizer

    rows = [r for name in splits for r in splits[name]["train"]]
    tokenizer = train_tokenizer([r["prompt"][-1]["content"] + " " + worked_solution(r) for r in rows])
    for row, text in zip(rows, prompt_texts(tokenizer, rows), strict=True):
        assert len(tokenizer(text)["input_ids"]) < 48, text
        assert len(tokenizer(worked_solution(row))["input_ids"]) < 48


def test_registry_names_unknown_task():
    with pytest.raises(KeyError, match="unknown task 'nope'"):
        get_task("nope")


# --- word_order: the held-out task of the default grid (a skill of the base that no run trains)


QUESTION = re.compile(r"First (a-z|z-a): A\)([a-z]+) B\)([a-z]+) C\)([a-z]+)")


def test_word_order_answers_are_recomputed_and_agree_with_the_generator():
    from reasoning_gym.algorithmic.word_sorting import TextTransformation

    from esgrpo.tasks.offline import _pool_size, _rg_dataset

    rows = OFFLINE_TASKS["word_order"].loader("train", 60, 0)
    assert len(rows) == 60
    for row in rows:
        order, *words = QUESTION.fullmatch(row["prompt"][-1]["content"]).groups()
        ordered = sorted(words, reverse=order == "z-a")
        assert len({w[0] for w in words}) == 3
        assert row["answer"] == "ABC"[words.index(ordered[0])]
        assert row["meta"]["solution"] == ("<" if order == "a-z" else ">").join(w[0] for w in ordered)
    # the generator's own sorted answer (`w1, w2, w3`) for the same words and direction starts with ours
    theirs = {(tuple(e["metadata"]["transformed_words"]), e["metadata"]["direction"]): e["answer"]
              for e in _rg_dataset("word_sorting", _pool_size(60, "train"), 0, min_words=3, max_words=3,
                                   min_word_length=3, max_word_length=5,
                                   transformation=TextTransformation.LOWERCASE)}
    for row in rows:
        order, *words = QUESTION.fullmatch(row["prompt"][-1]["content"]).groups()
        key = (tuple(words), "descending" if order == "z-a" else "ascending")
        assert theirs[key].split(", ")[0] == words["ABC".index(row["answer"])]


def test_word_order_split_of_a_question_does_not_depend_on_size_or_seed():
    small, large = (OFFLINE_TASKS["word_order"].loader("test", n, 0) for n in (20, 80))
    assert small == large[:20]
    train_other_seed = {r["prompt"][-1]["content"] for r in OFFLINE_TASKS["word_order"].loader("train", 400, 3)}
    assert not {r["prompt"][-1]["content"] for r in large} & train_other_seed


def test_word_order_verifier_takes_the_right_letter_only():
    for row in OFFLINE_TASKS["word_order"].loader("test", 20, 0):
        steps = row["meta"]["solution"]
        for letter in "ABC":
            completion = f"{steps} \\boxed{{{letter}}}"
            assert reward(OFFLINE_TASKS["word_order"].verifier, completion, row["answer"]) == float(letter == row["answer"])
        assert reward("choice", f"{steps} answer: {row['answer']}", row["answer"], scheme="boxed_partial") == 0.0


def test_the_default_config_holds_word_order_out_of_training_but_in_the_warm_up():
    import yaml

    from esgrpo.config import check_config, model_warmup_tasks, task_splits

    config = yaml.safe_load((REPO / "config.yaml").read_text())
    check_config(config)  # eval_tasks beyond the training tasks are accepted
    assert all("word_order" not in spec["tasks"] for spec in config["models"].values())
    assert model_warmup_tasks(config, "tiny") == [*config["models"]["tiny"]["tasks"], "word_order"]
    assert task_splits(config, "word_order") == ["train", "test"]  # train rows for the warm-up only
    # a model not built here is not warmed up: its held-out task needs no train split
    hub = {**config, "models": {"m": {"source": "some/hub-model", "tasks": ["countdown3"],
                                      "eval_tasks": ["countdown3", "word_order"]}}}
    assert task_splits(hub, "word_order") == ["test"]


def test_warm_up_applies_max_accuracy_to_trained_tasks_only(monkeypatch):
    """A held-out task learnt well does not stop the warm-up early (RL needs headroom only where it trains)."""
    from esgrpo.models import warmup
    from esgrpo.models.default import TinyLlamaSpec, build_tiny_llama, train_tokenizer

    rows = {"trained": OFFLINE_TASKS["sum_yesno"].loader("train", 16, 0),
            "held_out": OFFLINE_TASKS["word_order"].loader("train", 16, 0)}
    tokenizer = train_tokenizer([r["prompt"][-1]["content"] + " " + worked_solution(r)
                                 for task_rows in rows.values() for r in task_rows], 300)
    spec = TinyLlamaSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1)
    accuracy = {"yesno": 0.1, "choice": 0.9}  # the trained task below min_accuracy, the held-out one above max
    monkeypatch.setattr(warmup, "greedy_accuracy", lambda model, tok, task_rows, verifier, n: accuracy[verifier])
    cfg = warmup.WarmupConfig(steps_max=4, batch_size=8, check_every=2, dev_size=4)
    verifiers = {"trained": "yesno", "held_out": "choice"}
    every = warmup.warm_up(build_tiny_llama(tokenizer, spec, 0), tokenizer, rows, verifiers, cfg, log=lambda c: None)
    assert (every["steps"], every["stopped_because"]) == (2, "a trained task reached max_accuracy")
    trained_only = warmup.warm_up(build_tiny_llama(tokenizer, spec, 0), tokenizer, rows, verifiers, cfg,
                                  log=lambda c: None, headroom_tasks=["trained"])
    assert (trained_only["steps"], trained_only["stopped_because"]) == (4, "steps_max")
    # a batch larger than the 32 examples never fills: an error, not a loop that never steps
    with pytest.raises(ValueError, match="batch_size=33 is more than the 32 warm-up examples"):
        warmup.warm_up(build_tiny_llama(tokenizer, spec, 0), tokenizer, rows, verifiers,
                       warmup.WarmupConfig(steps_max=4, batch_size=33), log=lambda c: None)
