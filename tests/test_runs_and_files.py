"""Run names <-> specs, the planned grid, and atomic I/O."""

from __future__ import annotations

import re

import pytest
import yaml

from esgrpo.files import append_jsonl, atomic_directory, read_jsonl, write_json
from esgrpo.runs import (
    RUN_PATTERN,
    SNAPSHOT_RUN_PATTERN,
    TRAINED_RUN_PATTERN,
    RunName,
    continual_name,
    continual_stage_one,
    es_name,
    grpo_name,
    main_name,
    pair_arithmetic,
    pair_name,
    pair_seed,
    parse_run_name,
    planned_runs,
    run_spec,
    sequential_name,
    snapshot_name,
    trainer_settings,
)
from tests.conftest import REPO


@pytest.fixture
def config():
    cfg = yaml.safe_load((REPO / "config.yaml").read_text())
    cfg.setdefault("grpo", {"group_sizes": [8], "seeds": [0], "settings": {"learning_rate": 1e-3}})
    cfg.setdefault("sequential", {"task": "countdown3", "continual": list(cfg["tasks"]),
                                  "continual_methods": ["es", "grpo"]})
    return cfg


def test_es_names_carry_their_settings(config):
    spec = run_spec(config, "tiny", "countdown3", "es-n8-norm_rank-anti-s3")
    assert spec.method == "es" and spec.seed == 3 and spec.init is None
    assert spec.settings["population_size"] == 8 and spec.settings["normalization"] == "rank"
    assert spec.settings["antithetic"] is True and spec.settings["seed"] == 3
    assert spec.settings["sigma"] == config["es"]["settings"]["sigma"]


def test_low_rank_names_set_the_noise_and_full_rank_names_add_no_setting(config):
    spec = run_spec(config, "tiny", "countdown3", "es-n16-r4-s0")
    assert spec.settings["noise"] == "lowrank" and spec.settings["rank"] == 4 and spec.labels["rank"] == 4
    assert "noise" not in run_spec(config, "tiny", "countdown3", "es-n16-s0").settings  # Snakemake params unchanged
    config["es"]["ablations"]["ranks"] = [1, 4]
    runs = planned_runs(config, "tiny")
    assert ("countdown3", "es-n16-r1-s0") in runs and ("countdown3", "es-n16-r4-s0") in runs
    # a low-rank main config: the main runs' names say so, a name without a rank is full-rank
    config["es"]["settings"].update(noise="lowrank", rank=2)
    assert main_name(config, "es", 0) == "es-n16-r2-s0"
    assert {k: run_spec(config, "tiny", "countdown3", "es-n16-r2-s0").settings[k] for k in ("noise", "rank")} == {
        "noise": "lowrank", "rank": 2}
    assert run_spec(config, "tiny", "countdown3", "es-n16-s0").settings["noise"] == "full"
    assert ("countdown3", "es-n16-r2-norm_none-s0") in planned_runs(config, "tiny")


def test_arithmetic_names_set_a_papers_seeding_and_arithmetic_and_are_planned_at_the_main_population(config):
    """es.ablations.arithmetic: each paper's seeding with its own in-place arithmetic, full-rank whatever the
    main runs' noise; the main runs keep the exact arithmetic (no key: their Snakemake params unchanged)."""
    spec = run_spec(config, "tiny", "countdown3", "es-n16-arith_paper_a-s0")
    assert {k: spec.settings[k] for k in ("noise_seeding", "arithmetic")} == {
        "noise_seeding": "paper_a", "arithmetic": "inplace_sequential"}
    assert spec.labels["arithmetic"] == "paper_a"
    spec_b = run_spec(config, "tiny", "countdown3", "es-n16-arith_paper_b-s0")
    assert (spec_b.settings["noise_seeding"], spec_b.settings["arithmetic"]) == ("paper_b", "inplace_summed")
    assert "arithmetic" not in run_spec(config, "tiny", "countdown3", "es-n16-s0").settings
    config["es"]["ablations"].update(arithmetic=["paper_a", "paper_b"], seeds=[0, 1])
    runs = planned_runs(config, "tiny")
    assert [r for t, r in runs if "arith" in r] == ["es-n16-arith_paper_a-s0", "es-n16-arith_paper_a-s1",
                                                     "es-n16-arith_paper_b-s0", "es-n16-arith_paper_b-s1"]
    assert all(t == config["es"]["ablations"]["task"] for t, r in runs if "arith" in r)
    config["es"]["settings"].update(noise="lowrank", rank=2)
    assert run_spec(config, "tiny", "countdown3", "es-n16-arith_paper_b-s0").settings["noise"] == "full"
    with pytest.raises(ValueError, match="not a run name"):
        parse_run_name("es-n16-arith_paper_c-s0")


def test_sequential_runs_start_from_the_first_stage(config):
    n, g = config["es"]["population_sizes"][0], config["grpo"]["group_sizes"][0]
    spec = run_spec(config, "tiny", "countdown3", "es-then-grpo-s0")
    assert spec.method == "grpo" and spec.init == ("countdown3", f"es-n{n}-s0")
    assert run_spec(config, "tiny", "countdown3", "grpo-then-es-s0").init == ("countdown3", f"grpo-g{g}-s0")
    order = config["sequential"]["continual"]
    assert run_spec(config, "tiny", order[0], "cl_es-s0-k1").init is None
    # stage 1 is the main run on order[0]; stage 2 starts from it, later stages from the stage before
    assert continual_stage_one(config, "tiny", "es", 0) == (order[0], f"es-n{n}-s0", "cl_es-s0-k1")
    assert run_spec(config, "tiny", order[1], "cl_es-s0-k2").init == (order[0], f"es-n{n}-s0")
    assert run_spec(config, "tiny", order[1], "cl_es-s0-k2").settings == run_spec(config, "tiny", order[0], "cl_es-s0-k1").settings
    assert run_spec(config, "tiny", order[2], "cl_grpo-s0-k3").init == (order[1], "cl_grpo-s0-k2")
    with pytest.raises(ValueError, match="stage 2 trains on"):
        run_spec(config, "tiny", order[0], "cl_es-s0-k2")


def test_continual_budget_gives_every_stage_its_own_budget(config):
    """sequential.continual_budget: every stage at that budget; where it differs from the main run's, stage 1
    is a run of its own (cl_es-s0-k1, from the base) that stage 2 starts from; where it equals the main
    run's (GRPO here), stage 1 stays the main run. Without the block nothing changes."""
    order, n, g = config["sequential"]["continual"], config["es"]["population_sizes"][0], 8
    before = {(t, r): run_spec(config, "tiny", t, r).settings for t, r in planned_runs(config, "tiny")}
    es_its = config["es"]["settings"]["iterations"]
    config["sequential"]["continual_budget"] = {"es_iterations": es_its + 7,
                                                "grpo_steps": config["grpo"]["settings"]["steps"]}
    runs = planned_runs(config, "tiny")
    assert (order[0], "cl_es-s0-k1") in runs and (order[0], "cl_grpo-s0-k1") not in runs
    assert continual_stage_one(config, "tiny", "es", 0) is None
    assert continual_stage_one(config, "tiny", "grpo", 0) == (order[0], f"grpo-g{g}-s0", "cl_grpo-s0-k1")
    for k, task in enumerate(order, 1):
        spec = run_spec(config, "tiny", task, f"cl_es-s0-k{k}")
        assert spec.settings["iterations"] == es_its + 7 and "snapshots" not in spec.settings
        assert {**spec.settings, "iterations": es_its} == _without_snapshots(before[(order[0], f"es-n{n}-s0")])
    assert run_spec(config, "tiny", order[0], "cl_es-s0-k1").init is None
    assert run_spec(config, "tiny", order[1], "cl_es-s0-k2").init == (order[0], "cl_es-s0-k1")
    assert run_spec(config, "tiny", order[1], "cl_grpo-s0-k2").init == (order[0], f"grpo-g{g}-s0")
    # the other runs keep their settings
    assert all(run_spec(config, "tiny", t, r).settings == s for (t, r), s in before.items() if not r.startswith("cl_es"))


def _without_snapshots(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k != "snapshots"}


# --------------------------------------------------------------------------- settings per model (issue 30)


def test_a_run_takes_its_model_s_then_its_task_s_settings_over_the_grid_s(config):
    """models.<m>.es.settings over es.settings, models.<m>.per_task.<t>.es.settings over both; every run of
    that model on that task takes them (ablations, snapshots, sequential stages); another model's runs keep
    the grid's settings, key order included (Snakemake compares params by their repr: nothing of theirs reruns)."""
    n = config["es"]["population_sizes"][0]
    config["models"]["other"] = {"source": "default", "tasks": list(config["models"]["tiny"]["tasks"])}
    before = {(t, r): repr(run_spec(config, "other", t, r).settings) for t, r in planned_runs(config, "other")}
    config["models"]["tiny"]["es"] = {"settings": {"max_new_tokens": 48, "sigma": 0.02}}
    config["models"]["tiny"]["per_task"] = {"countdown3": {"es": {"settings": {"sigma": 0.03}},
                                                           "grpo": {"settings": {"steps": 7}}}}
    assert trainer_settings(config, "es", "tiny", "countdown3")["sigma"] == 0.03
    assert trainer_settings(config, "es", "tiny", "sum_yesno")["sigma"] == 0.02
    assert trainer_settings(config, "es", "other", "countdown3") == config["es"]["settings"]
    for run in (f"es-n{n}-s0", f"es-n{n}-norm_rank-s0", f"es-n{n}-it10-s0", "grpo-then-es-s0"):
        settings = run_spec(config, "tiny", "countdown3", run).settings
        assert (settings["max_new_tokens"], settings["sigma"]) == (48, 0.03), run
    assert run_spec(config, "tiny", "sum_yesno", f"es-n{n}-s1").settings["sigma"] == 0.02
    assert run_spec(config, "tiny", "countdown3", "es-then-grpo-s0").settings["steps"] == 7
    assert run_spec(config, "tiny", "sum_yesno", "grpo-g8-s0").settings["steps"] == config["grpo"]["settings"]["steps"]
    assert {(t, r): repr(run_spec(config, "other", t, r).settings) for t, r in before} == before


def test_continual_stages_take_their_task_s_settings_and_stage_one_is_the_model_s(config):
    order, n = config["sequential"]["continual"], config["es"]["population_sizes"][0]
    config["models"]["tiny"]["per_task"] = {order[1]: {"es": {"settings": {"max_new_tokens": 40}}}}
    assert run_spec(config, "tiny", order[1], "cl_es-s0-k2").settings["max_new_tokens"] == 40
    assert run_spec(config, "tiny", order[2], "cl_es-s0-k3").settings["max_new_tokens"] == 24
    # a continual budget that is one model's main budget and not the other's: stage 1 is that model's main run
    its = config["es"]["settings"]["iterations"]
    config["models"]["other"] = {"source": "default", "tasks": list(config["models"]["tiny"]["tasks"]),
                                 "es": {"settings": {"iterations": its + 5}}}
    config["sequential"]["continual_budget"] = {"es_iterations": its + 5}
    assert continual_stage_one(config, "other", "es", 0) == (order[0], f"es-n{n}-s0", "cl_es-s0-k1")
    assert continual_stage_one(config, "tiny", "es", 0) is None
    assert (order[0], "cl_es-s0-k1") in planned_runs(config, "tiny")
    assert (order[0], "cl_es-s0-k1") not in planned_runs(config, "other")
    assert run_spec(config, "other", order[1], "cl_es-s0-k2").init == (order[0], f"es-n{n}-s0")


def test_run_names_parse_back_to_what_formatted_them():
    cases = {
        es_name(8, 3, "rank", True): RunName("es", "es", 3, "es-n8-norm_rank-anti", population=8,
                                             normalization="rank", antithetic=True),
        es_name(16, 0): RunName("es", "es", 0, "es-n16", population=16, normalization="zscore", antithetic=False),
        es_name(16, 0, rank=4): RunName("es", "es", 0, "es-n16-r4", population=16, normalization="zscore",
                                        antithetic=False, rank=4),
        es_name(8, 1, "none", True, rank=1): RunName("es", "es", 1, "es-n8-r1-norm_none-anti", population=8,
                                                     normalization="none", antithetic=True, rank=1),
        snapshot_name(16, 10, 2): RunName("snapshot", "es", 2, "es-n16-it10", population=16, normalization="zscore",
                                          antithetic=False, iterations=10),
        grpo_name(8, 1): RunName("grpo", "grpo", 1, "grpo-g8", group=8),
        sequential_name("es", "grpo", 4): RunName("sequential", "grpo", 4, "es-then-grpo", first="es"),
        continual_name("es", 3, 2): RunName("continual", "es", 3, "cl_es-k2", stage=2),
        es_name(16, 0, arithmetic="paper_b"): RunName("es", "es", 0, "es-n16-arith_paper_b", population=16,
                                                      normalization="zscore", antithetic=False, arithmetic="paper_b"),
    }
    for name, parsed in cases.items():
        assert re.fullmatch(RUN_PATTERN, name), name
        assert parse_run_name(name) == parsed, name
    assert list(cases) == ["es-n8-norm_rank-anti-s3", "es-n16-s0", "es-n16-r4-s0", "es-n8-r1-norm_none-anti-s1",
                           "es-n16-it10-s2", "grpo-g8-s1",
                           "es-then-grpo-s4", "cl_es-s3-k2", "es-n16-arith_paper_b-s0"]
    # pair analyses of the ES and GRPO main runs of one seed are named by the seed alone
    assert pair_seed("s12") == 12 and pair_seed("es-n16-s0") is None
    assert pair_seed("arith_paper_b-s3") == 3 and pair_arithmetic("arith_paper_b-s3") == "paper_b"
    assert pair_arithmetic("s3") is None and pair_name(3) == "s3" and pair_name(3, "paper_a") == "arith_paper_a-s3"
    with pytest.raises(ValueError, match="'es-n16-s0' is not a pair analysis name"):
        pair_arithmetic("es-n16-s0")
    with pytest.raises(ValueError, match="'base' is not a run name"):
        parse_run_name("base")


def test_bad_run_name_is_named(config):
    with pytest.raises(ValueError, match="'es-x-s0' is not a run name"):
        run_spec(config, "tiny", "countdown3", "es-x-s0")


def test_planned_runs_cover_the_grid_and_match_the_wildcard(config):
    runs = planned_runs(config, "tiny")
    assert len(runs) == len(set(runs))
    for task in config["models"]["tiny"]["tasks"]:
        assert (task, "es-n16-s0") in runs and (task, "grpo-g8-s0") in runs
    assert ("countdown3", "es-n16-norm_none-s0") in runs and ("countdown3", "es-n16-anti-s0") in runs
    assert ("countdown3", "es-then-grpo-s0") in runs
    # stage 1 of each continual sequence is the main run, not trained again; every seed has its sequence
    seeds = config["es"]["seeds"]
    assert config["grpo"]["seeds"] == seeds and len(seeds) == 3
    assert sum(run.startswith("cl_") for _, run in runs) == 2 * (len(config["sequential"]["continual"]) - 1) * 3
    assert not any(run.endswith("-k1") for _, run in runs)
    for seed in seeds:  # main, sequential and continual runs on every seed; ablations on es.ablations.seeds
        assert ("countdown3", f"grpo-then-es-s{seed}") in runs and ("leg_count", f"cl_es-s{seed}-k2") in runs
    assert config["es"]["ablations"]["seeds"] == [0]
    assert not any(run.startswith(("es-n4-", "es-n32-", "es-n16-norm", "es-n16-anti")) and not run.endswith("-s0")
                   for _, run in runs)
    for task, run in runs:
        assert re.fullmatch(RUN_PATTERN, run), run
        run_spec(config, "tiny", task, run)


def test_snapshot_runs_come_from_the_main_es_run(config):
    """es.snapshots: only the main ES run exports them (its settings carry the list); each is a planned run
    named es-n{N}-it{K}-s{seed} that starts from nothing but that run."""
    n = config["es"]["population_sizes"][0]
    config["es"].pop("snapshots", None)
    assert "snapshots" not in run_spec(config, "tiny", "countdown3", f"es-n{n}-s0").settings  # params unchanged
    config["es"]["snapshots"] = [10, 5]
    main = run_spec(config, "tiny", "countdown3", f"es-n{n}-s0")
    assert main.settings["snapshots"] == [5, 10]
    for other in (f"es-n{n}-norm_rank-s0", "grpo-then-es-s0"):
        assert not run_spec(config, "tiny", "countdown3", other).settings.get("snapshots"), other
    assert not run_spec(config, "tiny", config["sequential"]["continual"][1], "cl_es-s0-k2").settings.get("snapshots")
    snap = run_spec(config, "tiny", "countdown3", f"es-n{n}-it5-s0")
    assert snap.method == "snapshot" and snap.init == ("countdown3", f"es-n{n}-s0")
    assert snap.settings["iterations"] == 5 and snap.labels == {"population": n, "iterations": 5,
                                                                 "snapshot_of": f"es-n{n}-s0"}
    runs = planned_runs(config, "tiny")
    for task in config["models"]["tiny"]["tasks"]:
        assert (task, f"es-n{n}-it5-s0") in runs and (task, f"es-n{n}-it10-s0") in runs
    for bad in (f"es-n{n}-it7-s0", "es-n999-it5-s0"):
        with pytest.raises(ValueError, match="only the main ES run"):
            run_spec(config, "tiny", "countdown3", bad)
    assert re.fullmatch(TRAINED_RUN_PATTERN, f"es-n{n}-s0") and not re.fullmatch(TRAINED_RUN_PATTERN,
                                                                                    f"es-n{n}-it5-s0")
    assert re.fullmatch(SNAPSHOT_RUN_PATTERN, f"es-n{n}-it5-s0") and not re.fullmatch(SNAPSHOT_RUN_PATTERN,
                                                                                        f"es-n{n}-s0")


def test_atomic_json_and_torn_jsonl_tail(tmp_path):
    write_json(tmp_path / "a" / "x.json", {"b": 1})
    assert (tmp_path / "a" / "x.json").read_text().strip().startswith("{")
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.endswith(".tmp")]
    path = tmp_path / "m.jsonl"
    append_jsonl(path, {"i": 1})
    append_jsonl(path, {"i": 2})
    with open(path, "a") as handle:
        handle.write('{"i": 3')  # a kill mid-write
    assert read_jsonl(path) == [{"i": 1}, {"i": 2}]
    path.write_text('{"i": 1}\n{"i"\n{"i": 3}\n')
    with pytest.raises(ValueError, match="line 2"):
        read_jsonl(path)


def test_atomic_directory_syncs_every_file_then_replaces_the_folder_whole(tmp_path, monkeypatch):
    """Every file and folder of the new tree is on disk before the rename, the parent after it (a rename
    alone may land before the data after a power loss); a failure keeps the old folder and leaves nothing."""
    import os

    synced = []
    real_fsync = os.fsync

    def recording_fsync(fd):  # the real sync, and which path it was for
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    target = tmp_path / "model"
    target.mkdir()
    (target / "old.txt").write_text("old")
    monkeypatch.setattr(os, "fsync", recording_fsync)
    with atomic_directory(target) as tmp:
        (tmp / "sub").mkdir()
        (tmp / "sub" / "weights.bin").write_bytes(b"w")
        (tmp / "config.json").write_text("{}")
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*")) == [
        "config.json", "sub", "sub/weights.bin"]
    assert {"weights.bin", "config.json", "sub"} <= set(synced[:-1]) and synced[-1] == tmp_path.name
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "half.bin").write_bytes(b"h")
        raise RuntimeError("killed mid-write")
    assert (target / "config.json").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model"]
