"""GPU slots on a workstation: each GPU job gets its own CUDA_VISIBLE_DEVICES.

Snakemake's `gpu` resource only counts GPUs (``--resources gpu=4`` lets at most four GPU jobs
run at once); it never says *which* GPU a job should use, so two jobs would both land on GPU 0.
Set ``ESGRPO_GPU_SLOTS`` to the devices the workflow may use and every stage that declares
``gpu: n`` takes n free slots before it starts::

    ESGRPO_GPU_SLOTS=0,1,2,3 snakemake --cores all --resources gpu=4 --configfile=configs/paper_b.yaml

A slot is an exclusive `flock` on ``<lock dir>/gpu<id>.lock`` (``ESGRPO_GPU_LOCK_DIR``, default
``<tmp>/esgrpo-gpu-slots-<uid>``): the kernel drops it when the holder exits, even on SIGKILL, so
a crashed job never leaks its GPU. A job that finds too few free slots waits (``--resources gpu=N``
keeps that rare). Without ``ESGRPO_GPU_SLOTS`` nothing happens: on SLURM the scheduler already sets
CUDA_VISIBLE_DEVICES for each job.

The stage entry (`esgrpo.workflow.bridge.run_stage`) wraps the stage in ``gpu_slots(resources.gpu)``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import time
from collections.abc import Iterator, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

SLOTS_ENV = "ESGRPO_GPU_SLOTS"
LOCK_DIR_ENV = "ESGRPO_GPU_LOCK_DIR"


def parse_slots(spec: str) -> list[str]:
    """``"0,1,3"`` -> ``["0", "1", "3"]`` (device ids or UUIDs, as CUDA_VISIBLE_DEVICES takes them)."""
    slots = [s.strip() for s in spec.split(",") if s.strip()]
    if len(set(slots)) != len(slots):
        raise ValueError(f"{SLOTS_ENV}={spec!r} names a device twice")
    for slot in slots:
        if not all(c.isalnum() or c in "-_:" for c in slot):
            raise ValueError(f"{SLOTS_ENV}={spec!r}: {slot!r} is not a device id")
    return slots


def default_lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"esgrpo-gpu-slots-{os.getuid()}"


@dataclass
class SlotLease:
    """Slots held by this process; `release` (or process exit) frees them."""

    devices: list[str]
    _handles: list = field(default_factory=list, repr=False)

    def release(self) -> None:
        for handle in self._handles:
            with contextlib.suppress(OSError):
                fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        self._handles.clear()


def _try_lock(path: Path):
    handle = open(path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")  # who holds it, for people looking at the folder
    handle.flush()
    return handle


def acquire(n: int, slots: Sequence[str], lock_dir: str | os.PathLike | None = None,
            timeout: float | None = None, poll: float = 2.0) -> SlotLease:
    """Take `n` free slots out of `slots`, waiting (up to `timeout` seconds; None = forever).

    All or nothing: a partial grab is given back before waiting, so two jobs wanting two GPUs
    each on a three-GPU box cannot deadlock holding one each.
    """
    if n < 1:
        raise ValueError(f"asked for {n} GPU slots; must be >= 1")
    if n > len(slots):
        raise ValueError(f"a job wants {n} GPUs but {SLOTS_ENV} offers {len(slots)}: {list(slots)}")
    folder = Path(lock_dir) if lock_dir is not None else default_lock_dir()
    folder.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        lease = SlotLease(devices=[])
        for slot in slots:
            handle = _try_lock(folder / f"gpu{slot}.lock")
            if handle is not None:
                lease.devices.append(slot)
                lease._handles.append(handle)
                if len(lease.devices) == n:
                    return lease
        lease.release()
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"no {n} free GPU slots among {list(slots)} within {timeout} s ({folder})")
        time.sleep(poll)


@contextlib.contextmanager
def gpu_slots(n: int, env: MutableMapping[str, str] | None = None, lock_dir: str | os.PathLike | None = None,
              timeout: float | None = None, poll: float = 2.0) -> Iterator[list[str] | None]:
    """Hold `n` GPU slots and point CUDA_VISIBLE_DEVICES at them for the duration.

    A no-op (yields None) when `n` is 0 or ``ESGRPO_GPU_SLOTS`` is unset. Must run before CUDA
    is initialised in this process (importing torch is fine; touching a CUDA tensor is not).
    """
    env = os.environ if env is None else env
    spec = env.get(SLOTS_ENV, "")
    if not n or not spec.strip():
        yield None
        return
    lock_dir = lock_dir if lock_dir is not None else env.get(LOCK_DIR_ENV) or None
    lease = acquire(int(n), parse_slots(spec), lock_dir, timeout=timeout, poll=poll)
    previous = env.get("CUDA_VISIBLE_DEVICES")
    env["CUDA_VISIBLE_DEVICES"] = ",".join(lease.devices)
    try:
        yield list(lease.devices)
    finally:
        if previous is None:
            env.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            env["CUDA_VISIBLE_DEVICES"] = previous
        lease.release()
