"""`torch.randn`'s values for a CPU fp32 tensor from a freshly seeded generator, faster (docs/references.md):
the ES noise (`esgrpo.noise`) is these values, and drawing them was most of the time to build a member.

`randn.c` computes what torch's CPU kernel computes, operation for operation (MT19937 words, then the
Box-Muller transform with the same single-precision polynomials), in one vectorised pass. Before its
first use in a process it is checked against `torch.randn` itself on sizes that cover every way the
stream is cut (below, at and past a twist of the generator, a tail of 1-15); any difference, a CPU
without AVX2 (where torch's values differ too: its scalar path), no C compiler or ESGRPO_RANDN_KERNEL=0
leave `torch.randn`, with the same values, at its own speed. `kernel_name()` says which ran.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from esgrpo import native

__all__ = ["available", "kernel_name", "randn", "unavailable_reason"]

SOURCE = Path(__file__).with_name("randn.c")
# (seed, numel) checked against torch.randn at load: one chunk, tails of 1 and 15, a generator twist
# (624 words = 39 chunks) crossed by the main pass and by the tail's words, seeds past 32 bits
CHECKS = ((0, 16), (1, 17), (2**32 - 1, 31), (12345, 9984), (2**40 + 7, 9991), (987654321, 100_003))


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled kernel, "") or (None, why not), warned once."""
    return native.load_kernel(SOURCE, "ESGRPO_RANDN_KERNEL", "randn kernel",
                              "ES noise is drawn by torch.randn (the same values, slower)", _prepare)


def _prepare(lib: ctypes.CDLL) -> str:
    lib.esgrpo_randn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_long]
    lib.esgrpo_randn.restype = None
    for seed, n in CHECKS:
        ours = torch.empty(n)
        lib.esgrpo_randn(seed & 0xFFFFFFFF, ours.data_ptr(), n)
        theirs = torch.randn(n, generator=torch.Generator().manual_seed(seed))
        if not torch.equal(ours.view(torch.int32), theirs.view(torch.int32)):
            return f"its values differ from torch {torch.__version__}'s randn (seed {seed}, {n} values)"
    return ""


def available() -> bool:
    return _library()[0] is not None


def unavailable_reason() -> str:
    """Why `available()` is False ("" when it is True)."""
    return _library()[1]


def kernel_name() -> str:
    """What draws CPU noise in this process (benchmarks print it; results do not depend on it)."""
    return "esgrpo.randn" if available() else f"torch.randn ({unavailable_reason()})"


def randn(seed: int, shape: Sequence[int] | torch.Size, out: Tensor | None = None) -> Tensor:
    """``torch.randn(shape, generator=torch.Generator().manual_seed(seed))``, fp32 on the CPU (written into
    `out`, contiguous fp32 of `shape`, when given): the same values."""
    shape = tuple(int(s) for s in shape)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    elif tuple(out.shape) != shape or out.dtype != torch.float32 or out.device.type != "cpu" or not out.is_contiguous():
        raise ValueError(f"out {tuple(out.shape)} {out.dtype} on {out.device} is not a contiguous fp32 CPU {shape}")
    lib = _library()[0]
    if lib is None or out.numel() < 16:  # torch draws fewer than 16 values another way
        return torch.randn(shape, generator=torch.Generator().manual_seed(int(seed)), out=out)
    lib.esgrpo_randn(int(seed) & 0xFFFFFFFF, out.data_ptr(), out.numel())
    return out
