"""The analysis stages (esgrpo.workflow.stages.analysis) on tiny synthetic checkpoints with known deltas,
called directly with dicts, plus a dry run of every analysis target of the CI config."""

from __future__ import annotations

import json
import math
import zlib

import pandas as pd
import pytest
import torch
import yaml

from esgrpo.analysis import settings as analysis_settings
from esgrpo.analysis.interpolation import PathStates, interpolation_points
from esgrpo.analysis.kl import continuation_logits
from esgrpo.analysis.sparsity import sparsity_points
from esgrpo.engines.rollout import HFEngine
from esgrpo.evaluation.evaluate import EvalSettings, evaluate_rows
from esgrpo.files import read_json, write_json, write_jsonl
from esgrpo.models.default import TinyLlamaSpec, build_tiny_llama, train_tokenizer
from esgrpo.models.loading import load_model, save_model
from esgrpo.runs import IN_PLACE_DTYPE
from esgrpo.tasks.rewards import VERIFIERS
from esgrpo.workflow.stages import analysis as A
from esgrpo.workflow.stages.theory import THEORY_COLUMNS, theory_stage
from tests.conftest import REPO, run_workflow

TASKS = ("sum_yesno", "countdown3")
EVAL = {"n_samples": 2, "test_size": 4, "greedy": True, "max_new_tokens": 6, "temperature": 1.0, "top_p": 1.0,
        "seed": 0, "batch_size": 64, "ks": [1, 2]}
WC = {"model": "tiny", "task": "sum_yesno", "run": "es-n4-s0"}


def _parity(text: str, answer, meta) -> bool:
    """A grade that depends on the completion (random tiny models never solve a task)."""
    return zlib.crc32(text.encode()) % 2 == 0


@pytest.fixture(autouse=True)
def parity_verifier(monkeypatch):
    monkeypatch.setitem(VERIFIERS, "test_parity", _parity)


def _perturbed(model, scale: float, seed: int, names=None):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if names is None or name in names:
                p.add_(scale * torch.randn(p.shape, generator=g))
    return model


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """base, es (dense perturbation), grpo (perturbation of a few tensors), init (another start)
    checkpoints; task data with a completion-dependent verifier."""
    root = tmp_path_factory.mktemp("analysis")
    rows = {t: [{"id": f"{t}-{i}", "prompt": [{"role": "user", "content": f"Is {i}+{i + 1}={2 * i + (i % 2)}?"}],
                 "answer": "yes" if i % 2 == 1 else "no", "meta": {}} for i in range(6)] for t in TASKS}
    texts = [m["content"] for rs in rows.values() for r in rs for m in r["prompt"]] + [r["answer"] for rs in
                                                                                     rows.values() for r in rs]
    tokenizer = train_tokenizer(texts * 5, vocab_size=128)
    spec = TinyLlamaSpec(hidden_size=16, intermediate_size=24, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=256)
    paths = {}
    for name, scale, seed, names in (("base", 0.0, 0, None), ("es", 0.05, 1, None),
                                     ("grpo", 0.2, 2, ["model.layers.1.mlp.up_proj.weight",
                                                       "model.embed_tokens.weight"]),
                                     ("init", 0.03, 3, None), ("es2", 0.05, 4, None)):
        model = build_tiny_llama(tokenizer, spec, seed=0)
        _perturbed(model, scale, seed, names)
        paths[name] = str(root / name / "model")
        save_model(model, tokenizer, paths[name])
    data = {}
    for t, rs in rows.items():
        write_jsonl(root / "data" / t / "test.jsonl", rs)
        write_json(root / "data" / t / "info.json", {"verifier": "test_parity"})
        data[t] = (str(root / "data" / t / "test.jsonl"), str(root / "data" / t / "info.json"))
    return {"root": root, "data": data, **paths}


def _params(ref):
    return A.load_params(ref)


def _independent_eval(ref, task_paths, task):
    """Metrics of a checkpoint evaluated the plain way (its own model object)."""
    cfg = dict(EVAL)
    limit, batch = cfg.pop("test_size"), cfg.pop("batch_size")
    model, tok = load_model(ref)
    rows = [json.loads(line) for line in open(task_paths[0])][:limit]
    summary, _ = evaluate_rows(HFEngine(model, tok, batch), rows, "test_parity", EvalSettings(**cfg))
    return summary["greedy_accuracy"], summary["mean@2"]


# --------------------------------------------------------------------------- drift, theory, cosine


def test_drift_matches_hand_computation(ckpts, tmp_path):
    out = tmp_path / "drift.csv"
    params = {"base_model": ckpts["base"], "model": ckpts["es"], "init_model": ckpts["init"], "method": "es"}
    A.drift_stage({}, {"csv": str(out)}, params, WC, 1)
    df = pd.read_csv(out)
    assert list(df.columns) == A.DRIFT_COLUMNS
    base, es, init = _params(ckpts["base"]), _params(ckpts["es"]), _params(ckpts["init"])
    assert sorted(df["name"]) == sorted(base)  # tied lm_head appears once, as the embedding
    for r in df.itertuples():
        assert r.l2 == pytest.approx(float((es[r.name].double() - base[r.name].double()).norm()), rel=1e-12)
        assert r.base_l2 == pytest.approx(float(base[r.name].double().norm()), rel=1e-12)
        assert r.init_l2 == pytest.approx(float((es[r.name].double() - init[r.name].double()).norm()), rel=1e-12)
        assert r.numel == es[r.name].numel()
    assert set(df["method"]) == {"es"} and set(df["run"]) == {"es-n4-s0"}
    assert df.loc[df["name"] == "model.layers.1.mlp.up_proj.weight", "module_type"].item() == "mlp"
    assert df.loc[df["name"] == "model.layers.1.mlp.up_proj.weight", "layer"].item() == 1
    # A run started from the base: init_l2 is l2.
    A.drift_stage({}, {"csv": str(out)}, {**params, "init_model": ckpts["base"]}, WC, 1)
    df = pd.read_csv(out)
    assert (df["init_l2"] == df["l2"]).all()


def test_theory_from_synthetic_metrics(tmp_path):
    alpha, n, d = 0.01, 4, 10_000
    rows = [{"method": "es", "iteration": t, "updates": u, "distance_from_init": alpha * math.sqrt(u * d / n)}
            for t, u in ((1, 1), (2, 2), (3, 2), (4, 3), (5, 4))]
    write_jsonl(tmp_path / "metrics.jsonl", rows)
    write_json(tmp_path / "summary.json", {"trainable_parameters": d, "provenance": {"config": {
        "settings": {"alpha": alpha, "population_size": n, "normalization": "zscore"}}}})
    out = {"csv": str(tmp_path / "t.csv"), "json": str(tmp_path / "t.json")}
    theory_stage({"metrics": str(tmp_path / "metrics.jsonl"), "summary": str(tmp_path / "summary.json")},
                   out, {}, WC, 1)
    df = pd.read_csv(out["csv"])
    assert list(df.columns) == THEORY_COLUMNS
    assert df["updates"].tolist() == [1, 2, 2, 3, 4]
    assert df["theory_sq"].tolist() == pytest.approx([alpha**2 * u * d / n for u in df["updates"]])
    assert df["sq_distance"].tolist() == pytest.approx(df["theory_sq"].tolist())
    fit = read_json(out["json"])
    assert fit["slope_ratio_to_theory"] == pytest.approx(1.0) and fit["r2"] == pytest.approx(1.0)
    assert fit["final_ratio"] == pytest.approx(1.0) and fit["d"] == d


def test_cosine_stage(ckpts, tmp_path):
    out = tmp_path / "cos.csv"
    pairs = [{"pair": "es-grpo", "a": ckpts["es"], "b": ckpts["grpo"], "seed_b": 0},
             {"pair": "es-es", "a": ckpts["es"], "b": ckpts["es"], "seed_b": 1}]
    A.cosine_stage({}, {"csv": str(out)}, {"base_model": ckpts["base"], "pairs": pairs}, {**WC, "pair": "s0"}, 1)
    df = pd.read_csv(out)
    assert list(df.columns) == A.COSINE_COLUMNS
    base, es, grpo = _params(ckpts["base"]), _params(ckpts["es"]), _params(ckpts["grpo"])
    da = torch.cat([(es[k].double() - base[k].double()).ravel() for k in base])
    db = torch.cat([(grpo[k].double() - base[k].double()).ravel() for k in base])
    glob = df[(df["scope"] == "global") & (df["pair"] == "es-grpo")]
    assert glob["cosine"].item() == pytest.approx(float(da @ db / (da.norm() * db.norm())), rel=1e-9)
    same = df[df["pair"] == "es-es"]
    assert same["cosine"].astype(float).tolist() == pytest.approx([1.0] * len(same))
    assert {"layer", "module_type", "global"} == set(df["scope"])
    assert set(df.loc[df["scope"] == "layer", "key"]) == {"0", "1", "none"}


def test_run_start_of_an_in_place_run_is_the_training_jobs_bf16_copy(ckpts):
    """A run of a paper's arithmetic loads the base in bf16 (training stage); its start here is those values."""
    base = _params(ckpts["base"])
    loaded, _ = load_model(ckpts["base"], dtype=IN_PLACE_DTYPE)
    start = A.run_start(base, IN_PLACE_DTYPE)
    assert all(start[name].dtype == torch.float32 and torch.equal(start[name], p.detach().float())
               for name, p in loaded.named_parameters())
    assert any(not torch.equal(start[k], base[k]) for k in base)  # the rounding is there to leave out
    assert all(torch.equal(A.run_start(base)[k], base[k]) for k in base)


def test_in_place_runs_updates_are_measured_from_their_bf16_start(ckpts, tmp_path):
    """cosine (a_start_dtype), interpolation (es_start_dtype) and sparsity (start_dtype) of a run of a paper's
    arithmetic: its update is theta - bf16(base), not theta - base."""
    base, es, grpo = _params(ckpts["base"]), _params(ckpts["es"]), _params(ckpts["grpo"])
    start = {k: v.to(torch.bfloat16).float() for k, v in base.items()}
    d_in_place = torch.cat([(es[k].double() - start[k].double()).ravel() for k in base])
    d_exact = torch.cat([(es[k].double() - base[k].double()).ravel() for k in base])
    d_grpo = torch.cat([(grpo[k].double() - base[k].double()).ravel() for k in base])
    out = tmp_path / "cos.csv"
    pairs = [{"pair": "es-grpo", "a": ckpts["es"], "b": ckpts["grpo"], "seed_b": 0, "a_start_dtype": IN_PLACE_DTYPE}]
    A.cosine_stage({}, {"csv": str(out)}, {"base_model": ckpts["base"], "pairs": pairs},
                   {**WC, "pair": "arith_paper_a-s0"}, 1)
    glob = pd.read_csv(out).query("scope == 'global'")
    expected = float(d_in_place @ d_grpo / (d_in_place.norm() * d_grpo.norm()))
    assert glob["cosine"].item() == pytest.approx(expected, rel=1e-9) and glob["seed"].item() == 0
    assert expected != pytest.approx(float(d_exact @ d_grpo / (d_exact.norm() * d_grpo.norm())), rel=1e-6)

    test, info = ckpts["data"]["sum_yesno"]
    sp = tmp_path / "sp.csv"
    # the grpo checkpoint moved a few tensors from the base: from its bf16 copy, nearly every coordinate moved
    params = {"base_model": ckpts["base"], "model": ckpts["grpo"], "method": "es", "fractions": [1.0, 0.0],
              "eval": EVAL, "eval_tasks": ["sum_yesno"], "start_dtype": IN_PLACE_DTYPE}
    A.sparsity_stage({"test": [test], "info": [info]}, {"csv": str(sp)}, params, WC, 1)
    full = pd.read_csv(sp).query("kind == 'top_fraction' and keep_fraction == 1.0")
    from_start = sum(int((grpo[k] != start[k]).sum()) for k in base)
    assert full["n_changed"].item() == from_start > sum(int((grpo[k] != base[k]).sum()) for k in base)

    out = {"csv": str(tmp_path / "i.csv"), "json": str(tmp_path / "i.json")}
    params = {"base_model": ckpts["base"], "es_model": ckpts["es"], "grpo_model": ckpts["grpo"],
              "es_start_dtype": IN_PLACE_DTYPE, "eval_tasks": ["sum_yesno"], "eval": EVAL, "steps": 2,
              "multiples": [], "random_seed": 0}
    A.interpolation_stage({"test": [test], "info": [info]}, out, params,
                          {"model": "tiny", "task": "sum_yesno", "pair": "arith_paper_a-s0"}, 1)
    summary = read_json(out["json"])
    assert summary["norm_es"] == pytest.approx(float(d_in_place.norm()), rel=1e-9) and summary["seed"] == 0
    assert summary["cosine"] == pytest.approx(expected, rel=1e-9)


# --------------------------------------------------------------------------- sparsity


def test_sparsity_points_endpoints_are_the_two_models(ckpts):
    base, es = _params(ckpts["base"]), _params(ckpts["es"])
    points = {(p.kind, p.keep_fraction if p.kind == "top_fraction" else p.module_type): (p.fields(), p)
              for p in sparsity_points(base, es, [1.0, 0.5, 0.0])}
    full, point_full = points[("top_fraction", 1.0)]
    none, point_none = points[("top_fraction", 0.0)]
    assert point_full.key() == "theta" and point_none.key() == "theta0"
    assert all(torch.equal(point_full.state(base, es)[k], es[k]) for k in es)
    assert all(torch.equal(point_none.state(base, es)[k], base[k]) for k in base)
    assert full["n_kept"] == full["n_changed"] == sum(int((es[k] != base[k]).sum()) for k in es)
    assert none["n_kept"] == 0
    assert points[("top_fraction", 0.5)][0]["n_kept"] == round(0.5 * full["n_changed"])
    assert {m for kind, m in points if kind == "reset_module"} == {"embedding", "attention", "mlp", "norm"}


def test_sparsity_stage_keep_one_is_trained_keep_zero_is_base(ckpts, tmp_path):
    out = tmp_path / "sp.csv"
    test, info = ckpts["data"]["sum_yesno"]
    params = {"base_model": ckpts["base"], "model": ckpts["es"], "method": "es", "fractions": [1.0, 0.1, 0.0],
              "eval": EVAL, "eval_tasks": ["sum_yesno"]}
    A.sparsity_stage({"test": [test], "info": [info]}, {"csv": str(out)}, params, WC, 1)
    df = pd.read_csv(out)
    assert list(df.columns) == A.SPARSITY_COLUMNS
    assert (df["eval_task"] == "sum_yesno").all()
    assert df["kind"].tolist() == ["top_fraction"] * 3 + ["reset_module"] * 4
    top = df[df["kind"] == "top_fraction"].set_index("keep_fraction")
    trained = _independent_eval(ckpts["es"], ckpts["data"]["sum_yesno"], "sum_yesno")
    base = _independent_eval(ckpts["base"], ckpts["data"]["sum_yesno"], "sum_yesno")
    assert (top.loc[1.0, "greedy"], top.loc[1.0, "mean@n"]) == trained
    assert (top.loc[0.0, "greedy"], top.loc[0.0, "mean@n"]) == base
    assert trained != base  # the check above is not vacuous
    assert (df["n_samples"] == 2).all() and (df["n_prompts"] == 4).all()


# --------------------------------------------------------------------------- KL


def test_kl_base_to_itself_is_zero_and_positive_for_a_perturbed_model(ckpts, tmp_path):
    kl = {**analysis_settings.DEFAULTS["kl"], "n_prompts": 3, "samples_per_prompt": 2, "max_new_tokens": 6, "batch_size": 4}
    samples = []
    for task in TASKS:
        path = tmp_path / f"{task}.jsonl"
        A.base_samples_stage({"test": ckpts["data"][task][0]}, {"samples": str(path)},
                             {"base_model": ckpts["base"], "kl": kl}, {"model": "tiny", "evaltask": task}, 1)
        samples.append(str(path))
    first = [json.loads(line) for line in open(samples[0])]
    assert len(first) == 3 and all(len(r["completion_ids"]) == 2 for r in first)
    results = {}
    for name in ("base", "es"):
        out = tmp_path / f"kl_{name}.csv"
        A.kl_stage({"samples": samples}, {"csv": str(out)},
                   {"base_model": ckpts["base"], "model": ckpts[name], "method": "es", "eval_tasks": list(TASKS),
                    "kl": kl}, WC, 1)
        results[name] = pd.read_csv(out)
    assert list(results["base"].columns) == A.KL_COLUMNS
    assert results["base"]["eval_task"].tolist() == list(TASKS)
    for col in ("token_mean", "prompt_mean", "sequence_mean"):
        assert (results["base"][col] == 0).all()
        assert (results["es"][col] > 0).all()
    assert (results["es"]["n_tokens"] > 0).all() and (results["es"]["n_sequences"] == 6).all()


def test_continuation_mask_selects_only_completion_positions(ckpts):
    model, _ = load_model(ckpts["base"])
    batch = [([5, 6, 7], [8, 9]), ([5, 6, 7, 10, 11], [12])]
    logits, mask = continuation_logits(model, batch, pad_id=0)
    # window starts at min prompt length - 1 = 2; row 0 predicts positions 2..3, row 1 position 4
    assert mask.tolist() == [[True, True, False], [False, False, True]]
    full = model(input_ids=torch.tensor([[5, 6, 7, 8, 9]])).logits[0]
    assert torch.allclose(logits[0, :2], full[2:4], atol=1e-5)


# --------------------------------------------------------------------------- interpolation


def test_interpolation_points_endpoints_and_dedup(ckpts):
    base, es, grpo = _params(ckpts["base"]), _params(ckpts["es"]), _params(ckpts["grpo"])
    d_es, d_grpo = A.delta(es, base), A.delta(grpo, base)
    states = PathStates(base, d_es, d_grpo, 0)
    points = list(interpolation_points(states, 11, [-1.0, 0.0, 0.5, 1.0, 2.0]))
    by = {(p.path, round(p.lam, 6)): (p.step, p.key, lambda p=p: states.state(p)) for p in points}
    assert all(torch.equal(by[("es-grpo", 0.0)][2]()[k], es[k]) for k in es)
    assert all(torch.equal(by[("es-grpo", 1.0)][2]()[k], grpo[k]) for k in grpo)
    assert all(torch.equal(by[("base-es", 0.0)][2]()[k], base[k]) for k in base)
    assert all(torch.equal(by[("base-es", 1.0)][2]()[k], es[k]) for k in es)
    # coinciding points share a cache key: base, the ES endpoint, half-way along dES
    assert by[("base-es", 0.0)][1] == by[("base-grpo", 0.0)][1] == by[("dir-random", 0.0)][1]
    assert by[("es-grpo", 0.0)][1] == by[("base-es", 1.0)][1] == by[("dir-es", 1.0)][1]
    assert by[("base-es", 0.5)][1] == by[("dir-es", 0.5)][1]
    assert by[("dir-grpo", 2.0)][0] == pytest.approx(2 * A.l2(d_es))
    assert by[("es-grpo", 0.5)][0] == pytest.approx(A.l2({k: (d_es[k] + d_grpo[k]) / 2 for k in d_es}))
    moved = by[("dir-random", -1.0)][2]()
    assert A.l2(A.delta(moved, base)) == pytest.approx(A.l2(d_es), rel=1e-6)
    assert len({p.key for p in points}) < len(points)


def test_interpolation_stage(ckpts, tmp_path):
    out = {"csv": str(tmp_path / "i.csv"), "json": str(tmp_path / "i.json")}
    params = {"base_model": ckpts["base"], "es_model": ckpts["es"], "grpo_model": ckpts["grpo"],
              "eval_tasks": list(TASKS), "eval": EVAL, "steps": 3, "multiples": [0.0, 1.0], "random_seed": 0}
    inputs = {"test": [ckpts["data"][t][0] for t in TASKS], "info": [ckpts["data"][t][1] for t in TASKS]}
    A.interpolation_stage(inputs, out, params, {"model": "tiny", "task": "sum_yesno", "pair": "s0"}, 1)
    df = pd.read_csv(out["csv"])
    assert list(df.columns) == A.INTERPOLATION_COLUMNS
    assert len(df) == (3 * 3 + 3 * 2) * len(TASKS)
    assert set(df["path"]) == {"es-grpo", "base-es", "base-grpo", "dir-es", "dir-grpo", "dir-random"}
    one = df[df["eval_task"] == "sum_yesno"].set_index(["path", "lam"])
    es_eval = _independent_eval(ckpts["es"], ckpts["data"]["sum_yesno"], "sum_yesno")
    grpo_eval = _independent_eval(ckpts["grpo"], ckpts["data"]["sum_yesno"], "sum_yesno")
    assert tuple(one.loc[("es-grpo", 0.0), ["greedy", "mean@n"]]) == es_eval
    assert tuple(one.loc[("es-grpo", 1.0), ["greedy", "mean@n"]]) == grpo_eval
    assert tuple(one.loc[("dir-es", 1.0), ["greedy", "mean@n"]]) == es_eval
    summary = read_json(out["json"])
    paths = {(b["path"], b["eval_task"], b["metric"]) for b in summary["barriers"]}
    assert ("es-grpo", "countdown3", "greedy") in paths and len(paths) == 3 * len(TASKS) * 2
    assert all(b["barrier_height"] >= 0 for b in summary["barriers"])


# --------------------------------------------------------------------------- config and DAG


def test_analysis_settings_merge_and_check():
    merged = analysis_settings.analysis_config({"analysis": {"kl": {"n_prompts": 5}}})
    assert merged["kl"]["n_prompts"] == 5 and merged["kl"]["samples_per_prompt"] == 4
    eval_settings = analysis_settings.analysis_eval_settings({"n_samples": 32, "ks": [1, 32], "backend": "vllm"},
                                                             merged["eval"])
    assert eval_settings["ks"] == [1, 8] and "backend" not in eval_settings
    with pytest.raises(ValueError, match=r"analysis.analyses: unknown \['geometry'\]"):
        analysis_settings.analysis_config({"analysis": {"analyses": ["drift", "geometry"]}})


@pytest.mark.slow
def test_analysis_targets_dry_run(tmp_path):
    """Every analysis target builds a DAG: on configs/ci.yaml, and with two seeds of each method
    (cosine seed pairs) and no sequential runs."""
    run_workflow(tmp_path / "ci", REPO / "configs" / "ci.yaml", targets=["analysis_all"], dryrun=True)
    config = yaml.safe_load((REPO / "configs" / "ci.yaml").read_text())
    config.setdefault("grpo", {"group_sizes": [4], "settings": {"steps": 2}})["seeds"] = [0, 1]
    config["es"]["seeds"] = [0, 1]
    config.pop("sequential", None)
    path = tmp_path / "seeds.yaml"
    path.write_text(yaml.safe_dump(config))
    run_workflow(tmp_path / "seeds", path, targets=["analysis_all"], dryrun=True)
