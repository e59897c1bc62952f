"""Member weights laid out for the population engine (`esgrpo.engines.population`): N perturbed copies of one
small causal LM, every projection stacked with a leading member axis.

`prepare_population` folds what can be folded once per population instead of once per step (the
RMSNorm weights into the projection after the norm, the 1/sqrt(head_dim) attention scale into the
query projection, q/k/v and gate/up into one matrix each, the rotary pairing permuted to
interleaved pairs) and lays every matrix out [N, in, out]; `esgrpo.engines.population` explains why each
rewrite is exact and what it saves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Arch", "Layer", "PopulationWeights", "check_window", "prepare_population", "stack_members"]


# --------------------------------------------------------------------------- architecture


@dataclass(frozen=True)
class Arch:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    tied: bool
    prefix: str  # name of the decoder inside the CausalLM ("model")
    inv_freq: Tensor  # [head_dim / 2] rotary inverse frequencies, fp32
    rope_scale: float  # transformers' attention_scaling (1.0 for the default rope)


def _arch(model: torch.nn.Module) -> Arch:
    config = model.config
    if getattr(config, "model_type", None) not in ("llama", "qwen2"):
        raise NotImplementedError(f"population generation supports llama and qwen2, not {config.model_type!r}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act {config.hidden_act!r} (only silu)")
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if heads % kv_heads or head_dim % 2:
        raise ValueError(f"heads {heads} / kv_heads {kv_heads} / head_dim {head_dim} not supported")
    prefix = getattr(model, "base_model_prefix", "model") or "model"
    names = {name for name, _ in model.named_parameters()}
    inv_freq, rope_scale = _rope(model, config, head_dim)
    return Arch(vocab=config.vocab_size, hidden=config.hidden_size, layers=config.num_hidden_layers,
                 heads=heads, kv_heads=kv_heads, head_dim=head_dim, intermediate=config.intermediate_size,
                 eps=float(config.rms_norm_eps), tied="lm_head.weight" not in names, prefix=prefix,
                 inv_freq=inv_freq, rope_scale=rope_scale)


def _rope(model: torch.nn.Module, config, head_dim: int) -> tuple[Tensor, float]:
    """Rotary inverse frequencies and output scale, as transformers computes them."""
    params = getattr(config, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        # transformers 5.x keeps theta in rope_parameters; 4.x had config.rope_theta.
        theta = params.get("rope_theta", getattr(config, "rope_theta", None))
        if theta is None:
            raise ValueError("no rope theta in config.rope_parameters or config.rope_theta")
        exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
        return 1.0 / (float(theta) ** exponent), 1.0
    if rope_type in ("dynamic", "longrope"):  # frequencies that change with the sequence length
        raise NotImplementedError(f"rope_type {rope_type!r}")
    # Other static rope types (linear, llama3, yarn, ...): reuse the module's precomputed buffer.
    rotary = getattr(getattr(model, "model", model), "rotary_emb", None)
    if rotary is None or not hasattr(rotary, "inv_freq"):
        raise NotImplementedError(f"rope_type {rope_type!r} without a rotary_emb.inv_freq buffer")
    return rotary.inv_freq.detach().float().cpu(), float(getattr(rotary, "attention_scaling", 1.0))


def check_window(model: torch.nn.Module, total: int) -> None:
    config = model.config
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    if any(t != "full_attention" for t in layer_types) and window is not None and window < total:
        raise NotImplementedError(f"sliding-window attention (window {window} < sequence length {total})")


# --------------------------------------------------------------------------- weights


def stack_members(model: torch.nn.Module, member_state_dicts: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """Stack N member state dicts into ``{name: [N, *param.shape]}`` for every parameter of `model`.

    Names are those of ``model.named_parameters()`` (a tied ``lm_head.weight`` is not one);
    extra keys in the state dicts (buffers, the tied head) are ignored.
    """
    if not member_state_dicts:
        raise ValueError("no members")
    stacked = {}
    for name, param in model.named_parameters():
        missing = [i for i, sd in enumerate(member_state_dicts) if name not in sd]
        if missing:
            raise KeyError(f"{name} missing from member state dict(s) {missing}")
        stacked[name] = torch.stack([sd[name].detach().to(param.device) for sd in member_state_dicts])
    return stacked


@dataclass
class Layer:
    wqkv: Tensor  # [N, H, (heads + 2 kv_heads) * head_dim], input norm, q scale, rope permutation folded
    bqkv: Tensor | None  # [N, 1, same] or None
    wo: Tensor  # [N, heads * head_dim, H]
    bo: Tensor | None
    wgu: Tensor  # [N, H, 2 I], post-attention norm folded
    bgu: Tensor | None
    wd: Tensor  # [N, I, H]
    bd: Tensor | None

    def members(self, s: int, e: int) -> Layer:
        """The same layer for members [s, e) (views)."""
        if s == 0 and e == self.wqkv.shape[0]:
            return self
        return Layer(*(None if w is None else w[s:e] for w in
                        (self.wqkv, self.bqkv, self.wo, self.bo, self.wgu, self.bgu, self.wd, self.bd)))


@dataclass
class PopulationWeights:
    """Member weights laid out for `population_generate`; build with `prepare_population`.

    Reusable across calls with the same members (several prompt batches), which saves the one
    copy of all N x d numbers that preparing costs.
    """

    n_members: int
    arch: Arch
    embed: Tensor  # [N * V, H], row n * V + token
    layers: list[Layer]
    lm_head: Tensor  # [N, H, V], final norm folded


def _as_in_out(w: Tensor) -> Tensor:
    """[N, out, in] (nn.Linear layout) -> contiguous [N, in, out], so `x @ w` is a plain NN gemm.

    (Measured against keeping nn.Linear's layout and passing a transposed view: no consistent
    difference on the small model, NN slightly ahead; contiguous also makes member slices cheap.)
    """
    return w.transpose(1, 2).contiguous()


def _rope_perm(head_dim: int, heads: int) -> Tensor:
    """Output-feature order that pairs (i, i + head_dim/2) as adjacent (real, imaginary) entries."""
    half = head_dim // 2
    within = torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).reshape(-1)
    return (torch.arange(heads)[:, None] * head_dim + within[None, :]).reshape(-1)


class _MemberValues:
    """Every parameter as [N, *shape] fp32 for the members being prepared: the stacked value, or the
    model's own for every member (a name absent from `stacked`, e.g. a frozen tensor)."""

    def __init__(self, model: torch.nn.Module, stacked: Mapping[str, Tensor] | None, member_rows: Tensor | None):
        self.params = dict(model.named_parameters())
        if not stacked:  # None (or empty): the model's own weights, one member
            stacked = {}
            self.n_members = 1
        else:
            sizes = {int(v.shape[0]) for v in stacked.values()}
            if len(sizes) != 1:
                raise ValueError(f"stacked tensors disagree on the member count: {sorted(sizes)}")
            self.n_members = sizes.pop()
            unknown = set(stacked) - set(self.params)
            if unknown:
                raise KeyError(f"not parameters of the model: {sorted(unknown)[:5]}")
        self.stacked = stacked
        self.rows = None
        if member_rows is not None:
            self.rows = torch.as_tensor(member_rows, dtype=torch.long).reshape(-1)
            self.n_members = int(self.rows.numel())
        self.device = next(model.parameters()).device

    def get(self, name: str) -> Tensor:
        """[N, *shape] fp32; may be an expanded view (callers copy)."""
        if name in self.stacked:
            value = self.stacked[name]
            if self.rows is not None:
                value = value.index_select(0, self.rows.to(value.device))
            return value.to(device=self.device, dtype=torch.float32)
        value = self.params[name].detach().to(torch.float32)
        return value.unsqueeze(0).expand(self.n_members, *value.shape)

    def maybe(self, name: str) -> Tensor | None:
        return self.get(name) if name in self.params else None

    def bias(self, name: str) -> Tensor | None:
        """[N, 1, width] contiguous, or None when the model has no such bias."""
        b = self.maybe(name)
        return None if b is None else b.unsqueeze(1).contiguous()


def _prepare_layer(values: _MemberValues, arch: Arch, i: int, perm_q: Tensor, perm_k: Tensor) -> Layer:
    """Layer i with its norms, the q scale and the rope permutation folded into fused projections."""
    hd, nq, nkv, p = arch.head_dim, arch.heads, arch.kv_heads, arch.prefix
    get, scale = values.get, hd ** -0.5
    a, m = f"{p}.layers.{i}.self_attn.", f"{p}.layers.{i}.mlp."
    ln1 = get(f"{p}.layers.{i}.input_layernorm.weight")
    ln2 = get(f"{p}.layers.{i}.post_attention_layernorm.weight")
    wqkv = torch.cat([get(a + "q_proj.weight")[:, perm_q] * scale,
                      get(a + "k_proj.weight")[:, perm_k],
                      get(a + "v_proj.weight")], dim=1)  # [N, C, H], nn.Linear layout
    wqkv = _as_in_out(wqkv * ln1[:, None, :])  # [N, H, C]
    biases = [values.maybe(a + f"{x}_proj.bias") for x in "qkv"]
    bqkv = None
    if any(b is not None for b in biases):
        widths = (nq * hd, nkv * hd, nkv * hd)
        bq, bk, bv = (b if b is not None else torch.zeros(values.n_members, w, device=values.device)
                      for b, w in zip(biases, widths, strict=True))
        bqkv = torch.cat([bq[:, perm_q] * scale, bk[:, perm_k], bv], dim=1).unsqueeze(1).contiguous()
    wgu = torch.cat([get(m + "gate_proj.weight"), get(m + "up_proj.weight")], dim=1)
    wgu = _as_in_out(wgu * ln2[:, None, :])
    bgu = None
    if f"{m}gate_proj.bias" in values.params:
        bgu = torch.cat([get(m + "gate_proj.bias"), get(m + "up_proj.bias")], dim=1).unsqueeze(1).contiguous()
    return Layer(wqkv=wqkv, bqkv=bqkv, wo=_as_in_out(get(a + "o_proj.weight")), bo=values.bias(a + "o_proj.bias"),
                  wgu=wgu, bgu=bgu, wd=_as_in_out(get(m + "down_proj.weight")), bd=values.bias(m + "down_proj.bias"))


@torch.no_grad()
def prepare_population(model: torch.nn.Module, stacked: Mapping[str, Tensor] | None,
                       member_rows: Tensor | None = None) -> PopulationWeights:
    """Fuse and lay out stacked member weights once per call (or once per population).

    stacked: ``{name: [N, *param.shape]}``; None means the model's own weights (N = 1). A name
    absent from `stacked` takes the model's own value for every member (e.g. frozen tensors).
    member_rows: optional 1-D indices into the member axis: only those members are prepared
    (in that order), e.g. to re-evaluate a subset without restacking.
    """
    arch = _arch(model)
    values = _MemberValues(model, stacked, member_rows)
    perm_q = _rope_perm(arch.head_dim, arch.heads).to(values.device)
    perm_k = _rope_perm(arch.head_dim, arch.kv_heads).to(values.device)
    layers = [_prepare_layer(values, arch, i, perm_q, perm_k) for i in range(arch.layers)]
    embed = values.get(f"{arch.prefix}.embed_tokens.weight")  # [N, V, H]
    head = embed if arch.tied else values.get("lm_head.weight")
    lm_head = _as_in_out(head * values.get(f"{arch.prefix}.norm.weight")[:, None, :])
    return PopulationWeights(n_members=values.n_members, arch=arch,
                             embed=embed.contiguous().reshape(values.n_members * arch.vocab, arch.hidden),
                             layers=layers, lm_head=lm_head)
