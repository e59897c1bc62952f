"""The bridge from a Snakemake `script:` to a stage function: logs, threads, plain arguments.

Rules stay thin: each workflow script is two lines that call `run_stage(snakemake, fn)`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import traceback
from collections.abc import Callable


def _plain(value):
    """Snakemake namedlists and numpy scalars -> plain Python (for JSON and dataclasses)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def run_stage(smk, stage: Callable[..., object]) -> None:
    """Call `stage(input=..., output=..., params=..., wildcards=..., threads=...)` with the log file open,
    holding the job's `gpu` resource as GPU slots (esgrpo.gpu_slots; a no-op without ESGRPO_GPU_SLOTS)."""
    from esgrpo.gpu_slots import gpu_slots

    threads = int(smk.threads or 1)
    # More torch threads than cores is the biggest CPU trap here (docs/references.md): one per job. Stages
    # that need no torch (tables, figures, the ES norm theory) must not pay its ~4 s import here, so
    # the setting goes to an already imported torch and, through OMP_NUM_THREADS, to a later one.
    os.environ["OMP_NUM_THREADS"] = str(threads)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    log_path = smk.log[0] if len(smk.log) else None
    handle = open(log_path, "w", buffering=1) if log_path else None
    redirect = (contextlib.redirect_stdout(handle), contextlib.redirect_stderr(handle)) if handle else ()
    with contextlib.ExitStack() as stack:
        for r in redirect:
            stack.enter_context(r)
        if handle:
            logging.basicConfig(stream=handle, level=logging.INFO, force=True)
        devices = stack.enter_context(gpu_slots(int(getattr(smk.resources, "gpu", 0) or 0)))
        if devices is not None:
            print(f"GPU slots: CUDA_VISIBLE_DEVICES={','.join(devices)}", flush=True)
        try:
            stage(input=dict(smk.input.items()), output=dict(smk.output.items()),
                  params=_plain(dict(smk.params.items())), wildcards=dict(smk.wildcards.items()),
                  threads=threads)
        except Exception:
            traceback.print_exc()
            if handle:
                handle.flush()
                print(f"stage {stage.__name__} failed; see {log_path}", file=sys.__stderr__)
            raise
