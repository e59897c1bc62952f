"""Safetensors files written and read one tensor at a time, so a multi-GB model is exported or
checkpointed without a second full copy of it in host memory.

- `write_shards(items, folder, stem)`: (name, tensor) pairs, in order, into ``{stem}.safetensors``
  (one shard) or ``{stem}-0000i-of-0000n.safetensors`` plus ``{stem}.safetensors.index.json`` (the
  sharded layout transformers and vLLM load). Each tensor is moved to the host as it arrives and a
  shard is written as soon as it is full: the host holds at most one shard (``max_shard_bytes``, or
  one tensor larger than that).
- `TensorFiles(folder)`: the tensors of a folder's safetensors files, each read on demand from the
  memory-mapped file; `local_model_dir` finds the folder of a Hub id in the local cache.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

__all__ = ["DEFAULT_SHARD_BYTES", "TensorFiles", "local_model_dir", "write_shards"]

# 2 GiB: a 7B fp32 export is 14 shards; one shard is what the host holds beside the model.
DEFAULT_SHARD_BYTES = 2 * 1024**3


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def write_shards(items: Iterable[tuple[str, torch.Tensor]], folder: str | os.PathLike, stem: str = "model",
                 max_shard_bytes: int = DEFAULT_SHARD_BYTES, metadata: dict[str, str] | None = None) -> list[str]:
    """Write the tensors into `folder` shard by shard (see the module docstring); returns their names in order.

    A tensor is copied to the host (contiguous, its own storage: safetensors refuses shared ones) only
    when it is reached, so a generator of GPU tensors never has more than a shard on the host.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shards: list[tuple[Path, list[str]]] = []
    pending: dict[str, torch.Tensor] = {}
    pending_bytes, names = 0, []

    def flush() -> None:
        nonlocal pending, pending_bytes
        path = folder / f".{stem}-{len(shards) + 1:05d}.partial"
        save_file(pending, str(path), metadata=metadata)
        shards.append((path, list(pending)))
        pending, pending_bytes = {}, 0

    for name, tensor in items:
        if name in pending or name in names:
            raise ValueError(f"tensor {name} given twice")
        host = tensor.detach().to("cpu").contiguous()
        if host.data_ptr() == tensor.data_ptr() or host.untyped_storage().nbytes() != _nbytes(host):
            host = host.clone()  # a view of a larger tensor, or the caller's own storage: a copy of its own
        if pending and pending_bytes + _nbytes(host) > max_shard_bytes:
            flush()
        pending[name] = host
        pending_bytes += _nbytes(host)
        names.append(name)
    if pending or not shards:
        flush()
    _name_shards(folder, stem, shards)
    return names


def _name_shards(folder: Path, stem: str, shards: list[tuple[Path, list[str]]]) -> None:
    """Give the written shards their final names; several shards get the index transformers reads."""
    if len(shards) == 1:
        shards[0][0].replace(folder / f"{stem}.safetensors")
        return
    weight_map, total = {}, 0
    for i, (path, names) in enumerate(shards, start=1):
        final = folder / f"{stem}-{i:05d}-of-{len(shards):05d}.safetensors"
        path.replace(final)
        weight_map.update({name: final.name for name in names})
        total += final.stat().st_size
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / f"{stem}.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))


class TensorFiles:
    """The tensors of the safetensors files in `folder` matching `pattern`, read one at a time.

    `get(name)` returns a CPU tensor of the file's dtype; files stay memory-mapped while the object
    lives, so reading a tensor copies that tensor only.
    """

    def __init__(self, folder: str | os.PathLike, pattern: str = "*.safetensors"):
        from safetensors import safe_open

        self.folder = Path(folder)
        files = sorted(self.folder.glob(pattern))
        if not files:
            raise FileNotFoundError(f"{self.folder}: no {pattern} files")
        self._handles = {path: safe_open(str(path), framework="pt") for path in files}
        self._where: dict[str, object] = {}
        for handle in self._handles.values():
            for name in handle.keys():
                if name in self._where:
                    raise ValueError(f"{self.folder}: tensor {name} is in two files")
                self._where[name] = handle

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def get(self, name: str) -> torch.Tensor:
        if name not in self._where:
            raise KeyError(f"{self.folder}: no tensor {name}")
        return self._where[name].get_tensor(name)


def local_model_dir(model_ref: str | os.PathLike, patterns: Sequence[str] = ("*.safetensors",)) -> Path:
    """`model_ref` if it is a folder, else the Hub snapshot holding `patterns` (cached, offline-friendly)."""
    source = Path(str(model_ref))
    if source.is_dir():
        return source
    if source.is_absolute() or str(model_ref).startswith(".") or str(model_ref).count("/") > 1:
        raise FileNotFoundError(f"{model_ref}: no such model folder (and not a Hub id)")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(model_ref), allow_patterns=list(patterns)))
