"""The vLLM rollout engine's pure parts (esgrpo.engines.vllm_engine) on a CPU: the CPU build's KV cache, context
lengths, sampling settings, entropies from top-k logprobs, rollouts from vLLM's outputs, and generation through a
stand-in LLM."""

from __future__ import annotations

import math
import os
import sys
import types

import numpy as np
import pytest

from esgrpo.engines.vllm_engine import (
    SAMPLED_NLL,
    VLLMEngine,
    entropy_estimator,
    logprobs_to_request,
    lumped_bound_name,
    lumped_topk_entropy,
    request_seed,
    rollouts_from_outputs,
    sampling_kwargs,
    token_logprobs_and_entropies,
)

# --------------------------------------------------------------------------- the CPU build's KV cache


def test_cpu_kv_cache_is_set_on_vllms_cpu_build_only_and_never_over_the_users(monkeypatch):
    from esgrpo.engines import vllm_engine

    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    monkeypatch.setattr(vllm_engine, "on_vllm_cpu", lambda: False)
    vllm_engine.size_cpu_kv_cache()
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ  # a GPU: vLLM's gpu_memory_utilization applies
    monkeypatch.setattr(vllm_engine, "on_vllm_cpu", lambda: True)
    vllm_engine.size_cpu_kv_cache()
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == str(vllm_engine.CPU_KV_CACHE_GIB)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    vllm_engine.size_cpu_kv_cache()
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"


# --------------------------------------------------------------------------- context lengths


def test_context_length_is_prompt_plus_completion_and_checks_a_given_length():
    from esgrpo.engines.vllm_engine import context_length, engine_kwargs

    assert context_length([3, 10, 7], 8) == 18
    assert context_length([3, 10, 7], 8, max_prompt_tokens=12) == 20  # the config's prompt limit
    assert context_length([3, 10, 7], 8, max_model_len=40) == 40  # the plan's length, wide enough
    with pytest.raises(ValueError, match="longest prompt \\(10 tokens\\)"):
        context_length([3, 10, 7], 8, max_model_len=17)
    with pytest.raises(ValueError, match="max_prompt_tokens=9"):
        context_length([3, 10, 7], 8, max_prompt_tokens=9)
    engine = {"gpu_memory_utilization": 0.5, "max_prompt_tokens": 16}
    assert engine_kwargs(engine, [[1] * 5, [2] * 9], 8) == {"gpu_memory_utilization": 0.5, "max_model_len": 24}
    assert engine == {"gpu_memory_utilization": 0.5, "max_prompt_tokens": 16}  # the config block is not changed


# --------------------------------------------------------------------------- the rollout engine's pure parts


def test_sampling_kwargs():
    assert sampling_kwargs(32, 0.6, 1.0, 2048) == {"n": 32, "temperature": 0.6, "max_tokens": 2048,
                                                   "logprobs": 1, "top_p": 1.0}
    assert "top_p" not in sampling_kwargs(1, 0.0, 0.95, 16)
    for bad in [dict(n=2, temperature=0.0), dict(n=0, temperature=1.0), dict(n=1, temperature=1.0, top_p=0.0)]:
        args = {"top_p": 1.0, **bad}
        with pytest.raises(ValueError):
            sampling_kwargs(args["n"], args["temperature"], args["top_p"], 8)
    assert request_seed(1, 2) != request_seed(2, 1) and request_seed(0, 5) == 5
    # vLLM seeds sample j of a request with its seed + j: no two (prompt, sample) pairs of a call share a stream
    streams = [request_seed(3, i, 16) + j for i in range(50) for j in range(16)]
    assert len(set(streams)) == len(streams)


def test_lumped_topk_entropy_is_exact_with_all_mass_and_a_lower_bound_otherwise():
    p = np.array([0.5, 0.25, 0.125, 0.0625, 0.0625])
    exact = float(-(p * np.log(p)).sum())
    assert lumped_topk_entropy(np.log(p)) == pytest.approx(exact)
    top2 = lumped_topk_entropy(np.log(p[:2]))
    assert 0 < top2 < exact
    assert lumped_topk_entropy([0.0]) == 0.0


def _completion(index, ids, text, logprobs):
    return types.SimpleNamespace(index=index, token_ids=ids, text=text, logprobs=logprobs)


def test_rollouts_from_outputs_orders_samples_and_reads_logprobs():
    lp = types.SimpleNamespace
    first = [{5: lp(logprob=-0.1), 6: lp(logprob=-2.5)}, {9: lp(logprob=-0.7), 5: lp(logprob=-0.9)}]
    outputs = [types.SimpleNamespace(outputs=[_completion(1, [7], "b", None), _completion(0, [5, 9], "a", first)])]
    r = rollouts_from_outputs(outputs, n=2, estimator=lumped_bound_name(2), entropy_topk=2)
    assert r.texts == [["a", "b"]] and r.token_ids == [[[5, 9], [7]]]
    assert r.logprobs[0][0] == [-0.1, -0.7] and r.entropy_estimator == "top2_lumped_lower_bound"
    assert math.isnan(r.logprobs[0][1][0]) and math.isnan(r.entropies[0][1][0])  # missing: NaN, never 0
    assert r.entropies[0][0][0] == pytest.approx(lumped_topk_entropy([-0.1, -2.5]))
    # the second token was sampled outside the top-1: the bound keeps the top-k only
    assert r.entropies[0][0][1] == pytest.approx(lumped_topk_entropy([-0.7, -0.9]))
    nll = rollouts_from_outputs(outputs, n=2, estimator=SAMPLED_NLL)
    assert nll.entropies[0][0] == [0.1, 0.7] and nll.entropy_estimator == "sampled_nll"
    chosen, ent = token_logprobs_and_entropies([5], [{5: -0.2}], "none")
    assert chosen == [-0.2] and math.isnan(ent[0])
    with pytest.raises(ValueError, match="unknown entropy estimator"):
        token_logprobs_and_entropies([5], [{5: -0.2}], lumped_bound_name(20), entropy_topk=5)
    with pytest.raises(ValueError, match="expected 3"):
        rollouts_from_outputs(outputs, n=3, estimator=SAMPLED_NLL)


def test_entropy_estimator_is_the_sampled_nll_only_when_sampling_the_reported_distribution():
    assert entropy_estimator(1.0, 1.0, 20) == SAMPLED_NLL
    assert entropy_estimator(0.0, 1.0, 20) == entropy_estimator(0.6, 1.0, 20) == "top20_lumped_lower_bound"
    assert entropy_estimator(1.0, 0.95, 5) == "top5_lumped_lower_bound"  # nucleus: not the raw distribution
    assert entropy_estimator(0.0, 1.0, 0) == "none"
    assert sampling_kwargs(1, 1.0, 1.0, 8, logprobs=logprobs_to_request(SAMPLED_NLL, 20))["logprobs"] == 0
    assert logprobs_to_request(lumped_bound_name(20), 20) == 20


def test_vllm_engine_generate_with_a_stand_in_llm(monkeypatch):
    """Chat template -> token ids (no second BOS), one request per prompt with n samples and its own seed."""
    from esgrpo.evaluation.evaluate import EvalSettings, evaluate_rows

    class SamplingParams(dict):
        def __init__(self, **kw):
            super().__init__(**kw)

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=SamplingParams))

    class Tokenizer:
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
            return "<s>" + messages[-1]["content"]

        def __call__(self, text, add_special_tokens=True):
            assert add_special_tokens is False
            return {"input_ids": [ord(c) % 50 for c in text]}

    class LLM:
        def __init__(self):
            self.calls = []

        def get_tokenizer(self):
            return Tokenizer()

        def generate(self, prompts, params, use_tqdm=False):
            self.calls.append((prompts, params))
            out = []
            for _prompt, sp in zip(prompts, params, strict=True):
                comps = [_completion(j, [1, 2], "\\boxed{4}" if j % 2 == 0 else "\\boxed{5}",
                                     [{1: -0.5, 3: -1.0}, {2: -0.1}]) for j in range(sp["n"])]
                out.append(types.SimpleNamespace(outputs=comps))
            return out

    llm = LLM()
    engine = VLLMEngine("unused", llm=llm, entropy_topk=2)
    rows = [{"id": "a", "prompt": [{"role": "user", "content": "2+2?"}], "answer": "4", "meta": {}},
            {"id": "b", "prompt": [{"role": "user", "content": "2+3?"}], "answer": "5", "meta": {}}]
    summary, per_prompt = evaluate_rows(engine, rows, "math", EvalSettings(n_samples=4, ks=[1, 2, 4],
                                                                             temperature=0.6, max_new_tokens=8))
    sampled_prompts, sampled_params = llm.calls[0]
    assert sampled_prompts[0]["prompt_token_ids"][0] == ord("<") % 50
    assert [p["seed"] for p in sampled_params] == [request_seed(0, 0, 4), request_seed(0, 1, 4)] == [0, 4]
    assert all(p["n"] == 4 and p["logprobs"] == 2 for p in sampled_params)
    assert llm.calls[1][1][0]["temperature"] == 0.0 and llm.calls[1][1][0]["seed"] is None  # greedy pass
    assert summary["pass@1"] == pytest.approx(0.5) and summary["pass@4"] == pytest.approx(1.0)
    # temperature 0.6: the lumped top-2 bound, per token of [1, 2]: {-0.5, -1.0} and {-0.1}
    bound = (lumped_topk_entropy([-0.5, -1.0]) + lumped_topk_entropy([-0.1])) / 2
    assert summary["entropy"] == pytest.approx(bound) and summary["entropy_estimator"] == "top2_lumped_lower_bound"
    assert per_prompt[0]["correct"] == 2 and per_prompt[0]["entropy_estimator"] == "top2_lumped_lower_bound"
    # temperature 1: the sampled tokens' mean negative log-prob, asking vLLM for the sampled token only
    summary, _ = evaluate_rows(engine, rows, "math", EvalSettings(n_samples=2, ks=[1], temperature=1.0,
                                                                  max_new_tokens=8, greedy=False))
    assert all(p["logprobs"] == 0 for p in llm.calls[-1][1])
    assert summary["entropy"] == pytest.approx((0.5 + 0.1) / 2) and summary["entropy_estimator"] == "sampled_nll"
