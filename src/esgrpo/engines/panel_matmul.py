"""An fp32 matmul for few rows against a weight matrix streamed from memory: x [M, in] @ W^T with W
stored as 24-column panels (`panel_matmul.c`), compiled here with the system's C compiler and loaded
through ctypes.

Why: a full-rank ES decode step multiplies each member's own weights by only its B prompts' rows
(8-16), so every member's matrices stream from memory once a step and the step is as fast as the
matmul reads weights. The libraries torch ships read them at about half the core's read bandwidth at
8 rows; this kernel reads near all of it (speeds: docs/references.md, "Measurements behind code
choices"). `benchmarks/es_throughput.py` prints which kernel ran.

Where the CPU has AVX-512 the kernel's tile is 8 rows instead of 4 (one pass over each panel at 8 rows,
twice the rows per instruction); both tiles give the same floats, so `kernel_name()` names the kernel, not
the tile, and `wide_tile()` says which runs (ESGRPO_PANEL_AVX512=0 keeps the 4-row AVX2 tile).

Where it cannot run (no AVX2/FMA, no C compiler, ESGRPO_PANEL_KERNEL=0) `available()` is False, says
why in `unavailable_reason()`, and the population engine keeps oneDNN's packed layout. The result is
the same product summed in another order (fp32 rounding apart), fixed per output: it does not depend on
the thread count.
"""

from __future__ import annotations

import ctypes
import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from esgrpo import native

__all__ = ["PANEL", "Panels", "available", "kernel_name", "matmul", "pack", "panels_shape", "set_wide_tile",
           "unavailable_reason", "wide_tile"]

PANEL = 24  # columns of a panel (NR in panel_matmul.c)
SOURCE = Path(__file__).with_name("panel_matmul.c")
FLAGS = native.AVX2_FLAGS
# Below this many multiply-adds a call runs on one thread: smaller calls lose more to the thread pool's
# hand-off than a second thread gains (measured: docs/references.md).
SPLIT_MIN_MACS = 2**23


@dataclass(frozen=True, slots=True)
class Panels:
    """One [out, in] fp32 matrix as panels."""

    data: Tensor  # [ceil(out / 24), in, 24], zero past `out`
    out: int
    inp: int


@functools.cache
def _library() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled kernel, "") or (None, why not), warned once."""
    return native.load_kernel(SOURCE, "ESGRPO_PANEL_KERNEL", "panel kernel",
                              "per-member matmuls use oneDNN, 1.6-1.9x slower at 8-16 rows", _prepare, FLAGS)


def _prepare(lib: ctypes.CDLL) -> str:
    p, i, long = ctypes.c_void_p, ctypes.c_int, ctypes.c_long
    lib.esgrpo_panel_matmul.argtypes = [p, long, i, p, i, i, i, p]
    lib.esgrpo_panel_matmul.restype = None
    lib.esgrpo_panel_pack.argtypes = [p, i, i, p, p, p]
    lib.esgrpo_panel_pack.restype = None
    lib.esgrpo_panel_set_wide.argtypes = [i]
    lib.esgrpo_panel_set_wide.restype = i
    lib.esgrpo_panel_set_wide(int(os.environ.get("ESGRPO_PANEL_AVX512", "1") != "0"))
    return ""


def available(device: torch.device | str = "cpu") -> bool:
    return torch.device(device).type == "cpu" and _library()[0] is not None


def unavailable_reason() -> str:
    """Why `available()` is False ("" when it is True)."""
    return _library()[1]


def kernel_name(device: torch.device | str = "cpu") -> str:
    """Which matmul the population engine's per-member matrices use on `device` (recorded in ES summaries:
    the kernels round differently)."""
    if torch.device(device).type != "cpu":
        return f"torch.bmm on {torch.device(device).type}"
    return "panel (esgrpo.engines.panel_matmul)" if available() else f"oneDNN packed ({unavailable_reason()})"


def wide_tile() -> bool:
    """True where the kernel multiplies 8-row AVX-512 tiles, False for 4-row AVX2 ones (or no kernel)."""
    lib = _library()[0]
    return lib is not None and bool(lib.esgrpo_panel_set_wide(-1))


def set_wide_tile(want: bool) -> bool:
    """Ask for the 8-row AVX-512 tile (taken only where the CPU has AVX-512 F and VL) or the 4-row AVX2 one;
    returns whether the wide tile now runs. Both give the same floats."""
    lib = _library()[0]
    return lib is not None and bool(lib.esgrpo_panel_set_wide(int(want)))


def panels_shape(out: int, inp: int) -> tuple[int, int, int]:
    """The shape of `Panels.data` for an [out, in] matrix."""
    return -(-out // PANEL), inp, PANEL


def pack(w: Tensor, col: Tensor | None = None, row: Tensor | None = None, data: Tensor | None = None) -> Panels:
    """[out, in] fp32 (CPU) -> the panels of (w * col[None, :]) * row[:, None] (each scale optional, the
    products rounded as torch rounds those two multiplies); written into `data` (contiguous fp32 of
    `panels_shape`, every element overwritten) when given."""
    if w.dtype != torch.float32 or w.dim() != 2 or w.device.type != "cpu":
        raise ValueError(f"pack takes a 2-D fp32 CPU matrix, not {tuple(w.shape)} {w.dtype} on {w.device}")
    out, inp = w.shape
    scales = []
    for name, scale, size in (("col", col, inp), ("row", row, out)):
        if scale is not None and (scale.shape != (size,) or scale.dtype != torch.float32 or scale.device != w.device):
            raise ValueError(f"{name} scale {tuple(scale.shape)} {scale.dtype} is not fp32 [{size}] on {w.device}")
        scales.append(None if scale is None else scale.contiguous())
    w = w.contiguous()
    if data is None:
        data = torch.empty(panels_shape(out, inp))
    elif tuple(data.shape) != panels_shape(out, inp) or not data.is_contiguous() or data.dtype != torch.float32:
        raise ValueError(f"data {tuple(data.shape)} {data.dtype} is not a contiguous fp32 {panels_shape(out, inp)}")
    _library()[0].esgrpo_panel_pack(w.data_ptr(), out, inp, *(None if t is None else t.data_ptr() for t in scales),
                                   data.data_ptr())
    return Panels(data, out, inp)


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(threads, thread_name_prefix="esgrpo-panel")


def matmul(x: Tensor, w: Panels, out: Tensor | None = None) -> Tensor:
    """x [M, in] fp32 -> x @ W^T [M, out] (into `out`, contiguous, when given); panels split over torch's
    intra-op threads (ctypes releases the GIL), each output column summed by one thread in one order."""
    if x.dim() != 2 or x.shape[1] != w.inp or x.dtype != torch.float32:
        raise ValueError(f"x {tuple(x.shape)} {x.dtype} does not match panels of a [{w.out}, {w.inp}] matrix")
    x = x.contiguous()
    rows = x.shape[0]
    y = torch.empty(rows, w.out) if out is None else out
    if tuple(y.shape) != (rows, w.out) or not y.is_contiguous() or y.dtype != torch.float32:
        raise ValueError(f"out {tuple(y.shape)} is not a contiguous fp32 [{rows}, {w.out}]")
    lib, panels = _library()[0], w.data.shape[0]
    threads = min(torch.get_num_threads(), panels)
    if threads <= 1 or rows * w.out * w.inp < SPLIT_MIN_MACS:
        lib.esgrpo_panel_matmul(x.data_ptr(), rows, w.inp, w.data.data_ptr(), w.out, 0, panels, y.data_ptr())
        return y
    bounds = [panels * t // threads for t in range(threads + 1)]
    jobs = [_pool(threads).submit(lib.esgrpo_panel_matmul, x.data_ptr(), rows, w.inp, w.data.data_ptr(), w.out,
                                  bounds[t], bounds[t + 1], y.data_ptr()) for t in range(threads)]
    for job in jobs:
        job.result()
    return y
