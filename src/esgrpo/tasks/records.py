"""The records of one dataset split, from the Hugging Face Hub or a local copy, read so that they fail well.

A malformed record stops the loader with a ``DatasetFormatError`` naming the file (or Hub split), the
row (and, in a JSON-lines file, its line) and what is wrong: a line that is not JSON, a missing field,
a value of the wrong type. Local JSON and JSON-lines files are parsed here, line by line, because
`datasets` reports a broken line as "An error occurred while generating the dataset" and nothing more;
the Hub, folders, Parquet and CSV files go through ``datasets.load_dataset``, whose underlying error
(e.g. pandas' "Expected 2 fields in line 3, saw 3") is passed on with the file's name.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What a field may hold (`require`); bool counts as a number only where listed.
TEXT = (str,)
ANSWER = (str, int, float)  # a gold answer: its str() is the gold
INTEGER = (int,)
LIST = (list,)
MAPPING = (dict,)

_JSON_SUFFIXES = (".json", ".jsonl")
_DATASETS_BUILDERS = {".parquet": "parquet", ".csv": "csv"}


class DatasetFormatError(ValueError):
    """A dataset (Hub split or local file) a loader cannot use; the message names where and what is wrong."""


@dataclass(frozen=True)
class Origin:
    """Where a split's records came from, to name one of them in an error."""

    name: str  # a file or folder path, or "<hub id> (<config>) split '<split>'"
    lines: tuple[int, ...] = ()  # the line of each record, for JSON-lines files

    def __str__(self) -> str:
        return self.name

    def row(self, index: int) -> str:
        """'<name>: row <index>' (0-based, as in the row ids), with the file line where known."""
        line = f" (line {self.lines[index]})" if index < len(self.lines) else ""
        return f"{self.name}: row {index}{line}"


def load_records(hub_id: str, config: str | None, hub_split: str,
                 source: str | None) -> tuple[list[dict], Origin]:
    """Records of one Hub split, or of the local file or folder standing in for it (`source`; ``{split}``
    in it becomes the Hub split's name)."""
    if source is None:
        name = hub_id + (f" ({config})" if config else "") + f" split {hub_split!r}"
        return _load_with_datasets(Origin(name), hub_id, config, split=hub_split)
    path = Path(str(source).replace("{split}", hub_split)).expanduser()
    if path.is_dir():
        return _load_with_datasets(Origin(str(path)), str(path), split=hub_split)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file or folder (source for {hub_id} {hub_split!r})")
    suffix = path.suffix.lower()
    if suffix in _JSON_SUFFIXES:
        return read_json_records(path)
    if suffix in _DATASETS_BUILDERS:
        # A lone file has no split names: datasets calls its rows "train".
        return _load_with_datasets(Origin(str(path)), _DATASETS_BUILDERS[suffix], data_files=str(path),
                                   split="train")
    raise ValueError(f"{path}: unsupported file type; use one of {sorted([*_JSON_SUFFIXES, *_DATASETS_BUILDERS])}")


def _load_with_datasets(origin: Origin, *args: Any, **kwargs: Any) -> tuple[list[dict], Origin]:
    from datasets import load_dataset
    from datasets.exceptions import DatasetGenerationError

    try:
        dataset = load_dataset(*args, **kwargs)
    except DatasetGenerationError as err:  # its own message says only that generating failed
        raise DatasetFormatError(f"{origin}: cannot be read: {str(err.__cause__ or err).strip()}") from err
    return [dict(record) for record in dataset], origin


def read_json_records(path: Path) -> tuple[list[dict], Origin]:
    """The objects of a JSON array, or of a JSON-lines file (one object a line; blank lines skipped)."""
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    if data.lstrip()[:1] == b"[":
        records, origin = _parse_json(data, path), Origin(str(path))
        if not isinstance(records, list):  # e.g. two arrays one after the other
            raise DatasetFormatError(f"{path}: holds a JSON {type(records).__name__}, not an array of objects")
    else:
        records, lines = [], []
        for number, line in enumerate(data.split(b"\n"), start=1):
            if line.strip():
                records.append(_parse_json(line, path, number))
                lines.append(number)
        origin = Origin(str(path), tuple(lines))
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise DatasetFormatError(f"{origin.row(index)} is a JSON {type(record).__name__}, not an object of fields")
    return records, origin


def _parse_json(data: bytes, path: Path, first_line: int = 1) -> Any:
    try:
        return json.loads(data)
    except json.JSONDecodeError as err:
        raise DatasetFormatError(f"{path}: line {first_line + err.lineno - 1} is not valid JSON: {err.msg} "
                                 f"(column {err.colno})") from None
    except UnicodeDecodeError as err:
        line = first_line + data[:err.start].count(b"\n")
        raise DatasetFormatError(f"{path}: line {line} is not UTF-8 text ({err.reason})") from None


def require(records: Sequence[Mapping], fields: Mapping[str, tuple[type, ...]], origin: Origin,
            optional: Mapping[str, tuple[type, ...]] | None = None) -> None:
    """Stop at the first record that lacks one of `fields` or holds a value of another type than listed
    for it; `optional` fields are type-checked where present. Runs before any row is built."""
    kinds_of = {**fields, **(optional or {})}
    for index, record in enumerate(records):
        # Through datasets, a file whose rows differ gets a column of nulls: None counts as missing.
        missing = [name for name in fields if record.get(name) is None]
        if missing:
            present = sorted(name for name, value in record.items() if value is not None)
            raise DatasetFormatError(f"{origin.row(index)} lacks field(s) {missing}; it has {present}")
        for name, kinds in kinds_of.items():
            value = record.get(name)
            if value is not None and not _is_a(value, kinds):
                allowed = " or ".join(kind.__name__ for kind in kinds)
                raise DatasetFormatError(f"{origin.row(index)}: {name!r} must be {allowed}, "
                                         f"got {type(value).__name__} {_shorten(value)}")


def is_integer(value: Any) -> bool:
    """An int that is not a bool (JSON true is no number of a Countdown problem)."""
    return _is_a(value, INTEGER)


def _is_a(value: Any, kinds: tuple[type, ...]) -> bool:
    return isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool))


def _shorten(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."
