"""Every parameter's fp32 values for the members the population engine prepares
(`esgrpo.engines.population_weights`): from stacked tensors, from theta and the seeds of an
`esgrpo.noise.Population`, or the model's own values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from esgrpo.noise import Population

__all__ = ["MemberValues"]


class MemberValues:
    """Every parameter's fp32 values for the members being prepared: from stacked [N, *shape] tensors, a
    `Population` (built on demand, rounded to its dtypes as stacking would), or the model's own value
    for every member (a name the source lacks, e.g. a frozen tensor)."""

    def __init__(self, model: torch.nn.Module, stacked: Mapping[str, Tensor] | None, member_rows: Tensor | None):
        self.params = dict(model.named_parameters())
        self.device = next(model.parameters()).device
        self.source = stacked or {}
        self.population = stacked if isinstance(stacked, Population) else None
        unknown = set(self.source) - set(self.params)
        if unknown:
            raise KeyError(f"not parameters of the model: {sorted(unknown)[:5]}")
        if self.population is not None:
            total = self.population.n_members
        elif self.source:
            sizes = {int(v.shape[0]) for v in self.source.values()}
            if len(sizes) != 1:
                raise ValueError(f"stacked tensors disagree on the member count: {sorted(sizes)}")
            total = sizes.pop()
        else:
            total = 1
        self.rows = (list(range(total)) if member_rows is None
                     else [int(r) for r in torch.as_tensor(member_rows, dtype=torch.long).reshape(-1)])
        self.n_members = len(self.rows)
        self.lowrank = self.population is not None and self.population.noise.kind == "lowrank"
        self._scratch: dict[tuple[str, tuple[int, ...]], Tensor] = {}

    def stack(self, name: str, members: Sequence[int] | None = None) -> Tensor:
        """[k, *shape] fp32 values of the prepared members `members` (positions, default all); may be an
        expanded view (callers copy)."""
        picked = self.rows if members is None else [self.rows[m] for m in members]
        if name in self.source:
            if self.population is not None:
                pop = self.population
                # one member at a time draws through the population's cache: antithetic partners share it
                value = (pop.member(picked[0], name).unsqueeze(0) if len(picked) == 1
                         else pop.stacked(name, picked))
                dtype = pop.dtypes.get(name, torch.float32)
                return value if dtype == torch.float32 else value.to(dtype).float()
            value = self.source[name]
            if picked != list(range(value.shape[0])):
                value = value.index_select(0, torch.tensor(picked, device=value.device))
            return value.to(device=self.device, dtype=torch.float32)
        value = self.params[name].detach().to(torch.float32)
        return value.unsqueeze(0).expand(len(picked), *value.shape)

    def stack_into(self, name: str, members: Sequence[int] | None, out: Tensor, perm: Tensor | None = None) -> Tensor:
        """`stack` written into `out` [k, *shape] (rows permuted by `perm` when given): the same values.

        One fp32 member of a `Population` goes straight from theta and its noise draw into `out` (the add
        into a scratch buffer when rows are permuted), without the member's fresh copy, its permuted copy
        and their concatenation: at SmolLM2-135M's shape those copies were a third of preparing the members.
        """
        picked = self.rows if members is None else [self.rows[m] for m in members]
        pop = self.population
        if (pop is not None and name in self.source and len(picked) == 1
                and pop.dtypes.get(name, torch.float32) == torch.float32):
            seed, sign = pop.seeds_signs[picked[0]]
            base, noise = pop.theta[name], pop._noise(seed, name)
            if perm is None:
                torch.add(base, noise, alpha=sign * pop.sigma, out=out[0])
            else:
                scratch = self.scratch(tuple(base.shape))
                torch.add(base, noise, alpha=sign * pop.sigma, out=scratch)
                torch.index_select(scratch, 0, perm, out=out[0])
            return out
        value = self.stack(name, members)
        return out.copy_(value if perm is None else value[:, perm])

    def scratch(self, shape: tuple[int, ...], slot: str = "member") -> Tensor:
        """A reusable fp32 buffer of `shape` (one per shape and slot): callers copy out of it before reuse."""
        key = (slot, shape)
        if key not in self._scratch:
            self._scratch[key] = torch.empty(shape, dtype=torch.float32, device=self.device)
        return self._scratch[key]

    def forget(self) -> None:
        """Drop the population's cached noise draws (kept only across one matrix's members)."""
        if self.population is not None:
            self.population.forget()

    def maybe(self, name: str, members: Sequence[int] | None = None) -> Tensor | None:
        return self.stack(name, members) if name in self.params else None

    def shared(self, name: str) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Low rank: the value every member shares ([*shape] fp32) and the members' factors (A scaled
        [N, m, r], B [N, n, r]), or None, None for a tensor without member noise."""
        if name not in self.source:
            return self.params[name].detach().to(torch.float32), None, None
        pop = self.population
        base = pop.theta[name].to(pop.dtypes.get(name, torch.float32)).float()
        a, b = pop.factors(name, self.rows)
        return base, a, b
