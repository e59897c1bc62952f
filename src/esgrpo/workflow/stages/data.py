"""Stage: materialise a task's train and test rows as JSON lines."""

from __future__ import annotations

from esgrpo.files import read_jsonl, write_json, write_jsonl
from esgrpo.pins import pinned_split_file
from esgrpo.provenance import provenance
from esgrpo.tasks.registry import get_task


def prepare_task(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    task = get_task(wildcards["task"])
    options = dict(params["options"])
    source = options.pop("source", None)
    revision, files = options.pop("revision", None), options.pop("files", None) or {}
    seed = int(params["seed"])
    sizes = {"train": options.pop("train_size", None), "test": options.pop("test_size", None)}
    used = list(params.get("splits", task.splits))
    counts = {}
    for split in ("train", "test"):
        rows = []
        if split in used:
            split_source = source
            if split in files:  # a pinned file, its checksum checked first (esgrpo.pins)
                split_source = pinned_split_file(task.name, split, files[split], source, task.hub_ids.get(split),
                                                 revision)
            kwargs = {"source": split_source} if split_source else {}
            rows = task.loader(split, sizes[split], seed, **kwargs, **options)
            if not rows:
                raise ValueError(f"task {task.name!r} gave no {split} rows (options {params['options']})")
        write_jsonl(output[split], rows)
        counts[split] = len(rows)
    overlap = ({r["id"] for r in read_jsonl(output["train"])} & {r["id"] for r in read_jsonl(output["test"])})
    if overlap:
        raise ValueError(f"task {task.name!r}: {len(overlap)} rows are in both train and test")
    write_json(output["info"], {"task": task.name, "verifier": task.verifier, "rows": counts, "splits": used,
                                "provenance": provenance(params, seed)})


def load_rows(path: str, limit: int | None = None) -> list[dict]:
    rows = read_jsonl(path)
    return rows if limit is None else rows[:limit]
