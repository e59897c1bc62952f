"""The transformers rollout engine and the evaluation of one model on one task."""

from __future__ import annotations

import math

import pytest
import torch

from esgrpo.evaluate import EvalSettings, answer_key, evaluate_rows
from esgrpo.models import TinyLlamaSpec, build_tiny_llama, train_tokenizer
from esgrpo.rollout import HFEngine
from esgrpo.tasks.offline import load_sum_yesno, worked_solution
from esgrpo.warmup import WarmupConfig, build_examples, wrong_format


@pytest.fixture(scope="module")
def tiny():
    rows = load_sum_yesno("train", 40, 0)
    tokenizer = train_tokenizer([r["prompt"][-1]["content"] + " " + worked_solution(r) for r in rows], 300)
    model = build_tiny_llama(tokenizer, TinyLlamaSpec(hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=1, num_attention_heads=2,
                                                      num_key_value_heads=1), seed=0)
    return model.eval(), tokenizer, rows


def test_sampling_is_reproducible_and_logprobs_match_a_forward(tiny):
    model, tokenizer, rows = tiny
    engine = HFEngine(model, tokenizer, batch_size=16)
    a = engine.generate(rows[:6], n=3, temperature=1.0, max_new_tokens=8, seed=5)
    b = engine.generate(rows[:6], n=3, temperature=1.0, max_new_tokens=8, seed=5)
    assert a.texts == b.texts and a.token_ids == b.token_ids
    assert len(a.texts) == 6 and all(len(t) == 3 for t in a.texts)
    # The recorded log-prob of each token equals a teacher-forced forward of prompt + completion.
    prompt = tokenizer.apply_chat_template(rows[0]["prompt"], tokenize=False, add_generation_prompt=True)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + a.token_ids[0][0]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), -1)
    expected = [logp[len(prompt_ids) - 1 + i, tok].item() for i, tok in enumerate(a.token_ids[0][0])]
    assert a.logprobs[0][0] == pytest.approx(expected, abs=1e-4)
    assert all(e >= 0 and math.isfinite(e) for seq in a.entropies[0] for e in seq)


def test_greedy_is_deterministic_and_batch_independent(tiny):
    model, tokenizer, rows = tiny
    small = HFEngine(model, tokenizer, batch_size=2).generate(rows[:6], n=1, max_new_tokens=8)
    large = HFEngine(model, tokenizer, batch_size=64).generate(rows[:6], n=1, max_new_tokens=8)
    assert small.texts == large.texts


def test_evaluate_rows_counts_and_metrics(tiny):
    model, tokenizer, rows = tiny
    summary, per_prompt = evaluate_rows(HFEngine(model, tokenizer), rows[:8], "yesno",
                                        EvalSettings(n_samples=4, ks=[1, 2, 4], max_new_tokens=8))
    assert summary["n_prompts"] == 8 and len(per_prompt) == 8
    assert summary["pass@1"] == pytest.approx(summary["mean@4"])
    assert summary["pass@1"] <= summary["pass@2"] <= summary["pass@4"] <= 1
    assert all(0 <= r["correct"] <= 4 for r in per_prompt)
    with pytest.raises(ValueError, match="eval.ks"):
        EvalSettings(n_samples=4, ks=[8])


def test_answer_key_normalises_the_boxed_answer():
    assert answer_key("so \\boxed{ Yes }") == "yes"
    assert answer_key("no box") is None


def test_warmup_examples_mask_the_prompt_and_follow_the_format_split(tiny):
    _, tokenizer, rows = tiny
    import random

    examples = build_examples(tokenizer, rows, 0.3, random.Random(0))
    for (ids, prompt_len), row in zip(examples, rows, strict=True):
        completion = tokenizer.decode(ids[prompt_len:], skip_special_tokens=True)
        assert ("\\boxed{" in completion) != wrong_format(row["prompt"][-1]["content"], 0.3)
        assert ids[-1] == tokenizer.eos_token_id
    assert WarmupConfig().min_accuracy < WarmupConfig().max_accuracy
