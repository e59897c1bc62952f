"""Population-batched generation: N perturbed copies of one causal LM, one forward per step.

Evolution Strategies evaluates N members ``theta + sigma * eps_n`` on the same prompt batch.
Calling ``model.generate`` once per member (`sequential_generate`, the structure of the public
ES implementations and our reference) pays transformers' per-step Python overhead N times;
for models of a few million parameters or fewer that overhead, not arithmetic, is the cost.
`population_generate` instead runs all members in one pure-torch forward per decoding step:
every projection is one `population_weights.Linear` over all members (a batched matmul over a
member axis for small matrices, one packed matmul per member for large ones on a CPU; for
low-rank members one matmul shared by all N * B rows plus each member's low-rank term), and the
rows of member n are its copy of the B prompts (N * B sequences in all). The member weights are
laid out once per population by `esgrpo.engines.population_weights.prepare_population`, from
stacked tensors or straight from theta and the seeds (`esgrpo.noise.Population`), into memory a caller
may keep from call to call (`MemberBuffers`: an ES run's members have the same shapes every iteration, and
memory of a call's own is faulted in again every call; docs/smollm2.md measures it); this module is the forward and the decoding.

Supported: transformers' ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` (q/k/v biases), fp32
compute, RMSNorm, rotary embeddings (static rope types), grouped-query attention, SiLU gated
MLP, tied or untied ``lm_head``. Prompts are LEFT-padded (``attention_mask`` 0 on the left);
positions are ``cumsum(mask) - 1`` exactly as ``generate`` computes them, so greedy decoding
gives the tokens ``generate`` gives, member by member (up to float rounding in near-ties).

What the forward does differently from transformers, all exact rewrites of the same maths
(only float rounding differs), each to save ops per step for tiny models:
- the RMSNorm weights are folded into the projection that follows the norm
  (``(g * xhat) @ W.T == xhat @ (g[:, None] * W.T)``), the 1/sqrt(head_dim) attention scale
  into the query projection, and q/k/v (and gate/up) into one fused matrix per member;
- the rotary rotation is one complex multiply: within every query and key head the output
  features are permuted from transformers' (first half, second half) pairing to interleaved
  pairs, which leaves every q.k dot product unchanged (the same permutation on both sides);
- keys and values are written into preallocated caches, values ``[N, B, kv_heads, slots,
  head_dim]`` and keys transposed ``[N, B, kv_heads, head_dim, slots]`` (the score matmul is
  then a plain NN gemm on a contiguous prefix); nothing is concatenated per step;
- the residual adds ride on ``baddbmm``; the prompt pass runs the last layer for the last
  position only (the others only need its keys and values);
- padded keys get a large FINITE negative score, so a row with no valid key (a pad query)
  gets a uniform softmax instead of NaN; such rows never feed a real token.

Where the time goes: on models of a few million parameters a decode step is split between attention's
many tiny per-(row, kv head) matmuls and the projections; at SmolLM2-135M's shape a full-rank member's
decode streams its own weights through matmuls of only B rows, so the step is as fast as those matmuls
read memory: hence the packed layouts (`esgrpo.engines.population_weights`) and the panel kernel
(`esgrpo.engines.panel_matmul`). The profiles, speeds and the variants measured and dropped are in
docs/references.md ("Measurements behind code choices"), the rollout tables in docs/smollm2.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from esgrpo.engines import groups
from esgrpo.engines.population_weights import (
    Arch,
    Layer,
    MemberBuffers,
    PopulationWeights,
    arch_of,
    check_window,
    member_bytes,
    prepare_population,
    stack_members,
)
from esgrpo.engines.rollout import id_list, lengths_through_eos
from esgrpo.noise import Population

__all__ = [
    "MemberBuffers",
    "PopulationOutput",
    "member_groups",
    "PopulationWeights",
    "population_generate",
    "prepare_population",
    "sequential_generate",
    "stack_members",
]

# Added to the attention scores of padded key slots. Finite on purpose: a fully masked row then
# softmaxes to uniform weights instead of NaN (finfo.min is what transformers uses too).
_MASK_VALUE = torch.finfo(torch.float32).min
# Bound on the prefill attention-score buffer (bytes); members are chunked above it.
_PREFILL_SCORE_BYTES = 256 * 2**20
# Target size of the widest prefill activation of one member chunk (see `_prefill`).
_PREFILL_ACTIVATION_BYTES = 4 * 2**20


@dataclass
class PopulationOutput:
    """Generated continuations of every member for every prompt.

    tokens: LongTensor [N, B, L], L = max_new_tokens; EOS included, pad after it (and pad in
        the unused tail when a sequence ends early).
    lengths: LongTensor [N, B], generated tokens counting the EOS.
    logprobs: [N, B, L] log-probability of each emitted token under the RAW model distribution
        (softmax of the untempered, unfiltered logits), 0 after the end.
    entropies: [N, B, L] entropy (nats) of that raw next-token distribution, 0 after the end.
    """

    tokens: Tensor
    lengths: Tensor
    logprobs: Tensor
    entropies: Tensor


# --------------------------------------------------------------------------- forward pieces


def _rms(x: Tensor, eps: float) -> Tensor:
    """RMSNorm without its weight (folded into the next matmul); transformers' formula."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True).add_(eps))


def _normed(x: Tensor, g: Tensor | None, eps: float) -> Tensor:
    """RMSNorm; its weight `g` [N, 1, H] applied here only when not folded into the next matmul (low rank)."""
    h = _rms(x, eps)
    return h if g is None else h.mul_(g)


def _mlp_(x: Tensor, layer: Layer, eps: float, inter: int) -> Tensor:
    gu = layer.gu(_normed(x, layer.norm2, eps))
    act = F.silu(gu[..., :inter]).mul_(gu[..., inter:])
    return layer.down.add_(x, act)


def _attention_prefill(q: Tensor, kc: Tensor, vc: Tensor, add_mask: Tensor, t: int, tq: int,
                       groups: int) -> Tensor:
    """Attention of `tq` queries per row over the first `t` cache slots; q [N, B, tq, heads, hd].

    Returns [N, B * tq, heads * hd]. Chunked over members to bound the score buffer.
    """
    n, b, _, heads, hd = q.shape
    nkv = heads // groups
    per_member = b * heads * tq * t * 4
    step = max(1, _PREFILL_SCORE_BYTES // max(per_member, 1))
    out = []
    for s in range(0, n, step):
        e = min(n, s + step)
        m = e - s
        qs = q[s:e].unflatten(3, (nkv, groups)).permute(0, 1, 3, 4, 2, 5).reshape(m * b * nkv, groups * tq, hd)
        keys_t = kc[s:e, :, :, :, :t].reshape(m * b * nkv, hd, t)
        vals = vc[s:e, :, :, :t].reshape(m * b * nkv, t, hd)
        scores = torch.bmm(qs, keys_t)
        scores.view(m, b, nkv, groups, tq, t).add_(add_mask)  # add_mask [B, 1, 1, tq, t]
        o = torch.bmm(scores.softmax(-1), vals)  # [m*b*nkv, groups*tq, hd]
        out.append(o.view(m, b, nkv, groups, tq, hd).permute(0, 1, 4, 2, 3, 5).reshape(m, b * tq, heads * hd))
    return out[0] if len(out) == 1 else torch.cat(out, 0)


def _prefill(pw: PopulationWeights, input_ids: Tensor, rot: Tensor, add_mask: Tensor,
             kcache: Tensor, vcache: Tensor) -> Tensor:
    """Run the prompts [B, T] through every member; fill cache slots [0, T); return last hidden [N, B, H].

    Members go through in chunks whose largest activation stays within a few MB: the prompt
    activations of all members at once are tens of MB, and the elementwise ops between the
    matmuls (norms, SiLU) run several times faster on data that is still in cache.
    """
    arch = pw.arch
    n, (b, t) = pw.n_members, input_ids.shape
    widest = max(arch.hidden, (arch.heads + 2 * arch.kv_heads) * arch.head_dim, 2 * arch.intermediate)
    chunk = max(1, _PREFILL_ACTIVATION_BYTES // (b * t * widest * 4))
    out = []
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        out.append(_prefill_members(pw, s, e, input_ids, rot, add_mask, kcache[:, s:e], vcache[:, s:e]))
    return out[0] if len(out) == 1 else torch.cat(out, 0)


def _prefill_members(pw: PopulationWeights, s: int, e: int, input_ids: Tensor, rot: Tensor, add_mask: Tensor,
                     kcache: Tensor, vcache: Tensor) -> Tensor:
    """`_prefill` for members [s, e); kcache/vcache are already sliced to those members."""
    arch = pw.arch
    n, (b, t) = e - s, input_ids.shape
    nq, nkv, hd = arch.heads, arch.kv_heads, arch.head_dim
    nqk = nq + nkv
    x = pw.embed.members(s, e)(input_ids.reshape(1, b * t).expand(n, b * t))  # [n, B*T, H]
    for i, layer in enumerate(pw.layers):
        layer = layer.members(s, e)
        last = i == arch.layers - 1
        qkv = layer.qkv(_normed(x, layer.norm1, arch.eps)).view(n, b, t, -1)
        qk = torch.view_as_complex(qkv[..., :nqk * hd].unflatten(-1, (nqk, hd // 2, 2)))
        qk = torch.view_as_real(qk * rot).flatten(-2)  # [n, B, T, nqk, hd]
        kcache[i, :, :, :, :, :t] = qk[..., nq:, :].permute(0, 1, 3, 4, 2)
        vcache[i, :, :, :, :t] = qkv[..., nqk * hd:].unflatten(-1, (nkv, hd)).transpose(2, 3)
        if last:
            # Only the last position's output is needed from the last layer: keys/values of every
            # position are cached above; attention, output projection and MLP run for one query.
            q = qk[:, :, -1:, :nq]
            o = _attention_prefill(q, kcache[i], vcache[i], add_mask[..., -1:, :], t, 1, nq // nkv)
            x = x.view(n, b, t, -1)[:, :, -1].contiguous()
        else:
            o = _attention_prefill(qk[..., :nq, :], kcache[i], vcache[i], add_mask, t, t, nq // nkv)
        layer.o.add_(x, o)
        _mlp_(x, layer, arch.eps, arch.intermediate)
    return x  # [n, B, H]


def _decode(pw: PopulationWeights, x: Tensor, rot: Tensor, slot: int, dmask: Tensor,
            kcache: Tensor, vcache: Tensor) -> Tensor:
    """One new token per row: x [N, B, H] at cache slot `slot`; returns hidden [N, B, H]."""
    arch = pw.arch
    n, b, _ = x.shape
    nq, nkv, hd = arch.heads, arch.kv_heads, arch.head_dim
    nqk, groups = nq + nkv, nq // nkv
    cur = slot + 1
    for i, layer in enumerate(pw.layers):
        qkv = layer.qkv(_normed(x, layer.norm1, arch.eps))  # [N, B, C]
        qk = torch.view_as_complex(qkv[..., :nqk * hd].unflatten(-1, (nqk, hd // 2, 2)))
        qk = torch.view_as_real(qk * rot).flatten(-2)  # [N, B, nqk, hd]
        kc, vc = kcache[i], vcache[i]  # [N, B, nkv, hd, S] and [N, B, nkv, S, hd]
        kc[..., slot] = qk[:, :, nq:]
        vc[:, :, :, slot] = qkv[..., nqk * hd:].unflatten(-1, (nkv, hd))
        q = qk[:, :, :nq].reshape(n * b * nkv, groups, hd)
        keys_t = kc[..., :cur].reshape(n * b * nkv, hd, cur)
        vals = vc[:, :, :, :cur].reshape(n * b * nkv, cur, hd)
        # dmask [N*B*nkv, 1, S]: the padding mask broadcast over the query heads of a group.
        scores = torch.baddbmm(dmask[:, :, :cur], q, keys_t)
        o = torch.bmm(scores.softmax(-1), vals).view(n, b, nq * hd)
        layer.o.add_(x, o)
        _mlp_(x, layer, arch.eps, arch.intermediate)
    return x


def _logits(pw: PopulationWeights, x: Tensor) -> Tensor:
    return pw.head(_normed(x, pw.norm, pw.arch.eps))  # [N, B, V]


def categorical(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """One draw per row of `probs` [R, V] (unnormalised, >= 0) -> [R, 1], by inverting the CDF at a
    uniform: token i is drawn when u * total falls in [cdf[i-1], cdf[i]), so a zero-probability token
    never is. torch.multinomial draws the same distribution but is slow on a CPU (docs/references.md);
    a cumsum and a binary search are not."""
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=probs.dtype, device=probs.device)
    cdf = probs.cumsum(-1)
    return torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_(max=probs.shape[-1] - 1)


def _sample(logits: Tensor, temperature: float, top_p: float, generator: torch.Generator | None) -> Tensor:
    """Temperature + nucleus sampling; logits [N, B, V] -> tokens [N, B]."""
    probs = torch.softmax(logits / temperature, dim=-1).flatten(0, 1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        # Drop a token once the mass ranked above it reaches top_p (the top token always stays),
        # the rule of transformers' TopPLogitsWarper.
        sorted_p.masked_fill_(sorted_p.cumsum(-1).sub_(sorted_p) >= top_p, 0.0)
        tokens = order.gather(-1, categorical(sorted_p, generator))
    else:
        tokens = categorical(probs, generator)
    return tokens.view(logits.shape[:-1])


def _rotations(arch: Arch, mask: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Rotary rotations as complex numbers, once per call: prompts at cumsum(mask) - 1, the j-th new
    token at (number of real prompt tokens) + j, as transformers' generate numbers them.
    Returns the prompt's [B, T, 1, hd/2] and the new tokens' [steps, B, 1, hd/2]."""
    device = mask.device
    inv_freq = arch.inv_freq.to(device)
    real = mask.sum(-1)
    prompt_pos = (mask.cumsum(-1) - 1).clamp_min(0)
    new_pos = real[:, None] + torch.arange(steps, device=device)[None, :]

    def rotation(pos: Tensor) -> Tensor:
        angle = pos.to(torch.float32)[..., None] * inv_freq
        return torch.complex(angle.cos() * arch.rope_scale, angle.sin() * arch.rope_scale).unsqueeze(-2)

    return rotation(prompt_pos), rotation(new_pos).transpose(0, 1).contiguous()


def _masks(mask: Tensor, n: int, nkv: int, slots: int) -> tuple[Tensor, Tensor]:
    """Additive masks: prefill [B, 1, 1, T, T] (causal and padding), decode [N*B*nkv, 1, slots]."""
    device = mask.device
    b, t = mask.shape
    key_ok = mask.bool()
    causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    zero = torch.zeros((), device=device)
    neg = torch.full((), _MASK_VALUE, device=device)
    prefill_mask = torch.where(causal[None] & key_ok[:, None, :], zero, neg)[:, None, None]
    slot_ok = torch.cat([key_ok, torch.ones(b, slots - t, dtype=torch.bool, device=device)], dim=1)
    decode_mask = torch.where(slot_ok, zero, neg)[None, :, None, None, :].expand(n, b, nkv, 1, slots)
    return prefill_mask, decode_mask.reshape(n * b * nkv, 1, slots)


# --------------------------------------------------------------------------- generation


@torch.inference_mode()
def population_generate(model: torch.nn.Module, stacked: Mapping[str, Tensor] | PopulationWeights | None,
                        input_ids: Tensor, attention_mask: Tensor | None, max_new_tokens: int,
                        eos_token_id: int | Sequence[int] | None, pad_token_id: int,
                        temperature: float = 0.0, top_p: float = 1.0,
                        generator: torch.Generator | None = None,
                        member_rows: Tensor | None = None, buffers: MemberBuffers | None = None) -> PopulationOutput:
    """Generate from N members at once; all members see the same B left-padded prompts.

    stacked: ``{name: [N, *param.shape]}`` for the parameters of ``model.named_parameters()``
    (a missing name uses the model's own tensor for every member), an `esgrpo.noise.Population`
    (members built here, full-rank or low-rank), a `PopulationWeights` from `prepare_population`,
    or None for the model's own weights (N = 1).
    input_ids, attention_mask: [B, T], left-padded. eos_token_id: one id, several, or None (never
    stop). Finished sequences emit `pad_token_id`.
    temperature 0: greedy (argmax of the raw logits, first index on ties, as `generate`); else
    temperature + top-p sampling drawn from `generator`.
    member_rows: optional indices of the members to run (see `prepare_population`); ignored when
    `stacked` is already a `PopulationWeights`.
    buffers: memory the caller keeps from call to call (`MemberBuffers`; an ES run makes fresh members of
    the same shapes every iteration: then nothing is allocated after the first call); None: this call's own.

    Full-rank members whose weights exceed `groups.GROUP_BYTES` together run in groups of members, one
    group's weights at a time (`member_groups`): decoding is memory-bound per member anyway at such
    sizes, so grouping costs little time and bounds the memory.
    """
    args = (input_ids, attention_mask, max_new_tokens, eos_token_id, pad_token_id, temperature, top_p, generator)
    if isinstance(stacked, PopulationWeights):
        return _generate(model, stacked, *args)
    groups = member_groups(model, stacked, member_rows)
    outs = [_generate(model, prepare_population(model, stacked, rows, rows=input_ids.shape[0], buffers=buffers), *args)
            for rows in groups]
    if len(outs) == 1:
        return outs[0]
    return PopulationOutput(*(torch.cat([getattr(o, f) for o in outs]) for f in
                              ("tokens", "lengths", "logprobs", "entropies")))


def member_groups(model: torch.nn.Module, stacked: Mapping[str, Tensor] | None,
                  member_rows: Tensor | None) -> list[Tensor | None]:
    """The member rows of each group `population_generate` prepares and runs at once: one group (None:
    every member) unless full-rank members' weights (`member_bytes`) exceed `groups.GROUP_BYTES` together
    (`esgrpo.engines.groups.member_group_size`). Low-rank members share their matrices: one group."""
    if isinstance(stacked, Population):
        total = stacked.n_members
    else:
        total = int(next(iter(stacked.values())).shape[0]) if stacked else 1
    rows = torch.arange(total) if member_rows is None else torch.as_tensor(member_rows, dtype=torch.long).reshape(-1)
    if isinstance(stacked, Population) and stacked.noise.kind == "lowrank":
        return [member_rows]
    size = groups.member_group_size(len(rows), member_bytes(arch_of(model)))
    return [member_rows] if size >= len(rows) else [rows[s:s + size] for s in range(0, len(rows), size)]


def _generate(model: torch.nn.Module, pw: PopulationWeights, input_ids: Tensor, attention_mask: Tensor | None,
              max_new_tokens: int, eos_token_id: int | Sequence[int] | None, pad_token_id: int,
              temperature: float, top_p: float, generator: torch.Generator | None) -> PopulationOutput:
    """`population_generate` over prepared weights."""
    arch = pw.arch
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [B, T], got {tuple(input_ids.shape)}")
    if pad_token_id is None:
        raise ValueError("pad_token_id is required (finished rows emit it)")
    device = pw.embed.table.device
    input_ids = input_ids.to(device)
    b, t = input_ids.shape
    n, steps = pw.n_members, int(max_new_tokens)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device).long()
    if steps <= 0:
        empty = torch.zeros(n, b, 0, device=device)
        return PopulationOutput(empty.long(), torch.zeros(n, b, dtype=torch.long, device=device), empty, empty)
    check_window(model, t + steps)
    pw.check()
    nkv, hd = arch.kv_heads, arch.head_dim
    slots = t + steps - 1  # the last generated token is never fed back

    rot_prompt, rot_new = _rotations(arch, mask, steps)
    prefill_mask, decode_mask = _masks(mask, n, nkv, slots)

    # Keys are cached transposed, [.., head_dim, slot]: the score matmul q @ K^T is then a plain
    # NN gemm over a contiguous prefix of every (row, kv head) block, measurably faster for tiny heads.
    # Kept with the member weights' buffers: an ES run's next call needs one of about the same size.
    kept = pw.buffers if pw.buffers is not None else MemberBuffers()
    kcache = kept.grow("keys", (arch.layers, n, b, nkv, hd, slots), device)
    vcache = kept.grow("values", (arch.layers, n, b, nkv, slots, hd), device)

    eos = torch.tensor(id_list(eos_token_id), dtype=torch.long, device=device)
    tokens = torch.full((steps, n, b), pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(steps, n, b, device=device)
    entropies = torch.zeros(steps, n, b, device=device)
    lengths = torch.zeros(n, b, dtype=torch.long, device=device)
    finished = torch.zeros(n, b, dtype=torch.bool, device=device)
    greedy = temperature <= 0.0

    x = _prefill(pw, input_ids, rot_prompt, prefill_mask, kcache, vcache)
    for j in range(steps):
        logits = _logits(pw, x)  # [N, B, V]
        tok = logits.argmax(-1) if greedy else _sample(logits, temperature, top_p, generator)
        logp = torch.log_softmax(logits, dim=-1)
        logprobs[j] = logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
        entropies[j] = -(logp.exp() * logp).sum(-1)
        tok.masked_fill_(finished, pad_token_id)
        tokens[j] = tok
        lengths += ~finished
        if eos.numel():
            finished |= torch.isin(tok, eos)
            if j + 1 < steps and bool(finished.all()):
                break
        if j + 1 < steps:
            x = _decode(pw, pw.embed(tok), rot_new[j], t + j, decode_mask, kcache, vcache)

    valid = torch.arange(steps, device=device)[:, None, None] < lengths[None]
    return PopulationOutput(tokens=tokens.permute(1, 2, 0).contiguous(), lengths=lengths,
                            logprobs=(logprobs * valid).permute(1, 2, 0).contiguous(),
                            entropies=(entropies * valid).permute(1, 2, 0).contiguous())


@torch.no_grad()
def sequential_generate(model: torch.nn.Module, stacked: Mapping[str, Tensor] | None,
                        input_ids: Tensor, attention_mask: Tensor | None, max_new_tokens: int,
                        eos_token_id: int | Sequence[int] | None, pad_token_id: int,
                        temperature: float = 0.0, top_p: float = 1.0,
                        generator: torch.Generator | None = None,
                        member_rows: Tensor | None = None) -> PopulationOutput:
    """The baseline: load each member's weights into `model` and call ``model.generate`` once per member.

    Same arguments and output as `population_generate` (the structure of public ES code, and the
    reference the tests hold the batched engine to); a `Population` is built one member at a time. The model's own weights are restored from a
    clean copy afterwards. Sampling uses transformers' sampler seeded from `generator`, so it is
    reproducible but does not draw the same tokens as `population_generate`.
    """
    params = dict(model.named_parameters())
    lazy = stacked if isinstance(stacked, Population) else None  # members built one at a time
    stacked = stacked if lazy is not None else dict(stacked or {})
    unknown = set(stacked) - set(params)
    if unknown:
        raise KeyError(f"not parameters of the model: {sorted(unknown)[:5]}")
    n_total = lazy.n_members if lazy is not None else int(next(iter(stacked.values())).shape[0]) if stacked else 1
    rows = list(range(n_total)) if member_rows is None else [int(r) for r in torch.as_tensor(member_rows).reshape(-1)]
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask.to(device)
    b, t = input_ids.shape
    steps = int(max_new_tokens)
    eos = id_list(eos_token_id)
    sampled = temperature > 0.0
    kwargs = dict(max_new_tokens=steps, do_sample=sampled, num_beams=1, eos_token_id=eos,
                  pad_token_id=pad_token_id, repetition_penalty=1.0, no_repeat_ngram_size=0,
                  output_logits=True, return_dict_in_generate=True, use_cache=True)
    if sampled:
        kwargs.update(temperature=float(temperature), top_p=float(top_p), top_k=0)
    seed = None
    if sampled:
        seed = int(torch.randint(0, 2**62, (1,), generator=generator)) if generator is not None else None
    backup = {name: params[name].detach().clone() for name in stacked}
    outs = []
    try:
        with torch.random.fork_rng(devices=[]):
            if seed is not None:
                torch.manual_seed(seed)
            for r in rows:
                for name in stacked:
                    if lazy is not None:
                        params[name].copy_(lazy.member(r, name))
                        lazy.forget()  # never a whole member's noise in memory
                    else:
                        params[name].copy_(stacked[name][r])
                out = model.generate(input_ids=input_ids, attention_mask=mask, **kwargs)
                outs.append((out.sequences[:, t:], torch.stack(out.logits, dim=1).float()))
    finally:
        for name, value in backup.items():
            params[name].copy_(value)
        if lazy is not None:
            lazy.forget()
    n = len(rows)
    tokens = torch.full((n, b, steps), pad_token_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(n, b, steps, device=device)
    entropies = torch.zeros(n, b, steps, device=device)
    for i, (seq, logits) in enumerate(outs):
        done = seq.shape[1]
        tokens[i, :, :done] = seq
        logp = torch.log_softmax(logits, dim=-1)
        logprobs[i, :, :done] = logp.gather(-1, seq.unsqueeze(-1)).squeeze(-1)
        entropies[i, :, :done] = -(logp.exp() * logp).sum(-1)
    lengths = lengths_through_eos(tokens, eos)
    valid = torch.arange(steps, device=device) < lengths[..., None]
    return PopulationOutput(tokens=tokens, lengths=lengths, logprobs=logprobs * valid, entropies=entropies * valid)
