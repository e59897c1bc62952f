"""Held-out benchmarks through lm-evaluation-harness (esgrpo.evaluation.heldout): MMLU and IFEval on tiny local
copies in the Hub datasets' schemas (tests/data/lm_eval) through the workflow, lm-eval's output read into
per-prompt rows, NLTK's Punkt model from a package, and the held-out table and claims reading them."""

from __future__ import annotations

import copy
import json

import nltk
import pandas as pd
import pytest
import yaml

from esgrpo.evaluation import heldout
from esgrpo.files import read_json, read_jsonl, write_jsonl
from esgrpo.report import stats
from tests.conftest import REPO, results_of, run_workflow
from tests.report.synthetic import CONFIG, build, make_results

DATA = REPO / "tests" / "data" / "lm_eval"
IFEVAL_METRICS = ["prompt_level_strict_acc", "inst_level_strict_acc", "prompt_level_loose_acc",
                  "inst_level_loose_acc"]
BENCHMARKS = {
    "mmlu": {"tasks": ["mmlu_astronomy", "mmlu_high_school_mathematics"], "metrics": ["acc"], "num_fewshot": 1,
             "dataset_path": str(DATA / "mmlu")},
    "ifeval": {"tasks": ["ifeval"], "metrics": IFEVAL_METRICS, "apply_chat_template": True,
               "gen_kwargs": {"max_gen_toks": 16}, "dataset_path": str(DATA / "ifeval")},
}


@pytest.fixture(autouse=True)
def fewer_bootstrap_replicates(monkeypatch):
    monkeypatch.setattr(stats, "N_BOOT", 200)


# --- settings and checkpoints ----------------------------------------------------------------------

def test_benchmark_settings_inherit_block_then_eval_then_defaults():
    config = {"eval": {"dtype": "bfloat16", "device": "cuda", "seed": 3},
              "heldout_benchmarks": {"backend": "vllm", "batch_size": "auto", "benchmarks": {
                  "mmlu": {"tasks": ["mmlu"], "metrics": ["acc"], "num_fewshot": 5},
                  "ifeval": {"tasks": ["ifeval"], "metrics": ["prompt_level_strict_acc"], "backend": "hf"}}}}
    mmlu = heldout.benchmark_settings(config, "mmlu")
    ifeval = heldout.benchmark_settings(config, "ifeval")
    assert (mmlu["backend"], mmlu["batch_size"], mmlu["dtype"], mmlu["device"]) == ("vllm", "auto", "bfloat16", "cuda")
    assert (mmlu["num_fewshot"], mmlu["seed"], mmlu["dataset_path"], mmlu["name"]) == (5, 3, None, "mmlu")
    assert ifeval["backend"] == "hf" and ifeval["num_fewshot"] is None
    assert heldout.model_args(mmlu, "/ckpt") == {"pretrained": "/ckpt", "dtype": "bfloat16"}
    assert heldout.model_args(ifeval, "/ckpt")["device"] == "cuda"


def test_checkpoints_are_the_base_and_each_continual_sequence_end():
    config = copy.deepcopy(CONFIG)
    config["heldout_benchmarks"] = {"benchmarks": BENCHMARKS}
    assert heldout.heldout_checkpoints(config, "tiny") == [
        ("base", "base"), ("sum_yesno", "cl_es-s0-k2"), ("sum_yesno", "cl_es-s1-k2"),
        ("sum_yesno", "cl_grpo-s0-k2"), ("sum_yesno", "cl_grpo-s1-k2")]
    files = heldout.heldout_files(config, "r")
    assert "r/tiny/base/heldout/mmlu.json" in files and "r/tiny/sum_yesno/cl_grpo-s1-k2/heldout/ifeval.json" in files
    assert len(files) == 5 * 2
    # a one-task sequence ends at stage 1, the main run itself; base only; no block: nothing
    config["sequential"]["continual"] = ["countdown3"]
    assert ("countdown3", "es-n4-s0") in heldout.heldout_checkpoints(config, "tiny")
    config["heldout_benchmarks"]["checkpoints"] = ["base"]
    assert heldout.heldout_checkpoints(config, "tiny") == [("base", "base")]
    assert heldout.heldout_checkpoints(CONFIG, "tiny") == []


def test_wrapper_group_points_tasks_and_groups_at_the_local_copy():
    settings = heldout.benchmark_settings({"heldout_benchmarks": {"benchmarks": {
        "mmlu": {"tasks": ["mmlu", "mmlu_astronomy"], "metrics": ["acc"], "dataset_path": str(DATA / "mmlu")}}}},
        "mmlu")
    group = heldout.wrapper_group(settings, groups={"mmlu"})
    local = str((DATA / "mmlu").resolve())
    assert group["task"] == [{"group": "mmlu", "dataset_path": local}, {"task": "mmlu_astronomy", "dataset_path": local}]
    assert group["aggregate_metric_list"] == [{"metric": "acc", "weight_by_size": True}]
    hub = heldout.wrapper_group({**settings, "dataset_path": None}, groups={"mmlu"})
    assert hub["task"] == [{"group": "mmlu"}, {"task": "mmlu_astronomy"}]  # the Hub: lm-eval's configs untouched


# --- lm-eval's output -> rows ----------------------------------------------------------------------

def _lm_eval_output(strict: list[bool], reported: float) -> dict:
    """The parts of lm-eval's simple_evaluate output that summarise reads, for IFEval-like samples."""
    samples = [{"doc_id": i, "prompt_level_strict_acc": s, "inst_level_strict_acc": [s, True],
                "prompt_level_loose_acc": True, "inst_level_loose_acc": [True, True]} for i, s in enumerate(strict)]
    results = {"esgrpo_heldout_ifeval": {"prompt_level_strict_acc,none": reported,
                                         "prompt_level_strict_acc_stderr,none": 0.1,
                                         "inst_level_strict_acc,none": 0.8, "prompt_level_loose_acc,none": 1.0,
                                         "inst_level_loose_acc,none": 1.0},
               "ifeval": {"prompt_level_strict_acc,none": reported, "inst_level_strict_acc,none": 0.8,
                          "prompt_level_loose_acc,none": 1.0, "inst_level_loose_acc,none": 1.0}}
    return {"results": results, "samples": {"ifeval": samples[::-1]}, "n-shot": {"ifeval": 0},
            "versions": {"ifeval": 4.0}, "lm_eval_version": "0.4.13"}


def test_summarise_gives_one_row_per_prompt_and_checks_lm_evals_aggregate():
    settings = {"name": "ifeval", "metrics": IFEVAL_METRICS}
    summary, rows = heldout.summarise(_lm_eval_output([True, False, False, True], 0.5), settings)
    assert summary["metrics"] == {"prompt_level_strict_acc": 0.5, "inst_level_strict_acc": 0.8,
                                  "prompt_level_loose_acc": 1.0, "inst_level_loose_acc": 1.0}
    assert summary["headline"] == "prompt_level_strict_acc" and summary["n_prompts"] == 4
    assert [r["id"] for r in rows] == ["ifeval:0", "ifeval:1", "ifeval:2", "ifeval:3"]  # sorted by doc id
    assert [r["greedy_correct"] for r in rows] == [True, False, False, True]
    assert [r["correct"] for r in rows] == [1, 0, 0, 1] and {r["n"] for r in rows} == {1}
    assert rows[1]["prompt_level_loose_acc"] == 1.0 and "inst_level_strict_acc" not in rows[1]  # lists stay out
    # rows whose mean is not what lm-eval reports are not its rows
    with pytest.raises(ValueError, match="lm-eval reports 0.75"):
        heldout.summarise(_lm_eval_output([True, False, False, True], 0.75), settings)
    # the headline must be one 0/1 value per prompt
    with pytest.raises(ValueError, match="not 0/1"):
        heldout.summarise(_lm_eval_output([True] * 4, 1.0), {**settings, "metrics": ["inst_level_strict_acc"]})


def test_punkt_model_from_the_package_is_what_nltk_and_ifeval_load(tmp_path, monkeypatch):
    """NLTK's PunktTokenizer loads the written model and splits as the package's own tokenizer does
    (abbreviations kept); lm-eval's IFEval module finds it and downloads nothing."""
    import importlib

    import punkt

    monkeypatch.setattr(nltk, "download", lambda *a, **k: pytest.fail(f"nltk.download{a} called"))
    with heldout.punkt_from_package() as root:
        assert sorted(p.name for p in (root / "tokenizers" / "punkt_tab" / "english").iterdir()) == [
            "abbrev_types.txt", "collocations.tab", "ortho_context.tab", "sent_starters.txt"]
        text = "Mr. Smith left at 5 p.m. on Jan. 3. Dr. Jones stayed in the U.S. for a week. It rained."
        ours = nltk.tokenize.PunktTokenizer("english").tokenize(text)
        assert ours == punkt.PunktSentenceTokenizer(punkt.load_model("english")).tokenize(text)
        assert len(ours) == 3
        from lm_eval.tasks.ifeval import instructions_util

        importlib.reload(instructions_util)  # its import-time check: punkt_tab found, no download
        instructions_util._get_sentence_tokenizer.cache_clear()
        assert instructions_util.count_sentences(text) == 3
    assert str(root) not in nltk.data.path


# --- the held-out table and claims ---------------------------------------------------------------

def _write_benchmark_rows(config: dict, results, scores: dict[str, float]) -> None:
    """Synthetic per-prompt rows (heldout_bench's schema) for every checkpoint: base correct on the first
    60% of 20 prompts, a final stage on the first `scores[method]` fraction."""
    for task, run in heldout.heldout_checkpoints(config, "tiny"):
        fraction = 0.6 if run == "base" else scores[run.split("-")[0]]
        directory = heldout.checkpoint_dir(str(results), "tiny", task, run)
        rows = [{"model": "tiny", "run": run, "train_task": "none" if run == "base" else task, "eval_task": "mmlu",
                 "id": f"mmlu_astronomy:{i}", "n": 1, "correct": int(i < 20 * fraction),
                 "greedy_correct": i < 20 * fraction, "lm_eval_task": "mmlu_astronomy", "lm_eval_metric": "acc"}
                for i in range(20)]
        write_jsonl(f"{directory}/heldout/mmlu_prompts.jsonl", rows)


def test_heldout_table_and_claims_read_benchmark_rows(tmp_path):
    """Every toy task trained in the sequence: the claims read only the benchmark (ES forgets 40 points:
    does not hold; GRPO gains: holds); a_heldout shows the benchmark's before / after / change."""
    config = copy.deepcopy(CONFIG)
    config["sequential"]["continual"] = list(config["models"]["tiny"]["tasks"])
    config["heldout_benchmarks"] = {"benchmarks": {"mmlu": BENCHMARKS["mmlu"]}}
    analysis = make_results(tmp_path, config=config)
    _write_benchmark_rows(config, tmp_path / "results", {"cl_es": 0.2, "cl_grpo": 0.8})
    claims = pd.read_csv(build(tmp_path, "claims", analysis, config=config)["csv"]).set_index("id")
    es, grpo = claims.loc["a_heldout_es"], claims.loc["a_heldout_grpo"]
    assert es["estimate"] == pytest.approx(-0.4) and es["verdict"] == "does not hold"
    assert grpo["estimate"] == pytest.approx(0.2) and grpo["verdict"] == "holds"
    assert es["budget"].endswith("held-out tasks mmlu")
    table = pd.read_csv(build(tmp_path, "a_heldout", analysis, config=config)["csv"])
    mmlu = table[(table["eval_task"] == "mmlu") & (table["method"] == "ES")].set_index("quantity")
    assert set(mmlu["metric"]) == {"lm-eval acc"} and bool(mmlu["held_out"].all())
    assert mmlu.loc["before (base)", "value"] == pytest.approx(0.6)
    assert mmlu.loc["after - before", "value"] == pytest.approx(-0.4)
    # without the benchmark every task is trained: not measured, never the trained tasks
    del config["heldout_benchmarks"]
    root = tmp_path / "none"
    claims = pd.read_csv(build(root, "claims", make_results(root, config=config), config=config)["csv"])
    assert claims.set_index("id").loc["a_heldout_es", "verdict"] == "not measured"


# --- through the workflow --------------------------------------------------------------------------

TINY_WORKFLOW = {
    "seed": 0,
    "tasks": {"sum_yesno": {"train_size": 24, "test_size": 6}},
    "models": {"tiny": {"source": "default", "tasks": ["sum_yesno"]}},
    "default_model": {"vocab_size": 300,
                      "architecture": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                                       "num_attention_heads": 2, "num_key_value_heads": 1},
                      "warmup": {"steps_max": 2, "batch_size": 8, "check_every": 2, "dev_size": 4,
                                 "max_new_tokens": 8}},
    "eval": {"n_samples": 2, "ks": [1, 2], "test_size": 6, "max_new_tokens": 8},
    "es": {"population_sizes": [2], "seeds": [0],
           "settings": {"sigma": 0.01, "alpha": 0.005, "iterations": 1, "prompts_per_iteration": 4,
                        "max_new_tokens": 8, "checkpoint_every": 1}},
    "sequential": {"continual": ["sum_yesno"], "continual_methods": ["es"]},
    "heldout_benchmarks": {"batch_size": 8, "benchmarks": BENCHMARKS},
}


@pytest.mark.slow
def test_mmlu_and_ifeval_through_the_workflow(tmp_path):
    """lm-eval's MMLU (two subjects, one-shot) and IFEval (its own checkers) on the local copies, for the
    base and the end of the continual sequence, and the a_heldout table with their rows."""
    configfile = tmp_path / "config.yaml"
    configfile.write_text(yaml.safe_dump(TINY_WORKFLOW))
    folder = results_of(configfile)  # results/config: the file's name (no results_dir in it)
    results = tmp_path / folder
    targets = [str(p) for p in heldout.heldout_files(TINY_WORKFLOW, folder)]
    run_workflow(tmp_path, configfile, [*targets, f"{folder}/tables/a_heldout.csv"])
    assert len(targets) == 4  # base and es-n2-s0 (stage 1 of a one-task sequence) x 2 benchmarks
    for name, n_prompts in (("mmlu", 7), ("ifeval", 4)):
        for directory in ("tiny/base", "tiny/sum_yesno/es-n2-s0"):
            summary = read_json(results / directory / "heldout" / f"{name}.json")
            rows = read_jsonl(results / directory / "heldout" / f"{name}_prompts.jsonl")
            assert summary["lm_eval_version"] == "0.4.13" and summary["n_prompts"] == n_prompts == len(rows)
            assert summary["provenance"]["lm_eval_version"] == "0.4.13"
            headline = summary["metrics"][summary["headline"]]
            assert headline == pytest.approx(sum(r["correct"] for r in rows) / n_prompts)
    mmlu = read_json(results / "tiny/base/heldout/mmlu.json")
    assert mmlu["n_shot"]["mmlu_astronomy"] == 1 and set(mmlu["per_task"]) == {"mmlu_astronomy",
                                                                                 "mmlu_high_school_mathematics"}
    ifeval = read_json(results / "tiny/base/heldout/ifeval.json")
    assert set(ifeval["metrics"]) == set(IFEVAL_METRICS)
    assert [r["id"] for r in read_jsonl(results / "tiny/base/heldout/ifeval_prompts.jsonl")] == [
        f"ifeval:{i}" for i in range(4)]
    table = pd.read_csv(results / "tables" / "a_heldout.csv")
    bench = table[table["eval_task"].isin(["mmlu", "ifeval"])]
    assert set(bench["metric"]) == {"lm-eval acc", "lm-eval prompt_level_strict_acc"}
    assert bool(bench["held_out"].all()) and not bool(table[table["eval_task"] == "sum_yesno"]["held_out"].any())
    before = bench[(bench["eval_task"] == "mmlu") & (bench["quantity"] == "before (base)")]["value"].iloc[0]
    assert before == pytest.approx(mmlu["metrics"]["acc"])
    print(json.dumps({n: read_json(results / f"tiny/base/heldout/{n}.json")["metrics"] for n in ("mmlu", "ifeval")}))
