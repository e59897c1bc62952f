"""One results folder per grid: the folder a config writes to, and the record that keeps two grids apart.

Every output of a config lives under its `results_dir` (schemas/config.schema.yaml). Each shipped
config names its own (`results/default` for config.yaml, `results/ci`, `results/paper_a`, ...); a
config without the key writes to `results/<its file's name>` (`default_results_dir`).

Two configs in one folder would mix their runs, and Snakemake would rerun one grid's jobs over the
other's (their params differ). So the first run that executes jobs in a folder writes
`{folder}/grid.json`: which config it came from (the files and `--config` arguments), its settings and
their fingerprint. Every later parse (`snakemake -n` included) compares, before any job runs:

- the same settings (whatever config file holds them): the folder is theirs;
- the same config, edited (the same files and `--config` arguments): the folder is still its own, and
  Snakemake's params trigger reruns what the edit changed, as for any config; the record is rewritten;
- another config with other settings: `GridError`, naming the keys that differ and what to do.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from esgrpo.files import read_json, write_json

GRID_RECORD = "grid.json"
# How many differing keys the clash message names (the record holds them all).
SHOWN_DIFFERENCES = 3


class GridError(ValueError):
    """A config that would write into another grid's folder."""


def results_folder(results_dir: str | None, configfiles: Sequence[str | Path]) -> str:
    """The config's `results_dir` (normalised), else `results/<name of the last config file>`, else
    `results/default` (the embedded config.yaml). A name shared by two config files is no risk: the grid
    record stops the second if its settings differ."""
    if results_dir is None:
        return f"results/{Path(configfiles[-1]).stem}" if configfiles else "results/default"
    folder = os.path.normpath(results_dir)
    if folder in (".", ".."):
        raise GridError(f"results_dir: {results_dir!r} is the working directory or above it; "
                        f"name a folder of its own, such as results/{Path(configfiles[-1]).stem if configfiles else 'mine'}")
    return folder


def grid_settings(config: dict[str, Any]) -> dict[str, Any]:
    """What decides a grid's outputs: the config (defaults filled) less its folder, as JSON values."""
    return json.loads(json.dumps({k: v for k, v in config.items() if k != "results_dir"}, default=str))


def fingerprint(config: dict[str, Any]) -> str:
    text = json.dumps(grid_settings(config), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _portable(path: str | Path) -> str:
    """`path` relative to the working directory where it lies under it (so that a moved or renamed
    checkout, or a copied results folder, still names the same file), else absolute."""
    path = Path(path).absolute()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def config_source(configfiles: Sequence[str | Path], config_args: Sequence[str] | None,
                  embedded: str | Path) -> dict[str, list[str]]:
    """Which config a run reads: its files (relative to the working directory where they lie under it;
    the embedded default when none) and `--config` arguments."""
    files = [_portable(f) for f in configfiles] or [_portable(embedded)]
    return {"configfiles": files, "config_args": [str(a) for a in config_args or []]}


def _same_source(recorded: dict[str, list[str]], source: dict[str, list[str]]) -> bool:
    """Whether a record's source is `source` (a record of absolute paths, as written before they were
    relative, compares by the paths they name)."""
    files = [_portable(f) for f in recorded.get("configfiles", [])]
    return files == source["configfiles"] and recorded.get("config_args", []) == source["config_args"]


def _differences(old: Any, new: Any, key: str = "") -> list[str]:
    """`key: old -> new` for every leaf that differs (dotted keys)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new), key=str):
            missing = "(absent)"
            out += _differences(old.get(k, missing), new.get(k, missing), f"{key}.{k}" if key else str(k))
        return out
    if old == new:
        return []

    def short(value: Any) -> str:
        text = value if value == "(absent)" else json.dumps(value)
        return text if len(text) <= 40 else text[:37] + "..."

    return [f"{key}: {short(old)} -> {short(new)}"]


def _names(source: dict[str, list[str]]) -> str:
    """The config files as recorded (paths, not bare names: two config.yaml of two checkouts differ)."""
    files = list(source.get("configfiles", []))
    return " + ".join(files + [f"--config {a}" for a in source.get("config_args", [])]) or "?"


def check_grid_folder(folder: str, config: dict[str, Any], source: dict[str, list[str]]) -> bool:
    """Whether `config` (read from `source`) may write into `folder`: True when the folder's grid record
    must be written (no record yet, or this config's own record with changed settings), False when the
    record already says so. GridError when the folder is another grid's or nests in one."""
    for parent in Path(folder).parents:
        if (parent / GRID_RECORD).exists():
            raise GridError(f"results_dir {folder}: inside the folder of another grid ({parent}); "
                            f"set results_dir to a folder outside it")
    nested = sorted(str(p.parent) for p in Path(folder).glob(f"*/{GRID_RECORD}"))
    if nested:
        raise GridError(f"results_dir {folder}: holds the folders of other grids ({', '.join(nested)}); "
                        f"set results_dir to a folder beside them")
    path = Path(folder) / GRID_RECORD
    if not path.exists():
        return True
    try:
        record = read_json(path)
        recorded, settings = record["fingerprint"], record["settings"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise GridError(f"{path}: not a grid record ({err}); delete it to let this config take the folder") from None
    if recorded == fingerprint(config):
        return False
    if _same_source(record.get("source") or {}, source):
        return True
    diff = _differences(settings, grid_settings(config))
    more = f" and {len(diff) - SHOWN_DIFFERENCES} more" if len(diff) > SHOWN_DIFFERENCES else ""
    raise GridError(f"results_dir {folder} holds the grid of {_names(record.get('source') or {})}, and this "
                    f"config ({_names(source)}) has other settings ({'; '.join(diff[:SHOWN_DIFFERENCES])}{more}): "
                    f"set results_dir to a folder of its own, or delete {path} to rerun this folder "
                    f"with the new settings")


def write_grid_record(folder: str, config: dict[str, Any], source: dict[str, list[str]]) -> None:
    """`{folder}/grid.json`: the config's source, settings and fingerprint (written when jobs start)."""
    write_json(Path(folder) / GRID_RECORD, {"fingerprint": fingerprint(config), "source": source,
                                            "settings": grid_settings(config)})
