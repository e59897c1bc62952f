"""The package's C kernels (`esgrpo.randn`, `esgrpo.engines.panel_matmul`): each compiled from its source
beside it with the system's C compiler at first use, cached per source, compiler and flags, and loaded
through ctypes. Where one cannot run, its module says why and keeps torch's own path."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

__all__ = ["AVX2_FLAGS", "avx2_missing", "compile_library", "load_kernel"]

# -ffp-contract=off: a multiply and an add fuse only where the source writes one instruction, so a kernel's
# floats do not depend on the compiler's choices
AVX2_FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fPIC", "-shared")


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(root) / "esgrpo" / "kernels"


def avx2_missing() -> str:
    """Why an AVX2 kernel cannot run here ("" when it can): torch's own dispatch says what the CPU has."""
    capability = torch.backends.cpu.get_cpu_capability()
    return "" if capability in ("AVX2", "AVX512") else f"CPU capability {capability} (needs AVX2 with FMA)"


def compile_library(source: Path, flags: Sequence[str] = AVX2_FLAGS) -> tuple[ctypes.CDLL | None, str]:
    """(the library built from `source`, "") or (None, why not). Built once per source, compiler and flags,
    atomically (several Snakemake jobs may build it at once)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "no C compiler (cc, gcc or $CC) on PATH"
    key = hashlib.sha256(source.read_bytes() + " ".join([compiler, *flags]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{source.stem}-{key}.so"
    try:
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
                built = Path(tmp) / target.name
                run = subprocess.run([compiler, *flags, str(source), "-o", str(built)], capture_output=True,
                                     text=True)
                if run.returncode != 0:
                    return None, f"{compiler} failed on {source}: {run.stderr.strip()[-300:]}"
                os.replace(built, target)
        return ctypes.CDLL(str(target)), ""
    except OSError as err:  # a read-only cache, a library that does not load
        return None, f"cannot build or load {target}: {err}"


def load_kernel(source: Path, switch: str, name: str, fallback: str, prepare: Callable[[ctypes.CDLL], str],
                flags: Sequence[str] = AVX2_FLAGS) -> tuple[ctypes.CDLL | None, str]:
    """(the kernel `name` built from `source` and set up by `prepare`, "") or (None, why not), warning once
    that `fallback` runs instead unless the environment variable `switch` is "0" (the user's choice).
    `prepare(lib)` declares the library's functions and returns "" or why the kernel must not be used."""
    if os.environ.get(switch, "1") == "0":
        return None, f"{switch}=0"
    reason = avx2_missing()
    lib = None
    if not reason:
        lib, reason = compile_library(source, flags)
    if lib is not None:
        reason = prepare(lib)
    if reason:
        warnings.warn(f"the {name} is not available ({reason}): {fallback}", stacklevel=4)
        return None, reason
    return lib, ""
