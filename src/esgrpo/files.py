"""Atomic file writes and JSON-lines helpers: nothing half-written survives a kill.

A file or a folder is written under a temporary name beside its target, synced to disk, renamed over
the target, and the parent folder synced: after a kill or a power loss the target is the old one or
the new one, whole (the rename alone orders nothing: without the syncs it may land before the data).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp creates 0600; outputs are shared files, so give them the usual umask mode.
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync(path.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def fsync(path: str | os.PathLike) -> None:
    """Sync one file or folder (its entries: a rename into it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike, prefix: str | None = None) -> Iterator[Path]:
    """Yield a temporary folder beside `path` (its name starts with `prefix`, default ".<name>."); on
    success every file and folder in it is synced, it replaces `path` whole and the parent is synced;
    on an exception it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}." if prefix is None else prefix))
    tmp.chmod(0o777 & ~_umask())  # mkdtemp makes 0700; a checkpoint is a shared output
    try:
        yield tmp
        for folder, _, files in os.walk(tmp, topdown=False):
            for name in files:
                if not os.path.islink(os.path.join(folder, name)):
                    fsync(os.path.join(folder, name))
            fsync(folder)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
        fsync(path.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def _default(obj: Any) -> Any:
    # numpy / torch scalars and paths reach us from Snakemake params and metrics.
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, (Path, set)):
        return str(obj) if isinstance(obj, Path) else sorted(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=_default) + "\n"


def write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, dumps(obj))


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as handle:
        return json.load(handle)


def write_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, sort_keys=True, default=_default) + "\n" for r in rows))


def append_jsonl(path: str | os.PathLike, row: dict) -> None:
    """Append one row; a torn last line from a kill is dropped by `read_jsonl`."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps(row, sort_keys=True, default=_default) + "\n")
        handle.flush()


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    return list(iter_jsonl(path))


def iter_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    with open(path) as handle:
        for number, line in enumerate(handle, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                # Only a torn final line (a kill mid-write) is tolerated.
                if handle.readline() == "":
                    return
                raise ValueError(f"{path}: line {number} is not valid JSON: {err}") from err

