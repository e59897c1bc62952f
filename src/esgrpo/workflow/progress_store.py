"""A training run's progress folder kept in the workflow's default storage (S3, GCS, ...: any Snakemake storage
plugin; docs/cluster.md, "Kubernetes and cloud batch").

Under a default storage provider Snakemake moves a job's declared outputs, after the job succeeds. The progress
folder (esgrpo.progress) is not a declared output, so that a failed job keeps it; without a shared filesystem it
would stay on the node or pod that ran the killed job. So the training job mirrors it itself:

- before training, the stored folder is fetched into the (empty) local one;
- while training, a thread looks at the local folder every few seconds and stores what changed: the run's files
  (run.json, metrics) and each new whole checkpoint (its state file written: STATE_FILES), whose marker
  `<name>.stored` is stored after its files, and removes the checkpoints the trainer removed. A checkpoint fetched is one whose marker is there: a job
  killed while storing leaves a checkpoint without marker, never a partial one that a resume would read.

rules/config.smk names the provider and the prefix at parse time (ENV); the job reads the provider's settings
(endpoint, keys) from the environment variables Snakemake's storage plugins read (SNAKEMAKE_STORAGE_S3_*, ...).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from dataclasses import fields
from pathlib import Path
from typing import Any

from esgrpo.progress import LOCK_NAME

ENV = "ESGRPO_PROGRESS_STORE"
MARKER = ".stored"
_SKIPPED_PREFIX = ".tmp-"  # esgrpo.progress's checkpoints and locks being written
# A checkpoint's last file: ES writes state.json before the folder takes its name (esgrpo.progress), TRL writes
# trainer_state.json last (esgrpo.grpo.trainer._complete). Stored last, and the marker only once it is there.
STATE_FILES = ("state.json", "trainer_state.json")


def store_setting(provider: str | None, prefix: str | None) -> str | None:
    """ENV's value for a run with this default storage provider and prefix; None without one."""
    if not provider:
        return None
    return json.dumps({"provider": provider, "prefix": (prefix or "").rstrip("/")})


def _signature(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


class ProgressStore:
    """The progress folder `folder` (relative to the working directory) in storage, under `prefix/folder`."""

    def __init__(self, folder: str | os.PathLike, provider: str, prefix: str, interval: float = 5.0):
        from snakemake_interface_storage_plugins.registry import StoragePluginRegistry

        plugin = StoragePluginRegistry().get_plugin(provider)
        values = {f.name: os.environ[plugin.get_envvar(f.name)] for f in fields(plugin.settings_cls)
                  if f.metadata.get("env_var") and plugin.get_envvar(f.name) in os.environ}
        self._scratch = Path(tempfile.mkdtemp(prefix="esgrpo-progress-store-"))
        self.provider = plugin.storage_provider(local_prefix=self._scratch, logger=_Logger(),
                                                settings=plugin.settings_cls(**values))
        self.folder = Path(folder)
        self.base = f"{prefix}/{self.folder.as_posix()}"
        self.interval = interval
        self._stored: dict[str, tuple[int, int]] = {}  # name relative to the folder -> what was stored
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @classmethod
    def from_env(cls, folder: str | os.PathLike) -> ProgressStore | None:
        """The store ENV names for `folder`, or None when the workflow has no default storage provider."""
        setting = os.environ.get(ENV)
        if not setting:
            return None
        spec = json.loads(setting)
        return cls(folder, spec["provider"], spec["prefix"])

    def _object(self, name: str, local: Path):
        obj = self.provider.object(f"{self.base}/{name}")
        obj.set_local_path(local)
        return obj

    # -- fetch
    def fetch(self) -> list[str]:
        """The stored folder's run files and marked checkpoints into the local folder (left as it is when it
        already holds a checkpoint: this node's own progress is at least as new); the names fetched."""
        self.folder.mkdir(parents=True, exist_ok=True)
        if any(p.is_dir() and not p.name.startswith(_SKIPPED_PREFIX) for p in self.folder.iterdir()):
            return []
        stored = self._object("", self._scratch / "fetched")
        if not stored.exists():
            return []
        stored.retrieve_object()
        fetched = []
        root = self._scratch / "fetched"
        for path in sorted(root.iterdir()):
            if path.is_dir():
                if not (root / f"{path.name}{MARKER}").is_file():
                    continue  # stored partly: the job was killed while storing it
            elif path.name.endswith(MARKER) or path.name == LOCK_NAME:
                continue
            shutil.move(str(path), self.folder / path.name)
            fetched.append(path.name)
        shutil.rmtree(root, ignore_errors=True)
        for path in self.folder.rglob("*"):  # what came from storage is stored as it is now
            if path.is_file():
                self._stored[path.relative_to(self.folder).as_posix()] = _signature(path)
        for name in fetched:
            if (self.folder / name).is_dir():
                self._stored[f"{name}{MARKER}"] = (0, 0)
        return fetched

    # -- store
    def store(self) -> None:
        """Store what changed in the local folder since the last call; remove the checkpoints it no longer holds."""
        if not self.folder.is_dir():
            return
        entries = sorted(p for p in self.folder.iterdir()
                         if not p.name.startswith(_SKIPPED_PREFIX) and p.name != LOCK_NAME)
        for path in entries:
            if path.is_file():
                self._store_file(path)
        for path in entries:
            if path.is_dir():
                try:
                    files = sorted((f for f in path.rglob("*") if f.is_file()), key=lambda f: (f.name in STATE_FILES, f))
                except FileNotFoundError:  # removed by the trainer meanwhile
                    continue
                for file in files:
                    self._store_file(file)
                marker = f"{path.name}{MARKER}"
                whole = any(f.name in STATE_FILES and f.relative_to(self.folder).as_posix() in self._stored
                            for f in files)
                if marker not in self._stored and whole and path.is_dir():
                    local = self._scratch / marker
                    local.write_text("")
                    self._object(marker, local).store_object()
                    self._stored[marker] = (0, 0)
        present = {p.name for p in entries}
        for marker in [m for m in self._stored if m.endswith(MARKER) and m[: -len(MARKER)] not in present]:
            name = marker[: -len(MARKER)]
            self._object(marker, self._scratch / marker).remove()  # the marker first: never a partial checkpoint
            self._object(name, self._scratch / name).remove()
            for key in [k for k in self._stored if k == marker or k.startswith(f"{name}/")]:
                del self._stored[key]

    def _store_file(self, path: Path) -> None:
        name = path.relative_to(self.folder).as_posix()
        try:
            signature = _signature(path)
        except FileNotFoundError:  # removed by the trainer meanwhile
            return
        if self._stored.get(name) != signature:
            try:
                self._object(name, path).store_object()
            except Exception:
                if path.exists():
                    raise
                return  # an older checkpoint the trainer removed while it was being stored: the next pass drops it
            self._stored[name] = signature

    # -- while training
    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.store()
            except Exception as error:  # raised in the training thread on exit
                self._error = error
                return

    def __enter__(self) -> ProgressStore:
        self.fetch()
        self._thread = threading.Thread(target=self._loop, name="progress-store", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        shutil.rmtree(self._scratch, ignore_errors=True)
        if self._error is not None and exc[0] is None:
            raise RuntimeError(f"storing the progress folder {self.folder} under {self.base} failed: "
                               f"{self._error}") from self._error


class _Logger:
    """The storage plugins' logger argument: their messages go to the job's log."""

    def _log(self, message: Any, *args: Any, **kwargs: Any) -> None:
        print(f"progress store: {message}", flush=True)

    debug = info = warning = error = _log
