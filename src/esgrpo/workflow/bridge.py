"""The bridge from a Snakemake `script:` to a stage function: logs, threads, plain arguments.

Rules stay thin: each workflow script is two lines that call
``run_stage(snakemake, "<module>:<function>")``, e.g.
``esgrpo.workflow.stages.training:train_run``. The stage is named, not imported, by the
script, so that a local run can hand the call to its warm job server (esgrpo.workflow.job_server), which
has torch and transformers imported already; elsewhere (SLURM, GPU configs) the call runs here.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import socket
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path


def _plain(value):
    """Snakemake namedlists and numpy scalars -> plain Python (for JSON and dataclasses)."""
    if hasattr(value, "item") and not isinstance(value, (list, dict, str)):
        return value.item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _as_inputs(value, inputs: list[str]):
    """Every parameter string that names an input file (a model folder, say), as the job's path of that input:
    the same string on a shared filesystem; under a default storage provider the local copy Snakemake fetched
    (`.snakemake/storage/<provider>/<bucket>/<prefix>/<path>`), which the path the rules name is the end of."""
    if isinstance(value, dict):
        return {k: _as_inputs(v, inputs) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_inputs(v, inputs) for v in value]
    if isinstance(value, str) and "/" in value and not value.startswith("/") and value not in inputs:
        fetched = {path for path in inputs if path.endswith(f"/{value}")}
        if len(fetched) == 1:
            return fetched.pop()
    return value


def _paths(value) -> list[str]:
    if isinstance(value, dict):
        return [p for v in value.values() for p in _paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in _paths(v)]
    return [value] if isinstance(value, str) else []


@dataclass(frozen=True)
class StageCall:
    """One job's stage call in plain data: what `run_stage` runs here or in a job-server child."""

    stage: str  # "module:function"
    kwargs: dict  # input, output, params, wildcards, threads
    log_path: str | None
    gpus: int

    @classmethod
    def from_snakemake(cls, smk, stage: str) -> StageCall:
        inputs = _plain(dict(smk.input.items()))
        params = _as_inputs(_plain(dict(smk.params.items())), _paths(inputs))
        kwargs = {"input": inputs, "output": _plain(dict(smk.output.items())),
                  "params": params, "wildcards": dict(smk.wildcards.items()),
                  "threads": int(smk.threads or 1)}
        return cls(stage, kwargs, smk.log[0] if len(smk.log) else None,
                   int(getattr(smk.resources, "gpu", 0) or 0))

    def run(self) -> None:
        """Call the stage with the log file open, holding the job's GPUs as slots (esgrpo.workflow.gpu_slots;
        a no-op without ESGRPO_GPU_SLOTS)."""
        from esgrpo.workflow.gpu_slots import gpu_slots

        threads = self.kwargs["threads"]
        # More torch threads than cores is the biggest CPU trap here (docs/references.md): one per job.
        # Stages that need no torch (tables, figures, the ES norm theory) must not pay its import here,
        # so the setting goes to an already imported torch and, through OMP_NUM_THREADS, to a later one.
        os.environ["OMP_NUM_THREADS"] = str(threads)
        if "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        module, _, name = self.stage.partition(":")
        stage = getattr(importlib.import_module(module), name)
        handle = _open_log(self.log_path) if self.log_path else None
        with contextlib.ExitStack() as stack:
            if handle:
                stack.enter_context(handle)
                handle.write(_attempt_header(self.stage))
                stack.enter_context(contextlib.redirect_stdout(handle))
                stack.enter_context(contextlib.redirect_stderr(handle))
                logging.basicConfig(stream=handle, level=logging.INFO, force=True)
            devices = stack.enter_context(gpu_slots(self.gpus))
            if devices is not None:
                print(f"GPU slots: CUDA_VISIBLE_DEVICES={','.join(devices)}", flush=True)
            try:
                stage(**self.kwargs)
            except Exception:
                traceback.print_exc()
                raise


def _open_log(path: str):
    """The job's log for appending, holding every earlier attempt's lines. Snakemake deletes a job's log
    before each attempt (a retry, a requeue, the copy a new driver submits after a dead one); `path` is a
    hard link of the hidden `.<name>.attempts` beside it, which outlives that, and each attempt appends
    (what a killed or cancelled job printed is how it is diagnosed). Without hard links: this attempt only."""
    log = Path(path)
    keep = log.with_name(f".{log.name}.attempts")
    keep.parent.mkdir(parents=True, exist_ok=True)
    keep.touch()
    with contextlib.suppress(OSError):  # FileExistsError: Snakemake left it (or it is the link already)
        os.link(keep, log)
    return open(log, "a", buffering=1)


def _attempt_header(stage: str) -> str:
    """The line that opens each attempt's part of a job log: when, where, which SLURM job (and requeue)."""
    where = f"{socket.gethostname()} pid {os.getpid()}"
    if os.environ.get("SLURM_JOB_ID"):
        where += f", SLURM job {os.environ['SLURM_JOB_ID']}"
        if os.environ.get("SLURM_RESTART_COUNT"):
            where += f" (requeued {os.environ['SLURM_RESTART_COUNT']}x)"
    return f"===== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} {stage} on {where} =====\n"


def run_stage(smk, stage: str) -> None:
    """Run `stage` ("module:function") with the job's arguments: in a child of this run's job server
    when there is one on this host (esgrpo.workflow.job_server), else in this process."""
    from esgrpo.workflow import job_server

    call = StageCall.from_snakemake(smk, stage)
    address = job_server.server_address()
    code = job_server.submit(call, address) if address else None
    if code is None:
        code = _run_here(call)
    if code != 0:
        where = f"; see {call.log_path}" if call.log_path else ""
        print(f"stage {stage} failed{where}", file=sys.stderr)
        sys.exit(code)


def _run_here(call: StageCall) -> int:
    try:
        call.run()
    except Exception:
        return 1
    return 0
