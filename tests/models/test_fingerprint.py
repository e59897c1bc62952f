"""The base fingerprint: exact numbers (weights hash) and statistical ones (scores with CIs) of a built base."""

from __future__ import annotations

import json

import pytest
import torch

from esgrpo.estimators import pass_at_k_curve
from esgrpo.files import read_json
from esgrpo.models.default import TinyLlamaSpec, build_tiny_llama, train_tokenizer
from esgrpo.models.fingerprint import compare_to_reference, task_scores, weights_sha256
from esgrpo.models.loading import save_model
from esgrpo.tasks.offline import load_sum_yesno, worked_solution
from tests.conftest import REPO

SPEC = TinyLlamaSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                     num_key_value_heads=1)


@pytest.fixture(scope="module")
def tokenizer():
    rows = load_sum_yesno("train", 40, 0)
    return train_tokenizer([r["prompt"][-1]["content"] + " " + worked_solution(r) for r in rows], 300)


def test_weights_hash_is_the_same_for_the_same_weights_and_moves_with_one_value(tokenizer, tmp_path):
    for name in ("a", "b"):
        save_model(build_tiny_llama(tokenizer, SPEC, seed=0), tokenizer, tmp_path / name)
    assert weights_sha256(tmp_path / "a") == weights_sha256(tmp_path / "b")  # two builds, two files
    model = build_tiny_llama(tokenizer, SPEC, seed=0)
    with torch.no_grad():
        model.model.norm.weight[0] += 1e-6
    save_model(model, tokenizer, tmp_path / "c")
    assert weights_sha256(tmp_path / "c") != weights_sha256(tmp_path / "a")
    save_model(build_tiny_llama(tokenizer, SPEC, seed=1), tokenizer, tmp_path / "d")
    assert weights_sha256(tmp_path / "d") != weights_sha256(tmp_path / "a")


def _prompt_rows(task: str, counts: list[int], n: int = 8) -> list[dict]:
    return [{"eval_task": task, "n": n, "correct": c, "greedy_correct": c > n // 2} for c in counts]


def test_task_scores_are_the_evaluations_means_with_a_ci_over_prompts():
    counts = [0, 1, 3, 8, 8, 2, 0, 5, 6, 7]
    scores = task_scores(_prompt_rows("t", counts) + _prompt_rows("u", [8] * 4), ks=[1, 4])
    curve = pass_at_k_curve(counts, 8, [1, 4])
    assert scores["t"]["n_prompts"] == 10
    for name, expected in (("greedy", 0.5), ("pass@1", curve[1]), ("pass@4", curve[4])):
        mean, lo, hi = scores["t"][name]
        assert mean == pytest.approx(expected, abs=1e-6) and lo < mean < hi
    assert scores["u"]["pass@1"] == [1.0, 1.0, 1.0]  # every prompt solved: no spread


def _fingerprint(sha: str, pass1: list[float]) -> dict:
    return {"settings": {"build": {"seed": 0}, "eval": {"n_samples": 8}}, "weights_sha256": sha,
            "tasks": {"t": {"n_prompts": 10, "pass@1": pass1}}}


def test_comparison_identical_equivalent_different_or_not_comparable():
    ours = _fingerprint("aa", [0.40, 0.30, 0.50])
    assert compare_to_reference(ours, _fingerprint("aa", [0.40, 0.30, 0.50]))["verdict"] == "identical"
    assert compare_to_reference(ours, _fingerprint("bb", [0.45, 0.35, 0.55]))["verdict"] == "statistically equivalent"
    far = compare_to_reference(ours, _fingerprint("bb", [0.60, 0.50, 0.70]))
    assert far["verdict"] == "different" and far["outside_ci"] == ["t pass@1: reference 0.600 outside ours [0.300, 0.500]"]
    other = {**_fingerprint("aa", [0.40, 0.30, 0.50]), "settings": {"build": {"seed": 1}, "eval": {"n_samples": 8}}}
    assert compare_to_reference(ours, other)["verdict"].startswith("not comparable")


def test_fingerprint_stage_on_a_tiny_built_model(tmp_path):
    """The workflow's three stages on a few rows: build (warm-up), evaluate, fingerprint; rerunning the
    build gives the same hash, and the fingerprint against itself as reference says identical."""
    from esgrpo.files import write_json, write_jsonl
    from esgrpo.workflow.stages.evaluation import evaluate_checkpoint
    from esgrpo.workflow.stages.models import build_default_model, write_base_fingerprint

    rows = load_sum_yesno("train", 24, 0)
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_jsonl(tmp_path / "test.jsonl", load_sum_yesno("test", 6, 0))
    write_json(tmp_path / "info.json", {"verifier": "yesno"})
    params = {"tasks": ["sum_yesno"], "seed": 0, "vocab_size": 300,
              "architecture": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                               "num_attention_heads": 2, "num_key_value_heads": 1},
              "warmup": {"steps_max": 2, "batch_size": 8, "check_every": 2, "dev_size": 4, "max_new_tokens": 8}}
    data = {"train": [str(tmp_path / "train.jsonl")], "info": [str(tmp_path / "info.json")]}
    for build in ("base", "again"):
        build_default_model(data, {"model": str(tmp_path / build / "model"), "info": str(tmp_path / build / "build.json")},
                            params, {"model": "tiny"}, 1)
    eval_params = {"eval": {"n_samples": 4, "ks": [1, 4], "max_new_tokens": 8, "test_size": None},
                   "model": str(tmp_path / "base" / "model"), "eval_tasks": ["sum_yesno"], "run": "base",
                   "train_task": "none"}
    evaluate_checkpoint({"test": [str(tmp_path / "test.jsonl")], "info": data["info"]},
                        {"summary": str(tmp_path / "eval.json"), "prompts": str(tmp_path / "prompts.jsonl")},
                        eval_params, {"model": "tiny"}, 1)
    inputs = {"model": str(tmp_path / "base" / "model"), "build": str(tmp_path / "base" / "build.json"),
              "eval": str(tmp_path / "eval.json"), "prompts": str(tmp_path / "prompts.jsonl"),
              "reference": str(REPO / "docs" / "base_reference.json")}
    write_base_fingerprint(inputs, {"fingerprint": str(tmp_path / "fingerprint.json")}, {}, {"model": "tiny"}, 1)
    fingerprint = read_json(tmp_path / "fingerprint.json")
    assert fingerprint["weights_sha256"] == weights_sha256(tmp_path / "again" / "model")
    assert fingerprint["warmup_steps"] == 2 and list(fingerprint["warmup_dev_accuracy"]) == ["2"]
    assert set(fingerprint["tasks"]["sum_yesno"]) == {"n_prompts", "greedy", "pass@1", "pass@4"}
    assert fingerprint["machine"]["cpu"] and fingerprint["machine"]["matmul_gflops"] > 0
    assert fingerprint["reference"]["verdict"].startswith("not comparable")  # the committed reference: other settings
    (tmp_path / "self.json").write_text(json.dumps({k: v for k, v in fingerprint.items() if k != "reference"}))
    write_base_fingerprint({**inputs, "reference": str(tmp_path / "self.json")},
                           {"fingerprint": str(tmp_path / "again.json")}, {}, {"model": "tiny"}, 1)
    assert read_json(tmp_path / "again.json")["reference"]["verdict"] == "identical"


def test_committed_reference_is_a_default_build_fingerprint():
    """docs/base_reference.json: the embedded default's build, the numbers the README tells users to compare."""
    import yaml

    reference = read_json(REPO / "docs" / "base_reference.json")
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    # the build's settings as the job saw them (schema defaults filled in): the config's entries are among them
    build = reference["settings"]["build"]
    assert config["default_model"]["warmup"].items() <= build["warmup"].items()
    assert config["default_model"]["architecture"].items() <= build["architecture"].items()
    assert build["tasks"] == config["models"]["tiny"]["eval_tasks"]
    assert build["train_tasks"] == config["models"]["tiny"]["tasks"]
    assert set(reference["tasks"]) == set(config["models"]["tiny"]["eval_tasks"])
    assert len(reference["weights_sha256"]) == 64 and reference["warmup_steps"] > 0
