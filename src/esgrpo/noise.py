"""The ES noise: one member's fp32 noise for one tensor, a pure function of (member seed, tensor name),
full-rank or low-rank; and `Population`, the members theta + sign_n * sigma * eps_n of one iteration.

Shared by the ES weight math (`esgrpo.es.ops`) and the engines that perturb weights in their own
layout (`esgrpo.engines.vllm_layout` builds a fused vLLM tensor's noise from its HF parts; the
population engine `esgrpo.engines.population` builds members from a `Population` in its layout), so
it lives below both: torch and hashlib only.

Full rank: eps is standard normal of the tensor's shape (`tensor_noise`).
Low rank (EGGROLL, Sarkar et al., "Evolution Strategies at the Hyperscale", arXiv 2511.16652): a 2-D
tensor [m, n] gets eps = A B^T / sqrt(r), A [m, r] and B [n, r] the first m and last n rows of one
standard-normal draw [m + n, r] from the same (member seed, name) generator. Each entry of eps has
mean 0 and variance 1 (a sum of r products of independent unit normals, over sqrt(r)), so
E ||eps||_F^2 = m n as for full-rank noise and the norm theory alpha sqrt(T d / N) carries over.
Tensors of any other dimension (norm weights, biases) keep full-rank noise.

Seeding (`Noise.seeding`, `SEEDINGS`): "per_tensor" is the project's, above. The papers' two, to measure
what their arithmetic does (`esgrpo.es.arithmetic`): "paper_a" (Bhoy1/ESvsGRPO 43eed8c,
src/es_vs_grpo/train/es_worker.py, `perturb_self_weights`) seeds one generator with the member seed alone for
every tensor and draws in the weights' dtype (`Noise.dtype`), so same-shaped tensors get identical noise;
"paper_b" (yunpengba7/understanding-es 240d878, src/es_reproduction/worker.py, `_apply_seeded_noise`) seeds
with ``member seed XOR blake2b-8(name)`` (64 bits) and draws fp32.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from esgrpo.randn import randn

__all__ = ["FULL", "MASK63", "SEEDINGS", "Noise", "Population", "lowrank_factors", "mix_seeds", "stable_name_hash",
           "tensor_noise", "tensor_seed"]

MASK63 = (1 << 63) - 1
MASK64 = (1 << 64) - 1
SEEDINGS = ("per_tensor", "paper_a", "paper_b")  # esgrpo.es.settings.ESConfig.noise_seeding


def stable_name_hash(name: str) -> int:
    """64-bit hash of a tensor name that is the same in every process (Python's `hash` is salted)."""
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


def mix_seeds(*values: int) -> int:
    """A 63-bit seed from several integers; a hash, so nearby inputs give unrelated seeds."""
    data = b"".join(int(v & ((1 << 64) - 1)).to_bytes(8, "little") for v in values)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & MASK63


def tensor_seed(seed: int, name: str) -> int:
    """The seed of one tensor's draw under `seed`: every random draw made tensor by tensor (ES noise, the
    analyses' random directions and samples) seeds its generator with it, so a tensor's values depend on
    neither the other tensors nor their order, and same-shaped tensors get independent draws."""
    return mix_seeds(int(seed), stable_name_hash(name))


def _seed(member_seed: int, name: str, seeding: str = "per_tensor") -> int:
    """The seed of the generator that draws one member's noise for one tensor."""
    if seeding == "per_tensor":
        return tensor_seed(member_seed, name)
    if seeding == "paper_a":  # the member seed alone, whatever the tensor
        return int(member_seed)
    return (int(member_seed) ^ stable_name_hash(name)) & MASK64  # paper_b: seed XOR the name's blake2b-8


def _standard_normal(seed: int, shape: Sequence[int] | torch.Size, device: torch.device | str,
                     dtype: torch.dtype = torch.float32, out: Tensor | None = None) -> Tensor:
    """torch.randn from a generator seeded with `seed` (into `out` when given); fp32 on the CPU through
    `esgrpo.randn`, the same values faster."""
    if torch.device(device).type == "cpu" and dtype == torch.float32:
        return randn(seed, shape, out)
    generator = torch.Generator(device=device).manual_seed(int(seed))
    if out is not None:
        return torch.randn(tuple(shape), generator=generator, out=out)
    return torch.randn(tuple(shape), generator=generator, dtype=dtype, device=device)


def tensor_noise(member_seed: int, name: str, shape: Sequence[int] | torch.Size,
                 device: torch.device | str = "cpu", out: Tensor | None = None) -> Tensor:
    """Standard normal fp32 noise of one member for one tensor (written into `out`, contiguous fp32 of
    `shape`, when given: the same values).

    Seeded by a mix of the member seed and the tensor's name, so same-shaped tensors get
    independent noise (the public-code trap: one seed for every tensor) and the same call
    always regenerates the same values. CPU and CUDA generators give different streams.
    """
    return _standard_normal(tensor_seed(member_seed, name), shape, device, out=out)


def lowrank_factors(member_seed: int, name: str, shape: Sequence[int], rank: int,
                    device: torch.device | str = "cpu") -> tuple[Tensor, Tensor]:
    """The factors A [m, r], B [n, r] of one member's low-rank noise A B^T / sqrt(r) for a tensor [m, n]."""
    m, n = (int(s) for s in shape)
    draw = _standard_normal(tensor_seed(member_seed, name), (m + n, int(rank)), device)
    return draw[:m], draw[m:]


@dataclass(frozen=True)
class Noise:
    """Which noise the members get: "full" (every tensor) or "lowrank" of rank `rank` (2-D tensors), seeded
    as `seeding` says (`SEEDINGS`; the papers' seedings are full-rank only). `dtype`: what "paper_a" draws
    in, the weights' dtype (the other seedings draw fp32)."""

    kind: str = "full"
    rank: int = 1
    seeding: str = "per_tensor"
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.kind not in ("full", "lowrank"):  # esgrpo.es.settings.NOISE_KINDS
            raise ValueError(f"noise must be 'full' or 'lowrank', got {self.kind!r}")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1:
            raise ValueError(f"noise rank must be an integer >= 1, got {self.rank!r}")
        if self.seeding not in SEEDINGS:
            raise ValueError(f"noise seeding must be one of {SEEDINGS}, got {self.seeding!r}")
        if self.seeding != "per_tensor" and self.kind != "full":
            raise ValueError(f"noise seeding {self.seeding!r} is full-rank only (the papers' code has no low rank)")

    def draw(self, member_seed: int, name: str, shape: Sequence[int], device: torch.device | str = "cpu") -> Tensor:
        """One member's full-rank standard-normal draw for one tensor, in the dtype it is drawn in (fp32, or
        `dtype` for "paper_a")."""
        dtype = self.dtype if self.seeding == "paper_a" else torch.float32
        return _standard_normal(_seed(member_seed, name, self.seeding), shape, device, dtype)

    def lowrank(self, shape: Sequence[int]) -> bool:
        """Whether a tensor of `shape` gets low-rank noise."""
        return self.kind == "lowrank" and len(shape) == 2

    def dense(self, member_seed: int, name: str, shape: Sequence[int], device: torch.device | str = "cpu",
              out: Tensor | None = None) -> Tensor:
        """One member's noise eps for one tensor, as a dense fp32 tensor of `shape` (into `out` when given)."""
        if self.lowrank(shape):
            a, b = lowrank_factors(member_seed, name, shape, self.rank, device)
            value = (a @ b.T).div_(math.sqrt(self.rank))
            return value if out is None else out.copy_(value)
        if self.seeding == "paper_a":  # drawn in the weights' dtype; a bf16 draw is exact in fp32
            value = self.draw(member_seed, name, shape, device)
            return value.float() if out is None else out.copy_(value)
        return _standard_normal(_seed(member_seed, name, self.seeding), shape, device, out=out)

    @torch.no_grad()
    def weighted_sum(self, coefficients: Mapping[int, float], name: str, shape: Sequence[int],
                     device: torch.device | str = "cpu") -> Tensor:
        """``sum_seed c_seed * eps_seed`` for one tensor in fp32 (zero coefficients skipped).

        Full rank: the noises added one at a time in the coefficients' order. Low rank: one matmul
        [c_1 A_1, ..., c_k A_k] [B_1, ..., B_k]^T / sqrt(r), the factors stacked along the rank.
        """
        seeds = [(int(s), float(c)) for s, c in coefficients.items() if c != 0.0]
        if self.lowrank(shape) and seeds:
            factors = [(c, lowrank_factors(s, name, shape, self.rank, device)) for s, c in seeds]
            a = torch.cat([f[0].mul(c) for c, f in factors], dim=1)
            b = torch.cat([f[1] for _, f in factors], dim=1)
            return (a @ b.T).div_(math.sqrt(self.rank))
        total = torch.zeros(tuple(shape), dtype=torch.float32, device=device)
        draw = torch.empty_like(total) if seeds else None  # one draw's memory for every seed (the same values)
        for s, c in seeds:
            total.add_(self.dense(s, name, shape, device, out=draw), alpha=c)
        return total


FULL = Noise()


class Population(Mapping):
    """The members ``theta + sign_n * sigma * eps_n`` of one iteration, built on demand.

    A Mapping name -> stacked [N, *shape] members (cast to `dtypes[name]`, fp32 by default), so an
    evaluator that wants stacked weights reads it like a dict; the population engine builds members
    in its own layout from `theta`, `member` and `factors` instead, without the N x d stack. Every
    member value comes from the clean theta (restoring is exact by construction). theta is only read.
    """

    # Every member is theta + sign * sigma * eps from the clean theta (an engine may build it so itself);
    # esgrpo.es.arithmetic.InPlacePopulation's members are not.
    exact = True

    def __init__(self, theta: Mapping[str, Tensor], seeds_signs: Sequence[tuple[int, float]], sigma: float,
                 noise: Noise = FULL, dtypes: Mapping[str, torch.dtype] | None = None):
        self.theta, self.sigma, self.noise = theta, float(sigma), noise
        self.seeds_signs = [(int(s), float(g)) for s, g in seeds_signs]
        self.dtypes = dict(dtypes or {})
        # The current seed's noise draws: antithetic partners (adjacent members, one seed) share them when
        # an engine builds a fused matrix from several tensors member by member; a new seed clears them.
        self._seed: int | None = None
        self._draws: dict[str, Tensor] = {}

    @property
    def n_members(self) -> int:
        return len(self.seeds_signs)

    def __len__(self) -> int:
        return len(self.theta)

    def __iter__(self) -> Iterator[str]:
        return iter(self.theta)

    def __contains__(self, name: object) -> bool:  # Mapping's default would build the members to find out
        return name in self.theta

    def __getitem__(self, name: str) -> Tensor:
        return self.stacked(name).to(self.dtypes.get(name, torch.float32))

    def _noise(self, seed: int, name: str, scratch: Callable[[tuple[int, ...], int], Tensor] | None = None) -> Tensor:
        """The seed's draw for one tensor, cached until another seed's is asked for; drawn into
        ``scratch(shape, slot)`` when given (slot: how many draws of that shape the cache holds already)."""
        if seed != self._seed:
            self._seed, self._draws = seed, {}
        if name not in self._draws:
            base = self.theta[name]
            shape = tuple(base.shape)
            out = None if scratch is None else scratch(shape, sum(d.shape == shape for d in self._draws.values()))
            self._draws[name] = self.noise.dense(seed, name, shape, base.device, out)
        return self._draws[name]

    def forget(self) -> None:
        """Drop the cached noise draws (after building members; call it between two members' tensors too)."""
        self._seed, self._draws = None, {}

    def member(self, index: int, name: str) -> Tensor:
        """Member `index`'s fp32 value of one tensor (its noise draw kept until another seed's is asked for:
        a caller going through many tensors of one member calls `forget` between them)."""
        seed, sign = self.seeds_signs[index]
        return self.theta[name].add(self._noise(seed, name), alpha=sign * self.sigma)

    def stacked(self, name: str, rows: Sequence[int] | None = None) -> Tensor:
        """[len(rows), *shape] fp32 values of the members `rows` (default all) for one tensor."""
        rows = range(self.n_members) if rows is None else [int(r) for r in rows]
        base = self.theta[name]
        out = torch.empty((len(rows), *base.shape), dtype=torch.float32, device=base.device)
        draw: tuple[int, Tensor] | None = None
        for i, r in enumerate(rows):
            seed, sign = self.seeds_signs[r]
            if draw is None or draw[0] != seed:  # antithetic partners are adjacent: one draw for both
                draw = (seed, self.noise.dense(seed, name, base.shape, base.device))
            torch.add(base, draw[1], alpha=sign * self.sigma, out=out[i])
        return out

    def members(self, dtypes: bool = True) -> Iterator[dict[str, Tensor]]:
        """One member's weights at a time, {name: tensor} (cast to `dtypes` unless told not to)."""
        for seed, sign in self.seeds_signs:
            member = {}
            for name, base in self.theta.items():
                value = base.add(self.noise.dense(seed, name, base.shape, base.device), alpha=sign * self.sigma)
                member[name] = value.to(self.dtypes.get(name, torch.float32)) if dtypes else value
            yield member

    def factors(self, name: str, rows: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
        """Low-rank members' factors of one 2-D tensor: A [k, m, r] scaled by sign_n * sigma / sqrt(r), and
        B [k, n, r], so member n's value is theta + A_n B_n^T."""
        rows = range(self.n_members) if rows is None else [int(r) for r in rows]
        base = self.theta[name]
        if not self.noise.lowrank(base.shape):
            raise ValueError(f"{name} {tuple(base.shape)} has no low-rank factors under {self.noise}")
        scale = self.sigma / math.sqrt(self.noise.rank)
        a_s, b_s = [], []
        for r in rows:
            seed, sign = self.seeds_signs[r]
            a, b = lowrank_factors(seed, name, base.shape, self.noise.rank, base.device)
            a_s.append(a.mul(sign * scale))
            b_s.append(b)
        return torch.stack(a_s), torch.stack(b_s)
