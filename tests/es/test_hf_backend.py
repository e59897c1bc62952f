"""The transformers ES backend's default evaluator (esgrpo.es.hf_backend): each member graded like a greedy
reference generate, with and without the population engine, end to end through the trainer."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from esgrpo.es.hf_backend import make_population_evaluator, theta_from_model, trainable_names
from esgrpo.es.ops import (
    iter_population,
    member_seeds,
    perturbed_population,
)
from esgrpo.es.settings import ESConfig
from esgrpo.files import read_jsonl
from tests.es.helpers import run_es, tiny_llama

# --------------------------------------------------------------------------- the default evaluator


def reference_generate(model, stacked, input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id,
                       temperature, top_p, generator):
    """Greedy decoding of each member through the model itself (no cache): a slow but plain reference."""
    from torch.func import functional_call

    n_members, batch = next(iter(stacked.values())).shape[0], input_ids.shape[0]
    tokens = torch.full((n_members, batch, max_new_tokens), pad_token_id, dtype=torch.long)
    lengths = torch.zeros(n_members, batch, dtype=torch.long)
    entropies = torch.zeros(n_members, batch, max_new_tokens)
    for n in range(n_members):
        weights = {k: v[n] for k, v in stacked.items()}
        ids, mask = input_ids.clone(), attention_mask.clone()
        done = torch.zeros(batch, dtype=torch.bool)
        for step in range(max_new_tokens):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = functional_call(model, weights, (), {"input_ids": ids, "attention_mask": mask,
                                                          "position_ids": positions}).logits[:, -1].float()
            logp = torch.log_softmax(logits, -1)
            nxt = torch.where(done, torch.full_like(logits[:, 0], pad_token_id, dtype=torch.long), logits.argmax(-1))
            tokens[n, :, step] = nxt
            entropies[n, :, step] = torch.where(done, 0.0, -(logp.exp() * logp).sum(-1))
            lengths[n] += (~done).long()
            done |= torch.isin(nxt, torch.tensor(eos_token_id).reshape(-1))
            ids, mask = torch.cat([ids, nxt[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return SimpleNamespace(tokens=tokens, lengths=lengths, entropies=entropies)


@pytest.fixture(scope="module")
def tokenizer():
    from esgrpo.models.default import train_tokenizer

    return train_tokenizer(["12+3=15", "what is 4*5? 20", "7-2=5 done"], vocab_size=280)


def test_default_evaluator_grades_each_member_like_hf_generate(tokenizer, tmp_path):
    model = tiny_llama(vocab=len(tokenizer), layers=1)
    rows = [{"id": str(i), "prompt": [{"role": "user", "content": q}], "answer": "x"}
            for i, q in enumerate(["1+2", "what is 33?", "7*8 ="])]

    def verifier(text: str, row) -> float:  # a deterministic grade with 0, 0.5 and 1 in it
        return (len(text) % 3) / 2

    evaluate = make_population_evaluator(model, tokenizer, verifier, reference_generate)
    cfg = ESConfig(population_size=4, sigma=0.5, max_new_tokens=6)  # large sigma: members differ
    theta = theta_from_model(model, trainable_names(model, ["*"]))
    seeds = member_seeds(0, 0, 4, antithetic=False)
    stacked = evaluate(perturbed_population(theta, seeds, cfg.sigma), rows, cfg)
    sequential = evaluate(iter_population(theta, seeds, cfg.sigma), rows, cfg)
    np.testing.assert_array_equal(stacked.fitness, sequential.fitness)
    assert stacked.generated_tokens == sequential.generated_tokens
    # independently: each member loaded into the model and decoded by transformers' generate
    enc_texts = [tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True)
                 for r in rows]
    tokenizer.padding_side = "left"
    enc = tokenizer(enc_texts, return_tensors="pt", padding=True, add_special_tokens=False)
    rewards = np.zeros((4, 3))
    tokens = 0
    with torch.no_grad():
        for n, member in enumerate(iter_population(theta, seeds, cfg.sigma)):
            params = dict(model.named_parameters())
            for k, v in member.items():
                params[k].copy_(v)
            out = model.generate(**enc, do_sample=False, max_new_tokens=6, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id)
            for b in range(3):
                new = out[b, enc["input_ids"].shape[1]:].tolist()
                length = next((i + 1 for i, t in enumerate(new) if t == tokenizer.eos_token_id), len(new))
                tokens += length
                rewards[n, b] = verifier(tokenizer.decode(new[:length], skip_special_tokens=True), rows[b])
    np.testing.assert_allclose(stacked.fitness, rewards.mean(axis=1))
    np.testing.assert_array_equal(stacked.success, rewards >= 1)
    assert stacked.generated_tokens == tokens and stacked.rollouts == 12
    assert math.isfinite(stacked.entropy) and stacked.entropy > 0


def test_train_es_end_to_end_with_default_evaluator_saves_hf_model(tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny_llama(vocab=len(tokenizer), layers=1)
    rows = [{"id": str(i), "prompt": [{"role": "user", "content": f"{i}+{i}"}], "answer": str(2 * i)}
            for i in range(4)]
    evaluate = make_population_evaluator(model, tokenizer, lambda text, row: float(len(text) % 2),
                                         reference_generate, prompt_chunk=2)
    cfg = ESConfig(population_size=4, sigma=0.3, alpha=0.05, iterations=2, prompts_per_iteration=2,
                   max_new_tokens=4, checkpoint_every=1)
    summary = run_es(model, tokenizer, rows, cfg, evaluate, tmp_path / "o", tmp_path / "p", log=lambda s: None)
    rows_logged = read_jsonl(tmp_path / "o" / "metrics.jsonl")
    assert len(rows_logged) == 2 and rows_logged[-1]["rollouts"] == 2 * 4 * 2
    assert all(0 <= r["js_diversity"] <= math.log(2) for r in rows_logged)
    assert summary["generated_tokens"] == rows_logged[-1]["generated_tokens"] > 0
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "o" / "model")
    AutoTokenizer.from_pretrained(tmp_path / "o" / "model")
    for k, v in model.state_dict().items():
        assert torch.equal(reloaded.state_dict()[k], v), k


def test_default_evaluator_with_the_population_engine_if_present(tokenizer):
    population = pytest.importorskip("esgrpo.engines.population")
    model = tiny_llama(vocab=len(tokenizer), layers=1)
    rows = [{"id": "0", "prompt": [{"role": "user", "content": "1+2"}], "answer": "3"},
            {"id": "1", "prompt": [{"role": "user", "content": "what is 33?"}], "answer": "33"}]
    theta = theta_from_model(model, trainable_names(model, ["*"]))
    seeds = member_seeds(0, 0, 4, antithetic=False)
    cfg = ESConfig(population_size=4, sigma=0.5, max_new_tokens=5)
    verifier = lambda text, row: float(len(text) % 3) / 2  # noqa: E731
    engine = make_population_evaluator(model, tokenizer, verifier, population.population_generate)
    reference = make_population_evaluator(model, tokenizer, verifier, reference_generate)
    got = engine(perturbed_population(theta, seeds, cfg.sigma), rows, cfg, generator=torch.Generator())
    want = reference(perturbed_population(theta, seeds, cfg.sigma), rows, cfg)
    np.testing.assert_allclose(got.fitness, want.fitness)
    assert got.generated_tokens == want.generated_tokens
    # sampled fitness repeats exactly from the same generator seed (what resume relies on)
    sampled = ESConfig(population_size=4, sigma=0.5, max_new_tokens=5, fitness_temperature=1.0, fitness_top_p=0.95)
    runs = [engine(perturbed_population(theta, seeds, cfg.sigma), rows, sampled,
                   generator=torch.Generator().manual_seed(9)) for _ in range(2)]
    np.testing.assert_array_equal(runs[0].fitness, runs[1].fitness)
    assert runs[0].generated_tokens == runs[1].generated_tokens


def test_default_evaluator_keeps_its_buffers_without_changing_fitness(tokenizer):
    """The default evaluator keeps the population engine's buffers from one iteration to the next: fresh
    members every iteration score exactly as on memory of each call's own."""
    from esgrpo.engines.population import population_generate

    model = tiny_llama(vocab=len(tokenizer), layers=2)
    rows = [{"id": str(i), "prompt": [{"role": "user", "content": q}], "answer": "x"}
            for i, q in enumerate(["1+2", "what is 33?", "7*8 =", "12+3 is what number?"])]
    theta = theta_from_model(model, trainable_names(model, ["*"]))
    cfg = ESConfig(population_size=4, sigma=0.5, max_new_tokens=5)
    verifier = lambda text, row: float(len(text) % 3) / 2  # noqa: E731
    kept = make_population_evaluator(model, tokenizer, verifier)
    for it, batch in enumerate([rows[:2], rows[1:], rows[2:]]):
        seeds = member_seeds(0, it, 4, antithetic=True)
        fresh = make_population_evaluator(model, tokenizer, verifier, population_generate)
        got = kept(perturbed_population(theta, seeds, cfg.sigma), batch, cfg)
        want = fresh(perturbed_population(theta, seeds, cfg.sigma), batch, cfg)
        np.testing.assert_array_equal(got.fitness, want.fitness)
        assert got.generated_tokens == want.generated_tokens and got.entropy == want.entropy
