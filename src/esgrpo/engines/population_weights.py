"""Member weights laid out for the population engine (`esgrpo.engines.population`): N perturbed copies of one
causal LM, each projection a `Linear` over all members.

`prepare_population` folds what can be folded once per population instead of once per step (the
RMSNorm weights into the projection after the norm, the 1/sqrt(head_dim) attention scale into the
query projection, q/k/v and gate/up into one matrix each, the rotary pairing permuted to
interleaved pairs); `esgrpo.engines.population` explains why each rewrite is exact and what it saves.

Layouts, chosen per matrix by a measured rule (`PACK_MIN_ELEMENTS`; speeds in docs/references.md):
- small matrices: stacked [N, in, out] for one `torch.bmm` over members (per-call cost dominates);
- larger ones on a CPU: one packed matrix per member (`_pack`): 24-column panels for the panel kernel
  (`esgrpo.engines.panel_matmul`) where it builds, else oneDNN's blocked layout
  (`torch.ops.mkldnn._linear_pointwise`, the one torch's inductor uses for CPU linears): with 8-16 rows
  per member, what a decode step with B prompts per member is, the panel kernel beats oneDNN and oneDNN
  beats bmm and MKL's F.linear;
- low-rank members (`esgrpo.noise.Population` with low-rank noise): ONE matrix shared by all members,
  whose matmul takes all N x B rows at once, plus each member's (x B_n) A_n^T (EGGROLL, arXiv
  2511.16652); the norm weights (full-rank noise, one per member) are applied to the normalised
  activations instead of being folded.
Full-rank members are built from a `Population` one member and one matrix at a time (noise, fold and
pack stay in cache), never as an N x d stack.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from esgrpo.engines import panel_matmul
from esgrpo.engines.member_values import MemberBuffers, MemberValues

__all__ = ["Arch", "Embedding", "arch_of", "Layer", "Linear", "MemberBuffers", "PopulationWeights", "check_window",
           "member_bytes", "prepare_population", "stack_members"]

# Per-member matrices of at least this many elements use oneDNN's packed layout on a CPU (below it, a
# packed call per member costs more than one bmm over all members). Measured with 4-16 members, 8-32
# rows (scratch benchmark, 1 thread): packed / bmm time 0.1-0.4 at 64 x 128..384, 0.9-1.2 at
# 256 x 512 and 1024 x 256 (2^17-2^18), 1.3-2.6 at 256 x 2048 and 576 x 960 (> 2^19).
PACK_MIN_ELEMENTS = 2**18
# A matrix shared by every member (low rank) is one call for all N x B rows: packed from this size.
SHARED_PACK_MIN_ELEMENTS = 2**14


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


def arch_of(model: torch.nn.Module) -> Arch:
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


def _rope_perm(head_dim: int, heads: int) -> Tensor:
    """Output-feature order that pairs (i, i + head_dim/2) as adjacent (real, imaginary) entries."""
    half = head_dim // 2
    within = torch.stack([torch.arange(half), torch.arange(half) + half], dim=-1).reshape(-1)
    return (torch.arange(heads)[:, None] * head_dim + within[None, :]).reshape(-1)



# --------------------------------------------------------------------------- layouts


def packing_available(device: torch.device) -> bool:
    """A packed layout exists on this build and device (CPU only): the panel kernel or oneDNN's."""
    return device.type == "cpu" and (panel_matmul.available(device) or (
        torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")))


def _pack(w_out_in: Tensor, rows: int, values: MemberValues) -> Tensor | panel_matmul.Panels:
    """One [out, in] matrix packed: as panels for `esgrpo.engines.panel_matmul` where it runs (the faster
    at 8-16 rows), into a block of the preparation's kept memory; else in oneDNN's blocked layout for about
    `rows` rows per call (the hint picks the blocking, which hardly matters: docs/references.md; oneDNN
    allocates it)."""
    if panel_matmul.available(w_out_in.device):
        return panel_matmul.pack(w_out_in, data=values.take(panel_matmul.panels_shape(*w_out_in.shape)))
    return torch.ops.mkldnn._reorder_linear_weight(w_out_in.contiguous(), max(1, int(rows)))


def _packed_matmul(x: Tensor, w: Tensor | panel_matmul.Panels, out: Tensor | None = None) -> Tensor:
    if isinstance(w, panel_matmul.Panels):
        return panel_matmul.matmul(x, w, out)
    y = torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
    return y if out is None else out.copy_(y)


@dataclass
class Linear:
    """One projection of every member: x [N, R, in] -> [N, R, out], x_n W_n (+ (x_n D_n) U_n) (+ b_n).

    weight: [M, in, out] for torch.bmm, or a list of M packed [out, in] matrices (`_pack`); M = N (one
    matrix per member) or 1 (shared by all members, whose rows then go through one call).
    down [N, in, k] / up [N, k, out]: low-rank member terms (A_n scaled by sign sigma / sqrt(r) is in up).
    bias: [N or 1, 1, out] or None.
    """

    weight: Tensor | list[Tensor] | list[panel_matmul.Panels]
    bias: Tensor | None = None
    down: Tensor | None = None
    up: Tensor | None = None

    def __post_init__(self) -> None:
        self.shared = len(self.weight) == 1
        self.packed = isinstance(self.weight, list)

    def _out(self) -> int:
        w = self.weight[0]
        return w.out if isinstance(w, panel_matmul.Panels) else w.shape[-2 if self.packed else -1]

    def __call__(self, x: Tensor) -> Tensor:
        n, r, _ = x.shape
        xs = x.reshape(1, n * r, -1) if self.shared else x
        if self.packed:
            y = torch.empty(len(self.weight), xs.shape[1], self._out(), device=x.device)
            for i, w in enumerate(self.weight):
                _packed_matmul(xs[i], w, y[i])
        else:
            y = torch.bmm(xs, self.weight)
        y = y.view(n, r, -1)
        if self.down is not None:
            y.baddbmm_(torch.bmm(x, self.down), self.up)
        return y if self.bias is None else y.add_(self.bias)

    def add_(self, acc: Tensor, x: Tensor) -> Tensor:
        """acc += self(x) in place; stacked per-member weights ride the residual add on baddbmm."""
        if not self.packed and not self.shared and self.down is None:
            acc.baddbmm_(x, self.weight)
            return acc if self.bias is None else acc.add_(self.bias)
        return acc.add_(self(x))

    def members(self, s: int, e: int) -> Linear:
        """The same projection for members [s, e) (views)."""
        return Linear(self.weight if self.shared else self.weight[s:e], _rows(self.bias, s, e),
                      _rows(self.down, s, e), _rows(self.up, s, e))


def _rows(t: Tensor | None, s: int, e: int) -> Tensor | None:
    """Members [s, e) of a per-member tensor; a shared one ([1, ...]) or None as it is."""
    return t if t is None or t.shape[0] == 1 else t[s:e]


@dataclass
class Layer:
    qkv: Linear  # input norm (full rank), q scale and rope permutation folded
    o: Linear
    gu: Linear  # post-attention norm folded (full rank)
    down: Linear
    norm1: Tensor | None = None  # [N, 1, H]: the input norm weights when not folded (low rank)
    norm2: Tensor | None = None

    def members(self, s: int, e: int) -> Layer:
        """The same layer for members [s, e) (views)."""
        return Layer(self.qkv.members(s, e), self.o.members(s, e), self.gu.members(s, e), self.down.members(s, e),
                     _rows(self.norm1, s, e), _rows(self.norm2, s, e))


@dataclass
class Embedding:
    """Token embeddings of every member: a table [M * V, H] (M = N, row n * V + token; or M = 1, shared),
    plus low-rank member terms a [N * V, k] (A_n's rows, scaled) and b [N, k, H] (B_n^T)."""

    table: Tensor
    tables: int
    vocab: int
    a: Tensor | None = None
    b: Tensor | None = None

    def __call__(self, tokens: Tensor) -> Tensor:
        """tokens [N, R] -> [N, R, H]."""
        offsets = torch.arange(tokens.shape[0], device=tokens.device)[:, None] * self.vocab
        x = F.embedding(tokens + offsets if self.tables > 1 else tokens, self.table)
        if self.a is not None:
            x.baddbmm_(F.embedding(tokens + offsets, self.a), self.b)
        return x

    def members(self, s: int, e: int) -> Embedding:
        v = self.vocab
        table = self.table if self.tables == 1 else self.table[s * v:e * v]
        return Embedding(table, 1 if self.tables == 1 else e - s, v,
                         None if self.a is None else self.a[s * v:e * v], _rows(self.b, s, e))


@dataclass
class PopulationWeights:
    """Member weights laid out for `population_generate`; build with `prepare_population`.

    Reusable across calls with the same members (several prompt batches), which saves the noise and
    the layout work that preparing costs; when built on kept `MemberBuffers`, until those are prepared again.
    """

    n_members: int
    arch: Arch
    embed: Embedding
    layers: list[Layer]
    head: Linear  # final norm folded (full rank)
    norm: Tensor | None = None  # [N, 1, H]: the final norm weights when not folded (low rank)
    buffers: MemberBuffers | None = None  # the kept memory these weights live in, and its preparation
    epoch: int = 0

    def check(self) -> None:
        """Raise if the buffers were prepared again since (these weights overwritten)."""
        if self.buffers is not None:
            self.buffers.check(self.epoch)


def member_bytes(arch: Arch) -> int:
    """fp32 bytes of one full-rank member's prepared weights: every layer, the embedding table and the head."""
    layer = arch.hidden * ((arch.heads + 2 * arch.kv_heads) * arch.head_dim + arch.heads * arch.head_dim
                           + 3 * arch.intermediate)
    return 4 * (arch.layers * layer + 2 * arch.vocab * arch.hidden)


# --------------------------------------------------------------------------- full-rank members


@dataclass
class Folded:
    """A fold of k members: weight [k, out, in], bias [k, 1, out] or None; with deferred scales, weight is
    still to be multiplied by col [k, in] along its inputs (the norm) and then by row [out] along its
    outputs (the q scale), which the panel pack does on its way (`panel_matmul.pack`)."""

    weight: Tensor
    bias: Tensor | None
    col: Tensor | None = None
    row: Tensor | None = None


Fold = Callable[[Sequence[int] | None, bool], Folded]  # (members or None for all, defer the scales) -> Folded


def _per_member(fold: Fold, out: int, inp: int, values: MemberValues, rows: int) -> Linear:
    """One matrix per member, in the layout its size runs fastest in (`PACK_MIN_ELEMENTS`)."""
    if packing_available(values.device) and out * inp >= PACK_MIN_ELEMENTS:
        panels = panel_matmul.available(values.device)  # its pack multiplies the scales in: two passes fewer
        weights, biases = [], []
        for m in range(values.n_members):  # fold and pack one member at a time: it stays in cache
            f = fold([m], panels)
            weights.append(panel_matmul.pack(f.weight[0], None if f.col is None else f.col[0], f.row,
                                             values.take(panel_matmul.panels_shape(out, inp))) if panels
                           else _pack(f.weight[0], rows, values))
            biases.append(f.bias)
        values.forget()
        return Linear(weights, None if biases[0] is None else torch.cat(biases))
    f = fold(None, False)
    w = values.take((values.n_members, inp, out)).copy_(f.weight.transpose(1, 2))  # x @ w: a plain NN gemm
    return Linear(w, f.bias)


def _qkv_parts(arch: Arch, i: int, perm_q: Tensor, perm_k: Tensor) -> list[tuple[str, Tensor | None, float]]:
    """(module name, output permutation, scale) of q, k, v in the fused order."""
    a = f"{arch.prefix}.layers.{i}.self_attn."
    return [(a + "q_proj", perm_q, arch.head_dim ** -0.5), (a + "k_proj", perm_k, 1.0), (a + "v_proj", None, 1.0)]


def _fused_bias(values: MemberValues, parts, widths: Sequence[int], members) -> Tensor | None:
    """[k, 1, C] of the parts' biases (zeros where a part has none), permuted and scaled; None without biases."""
    biases = [values.maybe(name + ".bias", members) for name, _, _ in parts]
    if all(b is None for b in biases):
        return None
    k = len(values.rows) if members is None else len(members)
    out = []
    for b, (_, perm, scale), width in zip(biases, parts, widths, strict=True):
        b = torch.zeros(k, width, device=values.device) if b is None else b
        out.append((b[:, perm] if perm is not None else b) * scale)
    return torch.cat(out, dim=1).unsqueeze(1).contiguous()


def _fused_fold(values: MemberValues, parts, norm: str) -> Fold:
    """The fold of several [out, in] tensors into one: rows permuted and scaled, stacked, the norm folded."""

    shapes = [tuple(values.params[name + ".weight"].shape) for name, _, _ in parts]
    widths = [shape[0] for shape in shapes]
    scales = [scale for _, _, scale in parts]
    # the parts' scales along the fused outputs, for a deferred fold (the same for every member)
    row = None if set(scales) == {1.0} else torch.cat(
        [torch.full((width,), scale, device=values.device) for scale, width in zip(scales, widths, strict=True)])

    def fold(members, defer):
        k = values.n_members if members is None else len(members)
        fused = (k, sum(widths), shapes[0][1])
        # a reused buffer: the packed layout (one member) or the bmm layout (all members) copies it out
        w = values.scratch(fused, "fused")
        start = 0
        for (name, perm, _), width in zip(parts, widths, strict=True):
            values.stack_into(name + ".weight", members, w[:, start:start + width], perm)
            start += width
        bias, g = _fused_bias(values, parts, widths, members), values.stack(norm, members)
        if defer:
            return Folded(w, bias, g, row)
        w.mul_(g[:, None, :])
        start = 0
        for scale, width in zip(scales, widths, strict=True):
            if scale != 1.0:  # in place on the fused copy: no copy of the block of its own
                w[:, start:start + width].mul_(scale)
            start += width
        return Folded(w, bias)

    return fold


def _plain_fold(values: MemberValues, name: str) -> Fold:
    shape = tuple(values.params[name + ".weight"].shape)

    def fold(members, defer):  # nothing to scale
        bias = values.maybe(name + ".bias", members)
        bias = None if bias is None else bias.unsqueeze(1).contiguous()
        if members is not None and len(members) == 1:  # one member, packed next: into a reused buffer
            return Folded(values.stack_into(name + ".weight", members, values.scratch((1, *shape), "plain")), bias)
        return Folded(values.stack(name + ".weight", members), bias)

    return fold


def _full_layer(values: MemberValues, arch: Arch, i: int, perm_q: Tensor, perm_k: Tensor, rows: int) -> Layer:
    """Layer i, full rank: norms, the q scale and the rope permutation folded into fused projections."""
    p, h, hd = arch.prefix, arch.hidden, arch.head_dim
    m = f"{p}.layers.{i}.mlp."
    qkv = _fused_fold(values, _qkv_parts(arch, i, perm_q, perm_k), f"{p}.layers.{i}.input_layernorm.weight")
    gu = _fused_fold(values, [(m + "gate_proj", None, 1.0), (m + "up_proj", None, 1.0)],
                     f"{p}.layers.{i}.post_attention_layernorm.weight")
    return Layer(qkv=_per_member(qkv, (arch.heads + 2 * arch.kv_heads) * hd, h, values, rows),
                 o=_per_member(_plain_fold(values, f"{p}.layers.{i}.self_attn.o_proj"), h, arch.heads * hd, values,
                               rows),
                 gu=_per_member(gu, 2 * arch.intermediate, h, values, rows),
                 down=_per_member(_plain_fold(values, m + "down_proj"), h, arch.intermediate, values, rows))


def _full_members(values: MemberValues, arch: Arch, perm_q: Tensor, perm_k: Tensor, rows: int) -> PopulationWeights:
    layers = [_full_layer(values, arch, i, perm_q, perm_k, rows) for i in range(arch.layers)]
    n, v, h = values.n_members, arch.vocab, arch.hidden
    table = values.stack_into(f"{arch.prefix}.embed_tokens.weight", None, values.take((n, v, h))).view(n * v, h)
    norm = f"{arch.prefix}.norm.weight"

    def head(members, defer):  # a tied head is the member's embedding table (built: no second noise draw)
        if arch.tied:
            w = table.view(n, v, h)
            w = w if members is None else w[members[0]:members[0] + 1] if len(members) == 1 else w[list(members)]
        else:
            w = values.stack("lm_head.weight", members)
        g = values.stack(norm, members)
        if defer:  # the pack reads the table itself
            return Folded(w, None, g)
        if len(w) == 1:  # one member, packed next: into a reused buffer
            return Folded(torch.mul(w, g[:, None, :], out=values.scratch(tuple(w.shape), "head")), None)
        return Folded(w * g[:, None, :], None)

    return PopulationWeights(n_members=n, arch=arch, embed=Embedding(table, n, v),
                             layers=layers, head=_per_member(head, v, h, values, rows))


# --------------------------------------------------------------------------- low-rank members


def _shared_linear(base: Tensor, bias: Tensor | None, down: Tensor | None, up: Tensor | None, rows: int,
                   values: MemberValues) -> Linear:
    """A [out, in] matrix every member shares, packed from `SHARED_PACK_MIN_ELEMENTS` on a CPU."""
    if packing_available(values.device) and base.numel() >= SHARED_PACK_MIN_ELEMENTS:
        return Linear([_pack(base, rows, values)], bias, down, up)
    return Linear(base.T.contiguous().unsqueeze(0), bias, down, up)


def _lowrank_linear(values: MemberValues, parts, bias: Tensor | None, rows: int) -> Linear:
    """Fused parts (name, row permutation, scale): the shared [C, in] matrix, and the members' factors as
    down = [B_1 .. B_p] [N, in, p r] and a block-diagonal up [N, p r, C] holding each part's A^T."""
    bases, downs, ups, start = [], [], [], 0
    for name, perm, scale in parts:
        w, a, b = values.shared(name + ".weight")
        if perm is not None:
            w, a = w[perm], None if a is None else a[:, perm]
        bases.append(w * scale if scale != 1.0 else w)
        if a is not None:
            downs.append(b)
            ups.append((start, a.transpose(1, 2) * scale))
        start += w.shape[0]
    base = torch.cat(bases, dim=0)
    if not downs:
        return _shared_linear(base, bias, None, None, rows, values)
    down = torch.cat(downs, dim=2).contiguous()
    up = torch.zeros(down.shape[0], down.shape[2], start, device=values.device)
    col = 0
    for first, block in ups:
        up[:, col:col + block.shape[1], first:first + block.shape[2]] = block
        col += block.shape[1]
    return _shared_linear(base, bias, down, up, rows, values)


def _lowrank_layer(values: MemberValues, arch: Arch, i: int, perm_q: Tensor, perm_k: Tensor, rows: int) -> Layer:
    p = arch.prefix
    m, a = f"{p}.layers.{i}.mlp.", f"{p}.layers.{i}.self_attn."
    parts = _qkv_parts(arch, i, perm_q, perm_k)
    hd = arch.head_dim
    widths = (arch.heads * hd, arch.kv_heads * hd, arch.kv_heads * hd)
    gu_parts = [(m + "gate_proj", None, 1.0), (m + "up_proj", None, 1.0)]

    def plain(name):
        bias = values.maybe(name + ".bias")
        return _lowrank_linear(values, [(name, None, 1.0)], None if bias is None else bias.unsqueeze(1).contiguous(),
                               rows)

    def norm(name):
        return values.stack(f"{p}.layers.{i}.{name}.weight").unsqueeze(1).contiguous()

    return Layer(qkv=_lowrank_linear(values, parts, _fused_bias(values, parts, widths, None), rows),
                 o=plain(a + "o_proj"),
                 gu=_lowrank_linear(values, gu_parts, _fused_bias(values, gu_parts, (arch.intermediate,) * 2, None),
                                    rows),
                 down=plain(m + "down_proj"),
                 norm1=norm("input_layernorm"), norm2=norm("post_attention_layernorm"))


def _lowrank_members(values: MemberValues, arch: Arch, perm_q: Tensor, perm_k: Tensor,
                     rows: int) -> PopulationWeights:
    """Low rank: shared matrices take all N x B rows in one call (`rows` = N x B is their packing hint)."""
    p, n = arch.prefix, values.n_members
    layers = [_lowrank_layer(values, arch, i, perm_q, perm_k, rows) for i in range(arch.layers)]
    table, a, b = values.shared(f"{p}.embed_tokens.weight")
    embed = Embedding(table.contiguous(), 1, arch.vocab, None if a is None else a.reshape(n * arch.vocab, -1),
                      None if b is None else b.transpose(1, 2).contiguous())
    if not arch.tied:
        table, a, b = values.shared("lm_head.weight")
    head = _shared_linear(table, None, b, None if a is None else a.transpose(1, 2).contiguous(), rows, values)
    return PopulationWeights(n_members=n, arch=arch, embed=embed, layers=layers, head=head,
                             norm=values.stack(f"{p}.norm.weight").unsqueeze(1).contiguous())


@torch.no_grad()
def prepare_population(model: torch.nn.Module, stacked: Mapping[str, Tensor] | None,
                       member_rows: Tensor | None = None, rows: int = 8,
                       buffers: MemberBuffers | None = None) -> PopulationWeights:
    """Fuse and lay out member weights once per call (or once per population).

    stacked: ``{name: [N, *param.shape]}``, an `esgrpo.noise.Population` (members built here in the
    engine's layout; low-rank ones share their base matrices), or None for the model's own weights
    (N = 1). A name absent from `stacked` takes the model's own value for every member (e.g. frozen tensors).
    member_rows: optional 1-D indices into the member axis: only those members are prepared
    (in that order), e.g. to re-evaluate a subset without restacking.
    rows: the rows per member of a decode step (the prompts), the packed layout's size hint.
    buffers: memory kept by the caller across preparations (`MemberBuffers`: an ES run prepares fresh
    members of the same shapes every iteration); the weights of the previous preparation on them are
    overwritten. None: memory of this preparation's own.
    """
    arch = arch_of(model)
    values = MemberValues(model, stacked, member_rows, buffers)
    perm_q = _rope_perm(arch.head_dim, arch.heads).to(values.device)
    perm_k = _rope_perm(arch.head_dim, arch.kv_heads).to(values.device)
    if values.lowrank:
        out = _lowrank_members(values, arch, perm_q, perm_k, rows * values.n_members)
    else:
        out = _full_members(values, arch, perm_q, perm_k, rows)
    values.forget()
    out.buffers, out.epoch = values.buffers, values.buffers.epoch
    return out
