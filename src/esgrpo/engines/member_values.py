"""Every parameter's fp32 values for the members the population engine prepares
(`esgrpo.engines.population_weights`): from stacked tensors, from theta and the seeds of an
`esgrpo.noise.Population`, or the model's own values."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from esgrpo.noise import Population

__all__ = ["MemberBuffers", "MemberValues"]


class MemberBuffers:
    """fp32 memory the population engine keeps from one preparation (and generation) to the next: the packed
    member matrices, the embedding tables, the noise draws, the scratch and the KV cache. An ES iteration
    builds N fresh members of the same shapes every time; with these kept, from the second iteration on
    nothing is allocated or first-touched (the allocator otherwise hands the large blocks back to the
    system on free and the next call faults them in again, zeroed).

    `start` opens a preparation; its `take` calls are numbered in order, and the i-th gets the i-th kept
    block again (reallocated only when it needs more elements): the same model and population size take
    the same blocks in the same order every call. A `PopulationWeights` built on these buffers is valid
    until the next `start` (`check` says so).
    """

    def __init__(self) -> None:
        self._blocks: list[Tensor] = []
        self._named: dict[tuple[str, tuple[int, ...]], Tensor] = {}
        self._cursor = 0
        self.epoch = 0

    def start(self) -> int:
        """Open a preparation: the blocks are handed out again from the first; returns its epoch."""
        self._cursor = 0
        self.epoch += 1
        return self.epoch

    def check(self, epoch: int) -> None:
        if epoch != self.epoch:
            raise RuntimeError("these member weights were overwritten: their buffers were prepared again since")

    def take(self, shape: tuple[int, ...], device: torch.device) -> Tensor:
        """The next block of this preparation, as an fp32 tensor of `shape` (contents undefined)."""
        size = math.prod(shape)
        i = self._cursor
        self._cursor += 1
        if i == len(self._blocks):
            self._blocks.append(torch.empty(size, device=device))
        elif self._blocks[i].numel() < size or self._blocks[i].device != device:
            self._blocks[i] = torch.empty(size, device=device)
        return self._blocks[i][:size].view(shape)

    def named(self, slot: str, shape: tuple[int, ...], device: torch.device) -> Tensor:
        """A kept fp32 tensor for one (slot, shape), reused by every call that asks for it (scratch)."""
        key = (slot, tuple(int(d) for d in shape))
        if key not in self._named or self._named[key].device != device:
            self._named[key] = torch.empty(key[1], device=device)
        return self._named[key]

    def grow(self, slot: str, shape: tuple[int, ...], device: torch.device) -> Tensor:
        """A kept fp32 tensor of `shape` for one slot whose shape varies from call to call (the KV cache with
        the prompt length): one block per slot, reallocated only when it needs more elements."""
        size = math.prod(shape)
        key = (slot, ())
        block = self._named.get(key)
        if block is None or block.numel() < size or block.device != device:
            block = self._named[key] = torch.empty(size, device=device)
        return block[:size].view(shape)

    def nbytes(self) -> int:
        """Bytes kept."""
        return sum(t.numel() * t.element_size() for t in (*self._blocks, *self._named.values()))


class MemberValues:
    """Every parameter's fp32 values for the members being prepared: from stacked [N, *shape] tensors, a
    `Population` (built on demand, rounded to its dtypes as stacking would), or the model's own value
    for every member (a name the source lacks, e.g. a frozen tensor)."""

    def __init__(self, model: torch.nn.Module, stacked: Mapping[str, Tensor] | None, member_rows: Tensor | None,
                 buffers: MemberBuffers | None = None):
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
        # kept across calls when the caller keeps `buffers`; else for this preparation only
        self.buffers = buffers if buffers is not None else MemberBuffers()
        self.buffers.start()

    def take(self, shape: tuple[int, ...]) -> Tensor:
        """A block of the preparation's memory (`MemberBuffers.take`): member matrices and tables."""
        return self.buffers.take(shape, self.device)

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

        fp32 members of a `Population` go straight from theta and their noise draw into `out` (the add
        into a scratch buffer when rows are permuted), without the member's fresh copy, its permuted copy
        and their concatenation: at SmolLM2-135M's shape those copies were a third of preparing the members.
        """
        picked = self.rows if members is None else [self.rows[m] for m in members]
        pop = self.population
        if pop is not None and pop.exact and name in self.source and pop.dtypes.get(name, torch.float32) == torch.float32:
            for i, row in enumerate(picked):  # antithetic partners (adjacent) share the seed's cached draw
                seed, sign = pop.seeds_signs[row]
                base, noise = pop.theta[name], pop._noise(seed, name, self._noise_buffer)
                if perm is None:
                    torch.add(base, noise, alpha=sign * pop.sigma, out=out[i])
                else:
                    scratch = self.scratch(tuple(base.shape))
                    torch.add(base, noise, alpha=sign * pop.sigma, out=scratch)
                    torch.index_select(scratch, 0, perm, out=out[i])
            return out
        value = self.stack(name, members)
        return out.copy_(value if perm is None else value[:, perm])

    def _noise_buffer(self, shape: tuple[int, ...], slot: int) -> Tensor:
        return self.scratch(shape, f"noise {slot}")

    def scratch(self, shape: tuple[int, ...], slot: str = "member") -> Tensor:
        """A reusable fp32 buffer of `shape` (one per shape and slot): callers copy out of it before reuse."""
        return self.buffers.named(slot, shape, self.device)

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
