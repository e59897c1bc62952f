"""The papers' ES arithmetic, in place in the weights' dtype with no fp32 master (`ESConfig.arithmetic`).

The project's own arithmetic ("exact", `esgrpo.es.ops`) builds every member from an fp32 master theta
and applies the update to it. Both papers' code instead adds the noise into the live (bf16) weights,
subtracts it again to restore them, and adds the update into them. PAPERS.md lists that as a trap; it
is here so that a run can measure what it makes of the papers' findings. Read in their code, copied from
neither:

- paper A, Bhoy1/ESvsGRPO 43eed8c, src/es_vs_grpo/train/es_worker.py (`perturb_self_weights`,
  `restore_self_weights`) and src/es_vs_grpo/train/es.py (the update loop): perturb adds
  ``sigma * eps`` (a bf16 product of the bf16 draw) to each weight, restore adds ``-sigma * eps``; the
  update is N sequential adds of ``(alpha / N) * z_n * eps_n``, each rounded to bf16, member by member
  ("inplace_sequential");
- paper B, yunpengba7/understanding-es 240d878, src/es_reproduction/worker.py (`_apply_seeded_noise`,
  `_apply_population_update`): perturb adds ``sigma * eps`` computed in fp32 and cast to bf16, restore adds
  the cast of ``-sigma * eps``; the update sums ``(lr / N) * z_n * eps_n`` in fp32, casts the sum to bf16
  once and adds it ("inplace_summed").

One rule covers both perturbations: the step ``sign * sigma * eps`` is computed in the dtype eps is drawn
in (bf16 for paper A's seeding, fp32 otherwise), cast to the weights' dtype (`perturbation`), added,
and subtracted to restore. Rounding is symmetric, so subtracting the step is adding the cast of its
negation, as both papers' restores do. The restore is inexact: after member n the weights are
``(w + d_n) - d_n`` rounded twice, and the next member starts from there, so a tensor's members form a
chain (`InPlacePopulation`) whose end is the weights the update is applied to. With one engine the chain
runs over every member in order. The papers spread members over engines (each its own chain; paper A
then broadcasts engine 0's weights, paper B resynchronises every 117 steps): not reproduced here, where
one process (or one vLLM engine) evaluates every member.

The seedings are `esgrpo.noise.Noise.seeding`. On the transformers backend the tensors are the HF ones
(q_proj, k_proj, ... by their HF names and shapes): under paper A's seeding q_proj and o_proj (and k_proj
and v_proj, gate_proj and up_proj) of a layer share their noise where their shapes agree, more sharing than
vLLM's fused qkv_proj / gate_up_proj give paper A's own runs. The vLLM workers (`esgrpo.es.vllm_backend`)
draw the papers' noise for vLLM's own fused tensors and names, as the papers' workers did.

The population engine (`esgrpo.engines.population`) computes its matmuls in fp32; with this arithmetic the
member values it is handed are bf16 values (the chain in the weights' dtype), so what the weights hold is
what the papers' weights held.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from esgrpo.distance import StepAgreement, squared_norm
from esgrpo.noise import Noise, Population

__all__ = ["DrawOf", "IN_PLACE", "InPlacePopulation", "apply_update_in_place", "perturbation"]

IN_PLACE = ("inplace_sequential", "inplace_summed")  # esgrpo.es.settings.ARITHMETICS without "exact"

# draw_of(member seed, tensor name, shape, device) -> the member's draw in the dtype it is drawn in:
# `Noise.draw`, or on vLLM with the project's seeding the HF parts' fp32 noise in the fused layout
DrawOf = Callable[[int, str, Sequence[int], torch.device], Tensor]


def perturbation(draw: Tensor, sign: float, sigma: float, dtype: torch.dtype) -> Tensor:
    """``sign * sigma * eps`` computed in the draw's dtype and cast to the weights' `dtype`: what perturb adds
    and restore subtracts."""
    return (draw * (float(sign) * float(sigma))).to(dtype)


class InPlacePopulation(Population):
    """The members of one iteration under in-place arithmetic: member n of a tensor is ``w_{n-1} + d_n`` in
    the weights' dtype, where ``w_{n-1}`` is that tensor after the previous member's restore
    (``(w_{n-2} + d_{n-1}) - d_{n-1}``, rounded twice) and ``w_{-1}`` the weights; `finish` gives every
    tensor after the last restore.

    Read like `esgrpo.noise.Population` (member values are fp32 tensors holding values of the weights'
    dtype). A tensor's chain is walked as its members are asked for, in any order of tensors; asking for a
    member before one already given walks that tensor's chain again from the weights (the same values).
    `theta` (the weights, in their dtype) is only read.
    """

    exact = False

    def __init__(self, theta: Mapping[str, Tensor], seeds_signs: Sequence[tuple[int, float]], sigma: float,
                 noise: Noise, draw_of: DrawOf | None = None):
        super().__init__(theta, seeds_signs, sigma, noise, {n: t.dtype for n, t in theta.items()})
        self.draw_of = draw_of or noise.draw
        self._chains: dict[str, tuple[int, Tensor]] = {}  # name -> (next member, the tensor after its restore)
        self._ends: dict[str, Tensor] = {}  # name -> the tensor after the last member's restore

    @torch.inference_mode(False)
    @torch.no_grad()
    def _value(self, index: int, name: str) -> Tensor:
        """Member `index`'s value of one tensor, in the weights' dtype. Out of inference mode even when an
        evaluator asks from inside it: the chain's end becomes the weights, which the update adds into."""
        base = self.theta[name]
        start, current = self._chains.get(name, (0, base))
        if index < start:
            start, current = 0, base
        for j in range(start, index + 1):
            seed, sign = self.seeds_signs[j]
            step = perturbation(self.draw_of(seed, name, base.shape, base.device), sign, self.sigma, base.dtype)
            value = current.add(step)  # one rounding to the weights' dtype
            current = value.sub(step)
        if index + 1 == self.n_members:
            self._chains.pop(name, None)
            self._ends[name] = current
        else:
            self._chains[name] = (index + 1, current)
        return value

    def member(self, index: int, name: str) -> Tensor:
        return self._value(int(index), name).float()

    def stacked(self, name: str, rows: Sequence[int] | None = None) -> Tensor:
        rows = range(self.n_members) if rows is None else [int(r) for r in rows]
        return torch.stack([self.member(r, name) for r in rows])

    def members(self, dtypes: bool = True) -> Iterator[dict[str, Tensor]]:
        for index in range(self.n_members):
            yield {name: self._value(index, name) if dtypes else self.member(index, name) for name in self.theta}

    def factors(self, name: str, rows: Sequence[int] | None = None) -> tuple[Tensor, Tensor]:
        raise ValueError("in-place arithmetic has full-rank members only")

    def finish(self) -> dict[str, Tensor]:
        """Every tensor after the last member's restore (walking the chains no evaluator asked for to the end)."""
        for name in self.theta:
            if name not in self._ends:
                self._value(self.n_members - 1, name)
        return dict(self._ends)


@torch.no_grad()
def apply_update_in_place(weights: Mapping[str, Tensor], seeds_signs: Sequence[tuple[int, float]],
                          fitness_weights: Sequence[float] | np.ndarray, alpha: float, noise: Noise,
                          arithmetic: str, draw_of: DrawOf | None = None,
                          agreement: StepAgreement | None = None,
                          start: Mapping[str, Tensor] | None = None) -> float:
    """The update added into `weights` (in their dtype, in place); returns ||applied step|| (float64).

    The coefficient of member n is ``(alpha / N) * (w_n * sign_n)`` in float64, as both papers compute
    theirs. "inplace_sequential": per tensor, member by member, ``weights += cast(c_n * eps_n)`` (the product
    in the draw's dtype); "inplace_summed": ``sum_n c_n * eps_n`` in fp32 (eps cast to fp32), cast once and
    added. Members are not merged by seed: antithetic partners are two adds, as two members would be.
    `agreement`, where given, counts the weights' change since `start` (the weights before this iteration's
    members, so the restores' drift is in it; default: before the update) against the fp32 sum.
    """
    if arithmetic not in IN_PLACE:
        raise ValueError(f"in-place arithmetic must be one of {IN_PLACE}, got {arithmetic!r}")
    values = np.asarray(fitness_weights, dtype=np.float64).ravel()
    if values.size != len(seeds_signs):
        raise ValueError(f"{values.size} weights for {len(seeds_signs)} members")
    draw_of = draw_of or noise.draw
    scale = float(alpha) / len(seeds_signs)
    coefficients = [(int(s), scale * (float(w) * float(g))) for (s, g), w in zip(seeds_signs, values, strict=True)]
    squares = 0.0
    for name, value in weights.items():
        before = value.clone()
        total = None  # the intended step, the fp32 sum: paper B's update, and what `agreement` compares with
        if arithmetic == "inplace_summed" or agreement is not None:
            total = torch.zeros(value.shape, dtype=torch.float32, device=value.device)
        for seed, c in coefficients:  # one draw per member serves both
            draw = draw_of(seed, name, value.shape, value.device)
            if total is not None:
                total.add_(draw.float(), alpha=c)
            if arithmetic == "inplace_sequential":
                value.add_((draw * c).to(value.dtype))
        if arithmetic == "inplace_summed":
            value.add_(total.to(value.dtype))
        squares += squared_norm(value, before)
        if agreement is not None:
            origin = before if start is None else start[name]
            agreement.add(value.float() - origin.to(value.device).float(), total, name)
    return math.sqrt(squares)
