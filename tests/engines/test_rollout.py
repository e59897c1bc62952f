"""The transformers rollout engine and the evaluation of one model on one task."""

from __future__ import annotations

import math

import pytest
import torch

from esgrpo.engines.local import PopulationEngine, local_engine
from esgrpo.engines.rollout import (
    HFEngine,
    eos_token_ids,
    id_list,
    lengths_through_eos,
    prompt_text,
    prompt_texts,
)
from esgrpo.evaluation.evaluate import EvalSettings, answer_key, evaluate_rows
from esgrpo.models.default import TinyLlamaSpec, build_tiny_llama, train_tokenizer
from esgrpo.models.warmup import WarmupConfig, build_examples, wrong_format
from esgrpo.tasks.offline import load_sum_yesno, worked_solution


@pytest.fixture(scope="module")
def tiny():
    rows = load_sum_yesno("train", 40, 0)
    tokenizer = train_tokenizer([r["prompt"][-1]["content"] + " " + worked_solution(r) for r in rows], 300)
    model = build_tiny_llama(tokenizer, TinyLlamaSpec(hidden_size=32, intermediate_size=64,
                                                      num_hidden_layers=1, num_attention_heads=2,
                                                      num_key_value_heads=1), seed=0)
    return model.eval(), tokenizer, rows


def test_a_conversation_is_chat_templated_and_a_plain_string_prompt_is_kept(tiny):
    """One prompt rule for ES, GRPO and evaluation, TRL's: messages through the chat template, a plain
    string as it is."""
    _, tokenizer, rows = tiny
    templated = prompt_text(tokenizer, rows[0])
    assert templated == tokenizer.apply_chat_template(rows[0]["prompt"], tokenize=False, add_generation_prompt=True)
    assert rows[0]["prompt"][-1]["content"] in templated and templated != rows[0]["prompt"][-1]["content"]
    plain = {**rows[1], "prompt": "2 + 2 ="}
    assert prompt_texts(tokenizer, [rows[0], plain]) == [templated, "2 + 2 ="]


@pytest.mark.parametrize("engine_class", [HFEngine, PopulationEngine])
def test_sampling_is_reproducible_and_logprobs_match_a_forward(tiny, engine_class):
    model, tokenizer, rows = tiny
    engine = engine_class(model, tokenizer, batch_size=16)
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


@pytest.mark.parametrize("engine_class", [HFEngine, PopulationEngine])
def test_greedy_is_deterministic_and_batch_independent(tiny, engine_class):
    model, tokenizer, rows = tiny
    small = engine_class(model, tokenizer, batch_size=2).generate(rows[:6], n=1, max_new_tokens=8)
    large = engine_class(model, tokenizer, batch_size=64).generate(rows[:6], n=1, max_new_tokens=8)
    assert small.texts == large.texts


def test_the_population_engine_decodes_what_generate_decodes(tiny):
    """eval.backend population: greedy tokens equal transformers' generate, log-probs and entropies agree;
    sampled rollouts differ from generate's (another random stream) but come from the same model, so
    their recorded log-probs still match a forward (test above). A backend without an engine is an error."""
    model, tokenizer, rows = tiny
    hf = HFEngine(model, tokenizer, batch_size=8).generate(rows[:8], n=1, max_new_tokens=10)
    pop = local_engine(model, tokenizer, "population", batch_size=8).generate(rows[:8], n=1, max_new_tokens=10)
    assert pop.token_ids == hf.token_ids and pop.texts == hf.texts
    for a, b in ((pop.logprobs, hf.logprobs), (pop.entropies, hf.entropies)):
        assert [x for seq in a for s in seq for x in s] == pytest.approx([x for seq in b for s in seq for x in s],
                                                                          abs=1e-4)
    sampled = dict(rows=rows[:4], n=4, temperature=1.0, max_new_tokens=10, seed=3)
    assert local_engine(model, tokenizer, "population").generate(**sampled).token_ids != \
        HFEngine(model, tokenizer).generate(**sampled).token_ids
    with pytest.raises(ValueError, match="eval.backend 'vllm'"):
        local_engine(model, tokenizer, "vllm")


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


def test_eos_ids_join_the_generation_config_and_the_tokenizer_and_lengths_stop_at_the_first(tiny):
    model, tokenizer, _ = tiny
    assert id_list(None) == [] and id_list(7) == [7] and id_list((7, 9)) == [7, 9]
    assert eos_token_ids(model, tokenizer) == [tokenizer.eos_token_id]
    model.generation_config.eos_token_id = [11, tokenizer.eos_token_id]  # a chat model's several turn ends
    try:
        assert eos_token_ids(model, tokenizer) == [11, tokenizer.eos_token_id]
        model.generation_config.eos_token_id = 11
        assert eos_token_ids(model, tokenizer) == [11, tokenizer.eos_token_id]
    finally:
        model.generation_config.eos_token_id = tokenizer.eos_token_id
    no_eos = type("T", (), {"eos_token_id": None})()
    with pytest.raises(ValueError, match="EOS"):
        eos_token_ids(object(), no_eos)
    tokens = torch.tensor([[5, 11, 0, 0], [5, 6, 7, 8], [2, 5, 2, 2]])
    for eos in ([11, 2], [], [8]):  # against the plain definition, row by row
        want = [next((i + 1 for i, t in enumerate(row) if t in eos), len(row)) for row in tokens.tolist()]
        assert lengths_through_eos(tokens, eos).tolist() == want


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


def test_evaluate_checkpoint_sizes_a_vllm_engine_for_its_longest_prompt(tiny, tmp_path, monkeypatch):
    """eval.backend vllm: one engine for every eval task of the checkpoint, its max_model_len the longest
    prompt over all tasks (chat template included) + eval.max_new_tokens; the engine block passes through."""
    from esgrpo.engines import vllm_engine
    from esgrpo.engines.vllm_engine import prompt_token_ids
    from esgrpo.files import read_json, write_json, write_jsonl
    from esgrpo.workflow.stages.evaluation import evaluate_checkpoint

    model, tokenizer, rows = tiny
    tokenizer.save_pretrained(tmp_path / "model")
    short = rows[:3]
    long = [{**r, "prompt": [{"role": "user", "content": r["prompt"][-1]["content"] * 3}]} for r in rows[3:5]]
    inputs = {"test": [], "info": []}
    for task, task_rows in (("short", short), ("long", long)):
        write_jsonl(tmp_path / task / "test.jsonl", task_rows)
        write_json(tmp_path / task / "info.json", {"verifier": "yesno"})
        inputs["test"].append(str(tmp_path / task / "test.jsonl"))
        inputs["info"].append(str(tmp_path / task / "info.json"))
    built = []

    class Engine(HFEngine):  # vLLM's stand-in: records how it is built, generates with transformers
        def __init__(self, model_ref, dtype="bfloat16", **llm_kwargs):
            built.append((model_ref, dtype, llm_kwargs))
            super().__init__(model, tokenizer)

    monkeypatch.setattr(vllm_engine, "VLLMEngine", Engine)
    params = {"eval": {"backend": "vllm", "n_samples": 2, "ks": [1, 2], "max_new_tokens": 6, "test_size": None,
                       "engine": {"gpu_memory_utilization": 0.4}},
              "model": str(tmp_path / "model"), "eval_tasks": ["short", "long"], "run": "base", "train_task": "none"}
    evaluate_checkpoint(inputs, {"summary": str(tmp_path / "eval.json"), "prompts": str(tmp_path / "p.jsonl")},
                        params, {"model": "tiny"}, 1)
    longest = max(len(ids) for ids in prompt_token_ids(tokenizer, short + long))
    assert longest > max(len(ids) for ids in prompt_token_ids(tokenizer, short))  # the long task sets it
    assert built == [(str(tmp_path / "model"), "bfloat16", {"gpu_memory_utilization": 0.4, "max_model_len": longest + 6})]
    assert [e["eval_task"] for e in read_json(tmp_path / "eval.json")["evaluations"]] == ["short", "long"]


def _vllm_outputs(rollouts) -> list:
    """`rollouts` as vLLM's `RequestOutput`s with ``logprobs=0``: each token's entry holds the sampled token only."""
    from types import SimpleNamespace

    return [SimpleNamespace(outputs=[SimpleNamespace(index=j, text=text, token_ids=ids,
                                                     logprobs=[{t: lp} for t, lp in zip(ids, lps, strict=True)])
                                     for j, (text, ids, lps) in enumerate(zip(texts, id_rows, lp_rows, strict=True))])
            for texts, id_rows, lp_rows in zip(rollouts.texts, rollouts.token_ids, rollouts.logprobs, strict=True)]


def test_sampled_nll_estimates_the_exact_entropy_at_temperature_one_only(tiny):
    """vLLM's entropy on sampled rollouts (esgrpo.engines.vllm_engine: the sampled tokens' -log p) against transformers'
    exact entropy at the same positions: within sampling error at temperature 1; at temperature 0.5 the
    sampled tokens are the likelier ones and -log p falls far below the entropy (why it is not used there)."""
    import copy

    import numpy as np

    from esgrpo.engines.vllm_engine import SAMPLED_NLL, entropy_estimator, rollouts_from_outputs

    model, tokenizer, rows = tiny
    peaked = copy.deepcopy(model)
    with torch.no_grad():
        peaked.model.norm.weight.mul_(12.0)  # logits x 12: ~1.3 nats instead of ~log V = 5.7
    engine = HFEngine(peaked, tokenizer, batch_size=256)
    for temperature, agrees in ((1.0, True), (0.5, False)):
        sampled = engine.generate(rows[:16], n=16, temperature=temperature, max_new_tokens=12, seed=7)
        estimate = rollouts_from_outputs(_vllm_outputs(sampled), 16, SAMPLED_NLL)
        exact = np.array([e for per_prompt in sampled.entropies for seq in per_prompt for e in seq])
        nll = np.array([e for per_prompt in estimate.entropies for seq in per_prompt for e in seq])
        assert sampled.entropy_estimator == "exact" and estimate.entropy_estimator == "sampled_nll"
        assert len(nll) == len(exact) > 1000 and 0.5 < exact.mean() < 3.5
        error = (nll - exact).std() / math.sqrt(len(nll))  # E[-log p(x_t) - H_t | prefix] = 0 at temperature 1
        gap = estimate.mean_entropy() - sampled.mean_entropy()
        print(f"T={temperature}: exact {sampled.mean_entropy():.4f} nats, sampled -log p {estimate.mean_entropy():.4f}, "
              f"gap {gap:+.4f}, standard error {error:.4f}, {len(nll)} tokens")
        assert (abs(gap) < 4 * error) == agrees, (temperature, gap, error)
        assert (entropy_estimator(temperature, 1.0, 20) == SAMPLED_NLL) == agrees
