"""Pinned inputs (esgrpo.pins): a task's files and a model's files are checked by SHA-256 before use, and a
mismatch stops the job with one line naming the file, the expected and the found hash."""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import yaml

from esgrpo.config import ConfigError, check_config
from esgrpo.files import read_json, read_jsonl
from esgrpo.pins import PinError, check_sha256, model_snapshot_folder, pinned_model_folder
from esgrpo.workflow.stages.data import prepare_task
from tests.conftest import REPO


def _gsm8k_folder(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A local copy in GSM8K's schema, laid out as paper B's pinned files are (main/<split>.jsonl)."""
    hashes = {}
    for split, n in (("train", 12), ("test", 5)):
        path = tmp_path / "gsm8k" / "main" / f"{split}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"question": f"{split} question {i}?", "answer": f"so\n#### {i}"}) + "\n"
                                for i in range(n)), encoding="utf-8")
        hashes[split] = hashlib.sha256(path.read_bytes()).hexdigest()
    return tmp_path / "gsm8k", hashes


def _prepare(tmp_path: Path, options: dict) -> dict:
    out = {s: str(tmp_path / "out" / f"{s}.jsonl") for s in ("train", "test")} | {"info": str(tmp_path / "out" / "info.json")}
    Path(out["info"]).parent.mkdir(exist_ok=True)
    prepare_task({}, out, {"options": options, "seed": 0}, {"task": "gsm8k"}, 1)
    return out


def test_pinned_task_files_are_read_when_their_hashes_match(tmp_path):
    folder, hashes = _gsm8k_folder(tmp_path)
    files = {s: {"path": f"main/{s}.jsonl", "sha256": h} for s, h in hashes.items()}
    out = _prepare(tmp_path, {"source": str(folder), "files": files})
    assert [r["answer"] for r in read_jsonl(out["test"])] == ["0", "1", "2", "3", "4"]
    assert len(read_jsonl(out["train"])) == 12
    assert read_json(out["info"])["provenance"]  # the pins are part of the recorded params


def test_a_changed_task_file_stops_the_job_with_one_line(tmp_path):
    folder, hashes = _gsm8k_folder(tmp_path)
    with (folder / "main" / "test.jsonl").open("a", encoding="utf-8") as handle:  # one more row upstream
        handle.write(json.dumps({"question": "new?", "answer": "#### 9"}) + "\n")
    found = hashlib.sha256((folder / "main" / "test.jsonl").read_bytes()).hexdigest()
    files = {s: {"path": f"main/{s}.jsonl", "sha256": h} for s, h in hashes.items()}
    with pytest.raises(PinError) as err:
        _prepare(tmp_path, {"source": str(folder), "files": files})
    message = str(err.value)
    assert "\n" not in message
    assert message == (f"{folder / 'main' / 'test.jsonl'}: sha256 {found}, expected {hashes['test']} "
                       "(tasks.gsm8k.files.test.sha256)")
    # a source that is the file itself ({split} in its name) is checked the same way
    with pytest.raises(PinError, match=f"sha256 {found}, expected {hashes['test']}"):
        _prepare(tmp_path, {"source": str(folder / "main" / "{split}.jsonl"), "files": files})


def test_a_pinned_model_folder_is_checked_file_by_file(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    right = hashlib.sha256(b"weights").hexdigest()
    assert pinned_model_folder("m", str(model), None, {"model.safetensors": right}) == model
    wrong = "0" * 64
    with pytest.raises(PinError) as err:
        pinned_model_folder("m", str(model), None, {"model.safetensors": wrong})
    assert str(err.value) == f"{model / 'model.safetensors'}: sha256 {right}, expected {wrong} (models.m.sha256.model.safetensors)"
    with pytest.raises(PinError, match="pinned file not found"):
        check_sha256(model / "absent.bin", right, "models.m.sha256.absent.bin")
    with pytest.raises(PinError, match="revision"):  # a Hub model's files need the revision they are read at
        pinned_model_folder("m", "org/name", None, {"model.safetensors": right})


def test_a_pinned_revision_names_its_folder_in_huggingface_s_cache():
    folder = model_snapshot_folder("Qwen/Qwen2.5-1.5B-Instruct", "989aa7980e4cf806f80c7fef2b1adb7bc71aa306")
    assert folder.parts[-3:] == ("models--Qwen--Qwen2.5-1.5B-Instruct", "snapshots",
                                 "989aa7980e4cf806f80c7fef2b1adb7bc71aa306")


def test_the_config_checks_the_pins():
    import jsonschema

    config = yaml.safe_load((REPO / "configs" / "paper_b.yaml").read_text())
    schema = yaml.safe_load((REPO / "schemas" / "config.schema.yaml").read_text())
    jsonschema.validate(config, schema)
    check_config(copy.deepcopy(config))
    # paper B's pins: GSM8K's two files and Qwen2.5-1.5B-Instruct's revision and weights
    assert {s: f["sha256"][:8] for s, f in config["tasks"]["gsm8k"]["files"].items()} == {"train": "ea82612e",
                                                                                           "test": "ee7b8da9"}
    assert config["models"]["qwen2_5_1_5b"]["revision"].startswith("989aa798")
    bad = copy.deepcopy(config)
    bad["tasks"]["gsm8k"]["files"]["test"]["sha256"] = "not-a-hash"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)
    bad = copy.deepcopy(config)
    bad["tasks"]["gsm8k"]["files"]["validation"] = {"path": "x.parquet"}
    with pytest.raises(ConfigError, match=r"tasks\.gsm8k\.files: \['validation'\] are not splits"):
        check_config(bad)
    bad = copy.deepcopy(config)
    del bad["tasks"]["gsm8k"]["files"]
    bad["tasks"]["gsm8k"]["revision"] = "abc"
    with pytest.raises(ConfigError, match=r"tasks\.gsm8k\.revision: .*files"):
        check_config(bad)
    bad = copy.deepcopy(config)
    del bad["models"]["qwen2_5_1_5b"]["revision"]
    with pytest.raises(ConfigError, match=r"models\.qwen2_5_1_5b\.sha256: .*revision"):
        check_config(bad)


def test_the_pin_model_stage_records_the_checked_files_and_stops_on_a_mismatch(tmp_path):
    from esgrpo.workflow.stages.models import pin_model

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    right = hashlib.sha256(b"weights").hexdigest()
    params = {"source": str(model), "revision": None, "sha256": {"model.safetensors": right.upper()}}
    pin = tmp_path / "pin.json"
    pin_model({}, {"pin": str(pin)}, params, {"model": "m"}, 1)
    record = read_json(pin)
    assert record["folder"] == str(model) and record["sha256"] == {"model.safetensors": right}
    (model / "model.safetensors").write_bytes(b"other weights")
    with pytest.raises(PinError, match=f"expected {right.upper()}"):
        pin_model({}, {"pin": str(tmp_path / "again.json")}, params, {"model": "m"}, 1)
    assert not (tmp_path / "again.json").exists()
