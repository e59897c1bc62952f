"""Progress folders of ES and GRPO runs: one writer, one run, whole checkpoints.

A trainer keeps what it needs to resume after a kill in its run's progress folder:

    progress_dir/writer.lock          who writes here now: host, pid, SLURM job (one writer at a time)
    progress_dir/run.json             the fingerprint of the run the checkpoints belong to
    progress_dir/<prefix>N/           numbered checkpoints (ES: step-00000004/, TRL: checkpoint-4/)

- `fingerprint`: a digest of what decides a run's trajectory (settings, rows, start weights); a
  folder holding another run's checkpoints is cleared on a fresh start, never resumed.
- `ProgressFolder.write_checkpoint`: a checkpoint is filled under a temporary name, synced and
  renamed (`esgrpo.files.atomic_directory`), so it exists whole or not at all (TRL writes its own and
  `esgrpo.grpo.trainer` checks them).
- `WriterLock`: a second trainer on a held folder stops with the folder and the holder named (two
  writers would interleave checkpoints: docs/cluster.md says to `scancel` old jobs before restarting
  a driver). A lock whose holder is gone (same host and its process is dead, the same SLURM job
  requeued, or a SLURM job squeue no longer knows) is taken over atomically.

Imports neither torch nor transformers at module level.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from esgrpo.files import atomic_directory, read_json, write_json

__all__ = ["LOCK_NAME", "ProgressFolder", "ProgressFolderLocked", "WriterLock", "fingerprint"]

LOCK_NAME = "writer.lock"
RUN_FILE = "run.json"
STATE_FILE = "state.json"
_TMP_PREFIX = ".tmp-"


# --------------------------------------------------------------------------- fingerprint


def fingerprint(description: Mapping[str, Any], tensors: Mapping[str, Any] | None = None) -> str:
    """A 128-bit digest of a run: its JSON description (sorted keys) and, if given, the bytes of tensors
    (e.g. the starting weights: another start model is another run), name by name in their order."""
    digest = hashlib.blake2b(digest_size=16)
    digest.update(json.dumps(description, sort_keys=True, default=str).encode())
    if tensors:
        import torch

        for name, value in tensors.items():
            digest.update(name.encode())
            # The raw bytes whatever the dtype (numpy has no bfloat16), one tensor at a time.
            digest.update(value.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


# --------------------------------------------------------------------------- the writer lock


class ProgressFolderLocked(RuntimeError):
    """Another trainer writes this progress folder."""


def _process_start(pid: int) -> str | None:
    """The start time (clock ticks since boot) of process `pid`, or None where /proc cannot say: with
    the pid it tells a live holder from a new process that reuses a dead holder's pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22, counted after the command name


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return started is None or _process_start(pid) in (None, started)


def _slurm_job_gone(job_id: str) -> bool:
    """True when SLURM says job `job_id` no longer runs; False when it does or SLURM cannot be asked."""
    if not shutil.which("squeue"):
        return False
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if out.returncode != 0:  # "Invalid job id specified": SLURM has forgotten a finished job
        return "invalid job id" in out.stderr.lower()
    return out.stdout.strip() in ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
                                  "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


# The lock files this process holds: [nesting depth, token]. One process is one writer: a stage may
# take the lock before starting its engines and the trainer take it again inside.
_HELD: dict[Path, list] = {}


class WriterLock:
    """`path/writer.lock`, naming this process as the folder's one writer (see the module docstring).

    The lock file appears whole (written aside, then hard-linked into place: linking fails when a
    lock exists, on every file system). Taking over a stale lock happens under a short-lived
    takeover file created exclusively, after re-reading that the stale lock is still in place,
    by an atomic rename over it: of several processes finding the same stale lock, one wins.
    """

    TAKEOVER_STALE_S = 60.0  # a takeover file older than this was left by a process killed mid-takeover

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "started": _process_start(os.getpid()),
                   "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "token": secrets.token_hex(8),
                   "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}

    # -- reading
    def holder(self) -> dict[str, Any] | None:
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return None
        except ValueError:  # unreadable: treat as held by an unknown writer
            return {"host": "?", "pid": -1, "token": "?"}

    @staticmethod
    def describe(holder: Mapping[str, Any]) -> str:
        job = f", SLURM job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
        return f"pid {holder.get('pid')} on host {holder.get('host')}{job}, since {holder.get('since', '?')}"

    def is_stale(self, holder: Mapping[str, Any]) -> bool:
        """Whether `holder` is gone: its process dead on this host, this very SLURM job (requeued), or a
        SLURM job that no longer runs. A live process elsewhere cannot be checked: it is not stale."""
        job = holder.get("slurm_job_id")
        if holder.get("host") == self.me["host"] and isinstance(holder.get("pid"), int) and holder["pid"] > 0:
            return not _alive(holder["pid"], holder.get("started"))
        if job and job == self.me["slurm_job_id"]:
            return True
        return bool(job) and _slurm_job_gone(job)

    # -- taking and giving back
    def acquire(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        key = self.path.resolve()
        if key in _HELD:  # this process holds it already
            _HELD[key][0] += 1
            return
        self._acquire()
        _HELD[key] = [1, self.me["token"]]

    def _acquire(self) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f"{_TMP_PREFIX}lock-")
        try:
            with os.fdopen(fd, "w") as handle:
                json.dump(self.me, handle)
            for _ in range(20):
                try:
                    os.link(tmp, self.path)
                    return
                except FileExistsError:
                    pass
                holder = self.holder()
                if holder is None:
                    continue  # released meanwhile: try again
                if not self.is_stale(holder):
                    raise ProgressFolderLocked(
                        f"{self.folder} is being written by another trainer ({self.describe(holder)}); two "
                        f"writers would interleave checkpoints. Stop that run first (scancel its SLURM job); "
                        f"if it is gone for certain, delete {self.path}")
                if self._take_over(holder, Path(tmp)):
                    return
        finally:
            Path(tmp).unlink(missing_ok=True)
        raise ProgressFolderLocked(f"{self.folder}: could not take {self.path} (it changed hands repeatedly)")

    def _take_over(self, stale: Mapping[str, Any], tmp: Path) -> bool:
        """Replace the stale lock by ours if it is still the one found stale; False: it changed, look again."""
        mutex = self.path.with_name(LOCK_NAME + ".takeover")
        try:
            os.close(os.open(mutex, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            try:
                if time.time() - mutex.stat().st_mtime > self.TAKEOVER_STALE_S:
                    mutex.unlink(missing_ok=True)
            except FileNotFoundError:
                pass
            time.sleep(0.05)
            return False
        try:
            current = self.holder()
            if current is None or current.get("token") != stale.get("token"):
                return False
            os.replace(tmp, self.path)
            return True
        finally:
            mutex.unlink(missing_ok=True)

    def release(self) -> None:
        key = self.path.resolve()
        depth_token = _HELD.get(key)
        if depth_token is None:
            return
        depth_token[0] -= 1
        if depth_token[0] > 0:
            return
        del _HELD[key]
        holder = self.holder()
        if holder is not None and holder.get("token") == depth_token[1]:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> WriterLock:
        """Hold the lock for a `with` block. SIGTERM (scancel, a SLURM time limit) then leaves through the
        block's cleanup, so the lock goes with the job instead of waiting to be found stale."""
        self.acquire()
        self._previous_sigterm = _NOT_SET
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous_sigterm is not _NOT_SET:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
        self.release()


_NOT_SET = object()


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


# --------------------------------------------------------------------------- the progress folder


class ProgressFolder:
    """A run's progress folder: numbered checkpoints `<prefix>N`, the run's fingerprint, one writer.

    Use as a context manager: entering takes the writer lock (unless `lock` is false: the other
    ranks of a multi-process launch, whose rank 0 holds it) and removes temporary debris a kill
    mid-checkpoint left behind; leaving gives the lock back.
    """

    def __init__(self, path: str | os.PathLike, prefix: str, lock: bool = True):
        self.path = Path(path)
        self.prefix = prefix
        self.lock = WriterLock(self.path) if lock else None

    def __enter__(self) -> ProgressFolder:
        self.path.mkdir(parents=True, exist_ok=True)
        if self.lock is not None:
            self.lock.__enter__()
        for debris in self.path.glob(f"{_TMP_PREFIX}*"):
            if debris.name.startswith(f"{_TMP_PREFIX}lock-"):
                continue  # another process's lock being written
            shutil.rmtree(debris) if debris.is_dir() else debris.unlink(missing_ok=True)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.lock is not None:
            self.lock.__exit__(*exc)

    # -- discovery
    def checkpoints(self) -> list[tuple[int, Path]]:
        """(step, folder) of every numbered checkpoint folder, oldest first."""
        found = []
        for path in self.path.glob(f"{self.prefix}*"):
            suffix = path.name[len(self.prefix):]
            if path.is_dir() and suffix.isdigit():
                found.append((int(suffix), path))
        return sorted(found)

    def holds(self, run_fingerprint: str) -> bool:
        """Whether the folder's checkpoints belong to the run with this fingerprint."""
        try:
            return read_json(self.path / RUN_FILE).get("fingerprint") == run_fingerprint
        except (OSError, ValueError, AttributeError):
            return False

    # -- writing
    def start_fresh(self, run_fingerprint: str, also: Sequence[str] = ()) -> None:
        """Clear every checkpoint (and the files named in `also`) and claim the folder for this run."""
        for _, path in self.checkpoints():
            shutil.rmtree(path, ignore_errors=True)
        for name in also:
            (self.path / name).unlink(missing_ok=True)
        write_json(self.path / RUN_FILE, {"fingerprint": run_fingerprint})

    def write_checkpoint(self, step: int, fill: Callable[[Path], None], state: Mapping[str, Any]) -> Path:
        """Checkpoint `step`: `fill(folder)` writes its tensors, then state.json; synced, renamed into
        place whole, and the older checkpoints removed (only the newest is needed)."""
        final = self.path / f"{self.prefix}{step:08d}"
        if not final.exists():  # a resumed run re-reaching a saved step would write the same bytes
            with atomic_directory(final, prefix=_TMP_PREFIX) as tmp:  # debris under this prefix is cleared
                fill(tmp)
                write_json(tmp / STATE_FILE, state)
        for older, path in self.checkpoints():
            if older < step:
                shutil.rmtree(path, ignore_errors=True)
        return final

    @staticmethod
    def read_state(checkpoint: Path) -> dict[str, Any]:
        return read_json(checkpoint / STATE_FILE)
