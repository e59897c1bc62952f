"""Tiny random Llamas, synthetic fitness and the transformers-backend trainer run, shared by the ES tests.

The synthetic evaluators compute fitness from the member weights they are handed (a real
objective, not a stand-in for ES logic), so the tests see exactly what ES does to theta."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from esgrpo.es.backend import FitnessResult
from esgrpo.es.hf_backend import HFESBackend
from esgrpo.es.loop import train_es


def tiny_llama(hidden: int = 16, layers: int = 1, vocab: int = 32, seed: int = 0, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=tie,
                         bos_token_id=None, eos_token_id=1, pad_token_id=0)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def members_of(population):
    """[(name -> member tensor)] for a stacked dict or a sequential iterator alike."""
    if isinstance(population, Mapping):  # stacked: a dict or the lazy esgrpo.noise.Population
        n = next(iter(population.values())).shape[0]
        return [{k: v[i] for k, v in population.items()} for i in range(n)]
    return list(population)


def quadratic_evaluator(target: dict[str, torch.Tensor], seen: list | None = None):
    """fitness_n = -||theta_n - target||^2 over the tensors handed in.

    Summed with math.fsum (exactly rounded): torch's SIMD sums can differ in the last bit
    between processes (memory alignment), and the kill test compares runs bit for bit.
    """

    def evaluate(population, prompt_rows, cfg, generator=None):
        fitness = np.array([-math.fsum(x for k in m for x in (m[k].double() - target[k].double()).pow(2).ravel().tolist())
                            for m in members_of(population)])
        if seen is not None:
            seen.append(fitness.copy())
        return FitnessResult(fitness=fitness, generated_tokens=3 * len(fitness) * len(prompt_rows))

    return evaluate


def random_evaluator(population, prompt_rows, cfg, generator=None):
    """Fitness that carries no signal: seeded random values drawn from the iteration's generator."""
    n = len(members_of(population))
    return FitnessResult(fitness=torch.rand(n, generator=generator, dtype=torch.float64).numpy())


ROWS = [{"id": str(i), "prompt": f"q{i}", "answer": str(i % 3)} for i in range(10)]


def saved_weights(out_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out_dir / "model" / "model.safetensors"))


def run_es(model, tokenizer, rows, cfg, evaluate, out_dir, progress_dir, log=print, population="stacked"):
    """`train_es` over the transformers backend holding `model`; its summary record (`RunSummary.to_dict`)."""
    backend = HFESBackend(model, tokenizer, evaluate, population=population)
    return train_es(backend, rows, cfg, out_dir, progress_dir, log=log).to_dict()
