"""Rollout engines: one small interface, `generate(rows, n, temperature, top_p, max_new_tokens, seed)`.

`HFEngine` runs transformers `generate` (CPU or GPU) with prompts x samples batched
together; the vLLM engine (GPU) lives in `esgrpo.engines.vllm_engine` and returns the same
`Rollouts`. Every completion carries its per-token log-probs and entropies under the
model's raw (untempered) next-token distribution; `Rollouts.entropy_estimator` names what the
entropies are (`ENTROPY_EXACT` here; vLLM gives an estimate or a bound, `esgrpo.engines.vllm_engine`).

Also the token facts every generator here shares (the ES population engine too): which ids end
a turn (`eos_token_ids`) and how long a completion is through its first one (`lengths_through_eos`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

ENTROPY_EXACT = "exact"  # the full next-token distribution's entropy, per generated token


def prompt_text(tokenizer: Any, row: dict) -> str:
    """The text a row prompts with: a conversation (a list of messages) through the tokenizer's chat
    template, ending with the assistant's turn marker; a plain string as it is. That is TRL's rule
    (`trl.data_utils.maybe_apply_chat_template`: a "standard" prompt is not templated), so ES, GRPO
    and every evaluation prompt a model with the same text."""
    prompt = row["prompt"]
    if isinstance(prompt, str):
        return prompt
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)


def prompt_texts(tokenizer: Any, rows: Sequence[dict]) -> list[str]:
    """`prompt_text` of each row."""
    return [prompt_text(tokenizer, row) for row in rows]


@dataclass
class Rollouts:
    """Completions of each prompt: `texts[i][j]` is sample j of prompt i.

    entropy_estimator: what `entropies` hold, carried into evaluation summaries and metrics rows
    so that exact values and estimates are never averaged or compared unlabelled.
    """

    texts: list[list[str]]
    token_ids: list[list[list[int]]]
    logprobs: list[list[list[float]]] = field(repr=False)
    entropies: list[list[list[float]]] = field(repr=False)
    entropy_estimator: str = ENTROPY_EXACT

    @property
    def num_tokens(self) -> int:
        return sum(len(ids) for per_prompt in self.token_ids for ids in per_prompt)

    def mean_entropy(self) -> float:
        """Token-weighted mean entropy over every generated token."""
        values = [e for per_prompt in self.entropies for seq in per_prompt for e in seq]
        return float(sum(values) / len(values)) if values else 0.0


class HFEngine:
    """transformers generation with prompts x samples packed into batches of `batch_size` sequences."""

    def __init__(self, model, tokenizer, batch_size: int = 256):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size

    @torch.inference_mode()
    def generate(self, rows: list[dict], n: int = 1, temperature: float = 0.0, top_p: float = 1.0,
                 max_new_tokens: int = 32, seed: int = 0) -> Rollouts:
        prompts = prompt_texts(self.tokenizer, rows)
        expanded = [p for p in prompts for _ in range(n)]
        eos_ids = eos_token_ids(self.model, self.tokenizer)
        flat_ids: list[list[int]] = []
        flat_lp: list[list[float]] = []
        flat_ent: list[list[float]] = []
        for start in range(0, len(expanded), self.batch_size):
            chunk = expanded[start:start + self.batch_size]
            enc = self.tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False)
            enc = {k: v.to(self.model.device) for k, v in enc.items()}
            # One seed per chunk: the same rows, n and seed give the same samples on rerun.
            new, lengths, chosen, entropy = self._chunk(enc, eos_ids, temperature, top_p, max_new_tokens,
                                                        seed * 1_000_003 + start)
            for b, length in enumerate(lengths.tolist()):
                flat_ids.append(new[b, :length].tolist())
                flat_lp.append(chosen[b, :length].tolist())
                flat_ent.append(entropy[b, :length].tolist())
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in flat_ids]
        return Rollouts(*(_unflatten(x, n) for x in (texts, flat_ids, flat_lp, flat_ent)))

    def _chunk(self, enc: dict, eos_ids: list[int], temperature: float, top_p: float, max_new_tokens: int,
               seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Generated tokens [B, L], lengths through EOS [B], their raw log-probs and the raw entropy [B, L]."""
        sampled = temperature > 0
        torch.manual_seed(seed)
        out = self.model.generate(
            **enc, do_sample=sampled, temperature=temperature if sampled else None,
            top_p=top_p if sampled else None, top_k=0 if sampled else None,
            max_new_tokens=max_new_tokens, eos_token_id=eos_ids,
            pad_token_id=self.tokenizer.pad_token_id, output_logits=True,
            return_dict_in_generate=True)
        new = out.sequences[:, enc["input_ids"].shape[1]:]
        logits = torch.stack(out.logits, dim=1).float()  # [B, L, V], raw (untempered)
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logp.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp.exp() * logp).sum(-1)
        return new, lengths_through_eos(new, eos_ids), chosen, entropy


def id_list(ids: int | Sequence[int] | None) -> list[int]:
    """One token id, several, or None (generation configs hold any of the three) as a list."""
    if ids is None:
        return []
    if isinstance(ids, int):
        return [ids]
    return [int(i) for i in ids]


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a turn: chat models list several in their generation config, and the tokenizer's own."""
    ids = id_list(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("neither the model's generation config nor the tokenizer names an EOS token")
    return ids


def lengths_through_eos(tokens: torch.Tensor, eos: Sequence[int]) -> torch.Tensor:
    """Generated length counting the first EOS (or L when none) per row of [..., L]; what follows the
    EOS (padding) is not part of the completion."""
    steps = tokens.shape[-1]
    if not eos:
        return torch.full(tokens.shape[:-1], steps, dtype=torch.long, device=tokens.device)
    hit = torch.isin(tokens, torch.tensor(list(eos), device=tokens.device))
    first = torch.where(hit.any(-1), hit.float().argmax(-1), torch.full_like(hit[..., 0], steps, dtype=torch.long))
    return torch.clamp(first + hit.any(-1).long(), max=steps)


def _unflatten(flat: list, n: int) -> list[list]:
    return [flat[i:i + n] for i in range(0, len(flat), n)]
