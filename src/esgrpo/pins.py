"""Pinned inputs: a task's files and a model's revision, checked by their SHA-256 before any job uses them.

A task may name the file each split is read from and its checksum (`tasks.<task>.files.<split>: {path,
sha256}`, with `tasks.<task>.revision` the Hub dataset commit the files are read at); a model may name a
Hub revision and the checksums of its files (`models.<model>.revision`, `models.<model>.sha256`). A file
whose hash is not the pinned one stops the job with one line naming the file, the expected and the found
hash (PinError). Paper B's code pins the same things: GSM8K's two Parquet files by SHA-256 and
Qwen2.5-1.5B-Instruct's revision, whose weights' hash its reference records (configs/paper_b.yaml).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

__all__ = ["PinError", "check_sha256", "model_snapshot_folder", "pinned_model_folder", "pinned_split_file",
           "sha256_of"]


class PinError(ValueError):
    """A pinned file whose content is not the pinned one (or that is missing)."""


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_sha256(path: str | Path, expected: str, key: str) -> None:
    """PinError (one line: the file, the expected and the found hash, the config key) unless `path`
    hashes to `expected`."""
    if not Path(path).is_file():
        raise PinError(f"{path}: pinned file not found (expected sha256 {expected}; {key})")
    found = sha256_of(path)
    if found != expected.lower():
        raise PinError(f"{path}: sha256 {found}, expected {expected} ({key})")


def pinned_split_file(task: str, split: str, pin: Mapping, source: str | None, hub_id: str | None,
                      revision: str | None) -> str:
    """The local file a split is read from, its checksum checked: `pin["path"]` inside `source` (a
    folder), or `source` itself (a file; `{split}` in it becomes the split), or else `pin["path"]` fetched
    from the Hub dataset `hub_id` at `revision` (None: the Hub's default branch, the hash still checked)."""
    if source is not None:
        base = Path(str(source).replace("{split}", split)).expanduser()
        path = base / pin["path"] if base.is_dir() else base
    elif hub_id is None:
        raise PinError(f"tasks.{task}.files.{split}: this task has no Hub dataset to fetch {pin['path']} from; "
                       f"set tasks.{task}.source to a local copy")
    else:
        from huggingface_hub import hf_hub_download

        path = Path(hf_hub_download(hub_id, pin["path"], repo_type="dataset", revision=revision))
    if pin.get("sha256"):
        check_sha256(path, pin["sha256"], f"tasks.{task}.files.{split}.sha256")
    return str(path)


def model_snapshot_folder(source: str, revision: str) -> Path:
    """Where huggingface_hub keeps `source` at commit `revision` (its cache layout), known before any
    download, so that the workflow can name it in the jobs' params."""
    from huggingface_hub.constants import HF_HUB_CACHE

    return Path(HF_HUB_CACHE) / f"models--{source.replace('/', '--')}" / "snapshots" / revision


def pinned_model_folder(model: str, source: str, revision: str | None, sha256: Mapping[str, str]) -> Path:
    """A model's folder at its pinned revision (fetched from the Hub unless `source` is a folder), each
    file named in `sha256` checked."""
    folder = Path(source).expanduser()
    if not folder.is_dir():
        if revision is None:
            raise PinError(f"models.{model}.sha256: a Hub model's files are pinned at a revision; "
                           f"set models.{model}.revision")
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(source, revision=revision))
    for name, expected in sorted(sha256.items()):
        check_sha256(folder / name, expected, f"models.{model}.sha256.{name}")
    return folder
