"""One results folder per grid (esgrpo.grids): each config's folder, the grid record that stops a config
with other settings from writing into another's folder, and two grids run one after the other in one
working directory without touching each other's files."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from esgrpo.files import read_json
from esgrpo.grids import (
    GRID_RECORD,
    GridError,
    check_grid_folder,
    config_source,
    results_folder,
    write_grid_record,
)
from esgrpo.plan.prompts import CACHE_FILE
from tests.conftest import REPO, results_of, run_workflow

CI = REPO / "configs" / "ci.yaml"


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


# --------------------------------------------------------------------------- the folder of a config


def test_every_shipped_config_names_a_folder_of_its_own():
    configs = [REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml"))]
    folders = {path.name: load(path)["results_dir"] for path in configs}
    assert folders["config.yaml"] == "results/default" and folders["ci.yaml"] == "results/ci"
    assert len(set(folders.values())) == len(folders), folders


def test_a_config_without_results_dir_writes_under_its_file_name():
    assert results_folder(None, [Path("/somewhere/my_grid.yaml")]) == "results/my_grid"
    assert results_folder(None, []) == "results/default"
    assert results_folder("results/x/", [Path("a.yaml")]) == "results/x"
    with pytest.raises(GridError, match=r"results_dir: '\.' is the working directory"):
        results_folder(".", [Path("a.yaml")])


# --------------------------------------------------------------------------- the grid record


def test_the_grid_record_stops_only_another_config_with_other_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the working directory: CI lies outside it, so its path stays absolute
    folder = str(tmp_path / "results" / "ci")
    ci = load(CI)
    source = config_source([CI], [], REPO / "config.yaml")
    assert check_grid_folder(folder, ci, source)  # no record yet: this run writes it
    write_grid_record(folder, ci, source)
    assert read_json(Path(folder) / GRID_RECORD)["source"] == source
    assert not check_grid_folder(folder, copy.deepcopy(ci), source)  # the same config, rerun
    other_file = config_source([tmp_path / "copy_of_ci.yaml"], [], REPO / "config.yaml")
    assert not check_grid_folder(folder, {**ci, "results_dir": "elsewhere"}, other_file)  # same settings
    edited = copy.deepcopy(ci)
    edited["es"]["settings"]["iterations"] = 2
    assert check_grid_folder(folder, edited, source)  # its own config, edited: the record is rewritten
    with pytest.raises(GridError) as err:
        check_grid_folder(folder, edited, other_file)
    message = str(err.value)
    assert "\n" not in message
    assert f"results_dir {folder} holds the grid of {CI}" in message
    assert "this config (copy_of_ci.yaml) has other settings (es.settings.iterations: 3 -> 2)" in message
    assert f"set results_dir to a folder of its own, or delete {folder}/{GRID_RECORD}" in message
    seeded = config_source([CI], ["seed=1"], REPO / "config.yaml")  # --config arguments: another config
    with pytest.raises(GridError, match=rf"this config \({CI} \+ --config seed=1\) has other settings \(seed: 0 -> 1\)"):
        check_grid_folder(folder, {**ci, "seed": 1}, seeded)


def test_the_grid_record_survives_a_moved_checkout_and_names_two_configs_apart(tmp_path, monkeypatch):
    """A renamed checkout (or a copied results folder) editing its own config.yaml: still its own grid. Another
    checkout's config.yaml with other settings: refused, the two files named by their paths."""
    ci = load(CI)
    old = tmp_path / "checkout"
    old.mkdir()
    (old / "config.yaml").write_text(CI.read_text())
    monkeypatch.chdir(old)
    source = config_source([old / "config.yaml"], [], old / "config.yaml")
    assert source["configfiles"] == ["config.yaml"]
    write_grid_record("results/ci", ci, source)
    # A record written before paths were relative names the same file by its absolute path.
    legacy = read_json(old / "results" / "ci" / GRID_RECORD)
    legacy["source"]["configfiles"] = [str(old / "config.yaml")]
    (old / "results" / "ci" / GRID_RECORD).write_text(json.dumps(legacy))
    edited = copy.deepcopy(ci)
    edited["es"]["settings"]["iterations"] = 2
    assert check_grid_folder("results/ci", edited, source)
    write_grid_record("results/ci", ci, source)

    moved = old.rename(tmp_path / "renamed")
    monkeypatch.chdir(moved)
    source = config_source([moved / "config.yaml"], [], moved / "config.yaml")
    assert check_grid_folder("results/ci", edited, source)  # its own config, edited: rewritten, not refused
    other = tmp_path / "other" / "config.yaml"
    other.parent.mkdir()
    other.write_text(CI.read_text())
    with pytest.raises(GridError) as err:
        check_grid_folder("results/ci", edited, config_source([other], [], other))
    assert f"holds the grid of config.yaml, and this config ({other}) has other settings" in str(err.value)


def test_a_grid_folder_inside_another_or_holding_one_is_refused(tmp_path):
    ci, source = load(CI), config_source([CI], [], REPO / "config.yaml")
    write_grid_record(str(tmp_path / "results" / "ci"), ci, source)
    with pytest.raises(GridError, match=r"inside the folder of another grid"):
        check_grid_folder(str(tmp_path / "results" / "ci" / "more"), ci, source)
    with pytest.raises(GridError, match=r"holds the folders of other grids"):
        check_grid_folder(str(tmp_path / "results"), ci, source)


def test_a_broken_grid_record_is_named(tmp_path):
    (tmp_path / GRID_RECORD).write_text("{")
    with pytest.raises(GridError, match=rf"{GRID_RECORD}: not a grid record .*delete it"):
        check_grid_folder(str(tmp_path), load(CI), config_source([CI], [], CI))


# --------------------------------------------------------------------------- through Snakemake


def planned_outputs(workdir: Path, configfile: Path) -> set[str]:
    """Every output file of `snakemake -n all` (the `output:` lines of its job list)."""
    out = subprocess.run([sys.executable, "-m", "snakemake", "all", "-n", "--snakefile", str(REPO / "Snakefile"),
                          "--directory", str(workdir), f"--configfile={configfile}"],
                         cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return {path for line in re.findall(r"^\s+output: (.*)$", out.stdout, re.M) for path in line.split(", ")}


def test_the_default_and_ci_grids_plan_disjoint_outputs(tmp_path):
    default, ci = planned_outputs(tmp_path, REPO / "config.yaml"), planned_outputs(tmp_path, CI)
    assert len(default) > 300 and len(ci) > 80
    assert all(p.startswith("results/default/") for p in default)
    assert all(p.startswith("results/ci/") for p in ci)
    assert not default & ci


def snakemake_dry_run(workdir: Path, configfile: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "snakemake", "-n", "--snakefile", str(REPO / "Snakefile"),
                           "--directory", str(workdir), f"--configfile={configfile}"],
                          cwd=REPO, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def mtimes(folder: Path, ignore: tuple[str, ...] = ()) -> dict[str, int]:
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*")
            if p.is_file() and p.name not in ignore}


# A second small grid (one task, a two-step warm-up of a smaller model, ES only, two analyses).
SMALL_GRID = {
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
    "analysis": {"analyses": ["drift", "theory"]},
}


@pytest.mark.slow
def test_two_grids_run_one_after_the_other_in_one_workdir(ci_workflow, tmp_path):
    """The finished CI grid, then: a copy of ci.yaml with one setting changed pointed at results/ci stops
    at parse time with one line naming the setting (nothing written); a second grid in its own folder
    runs to the end; afterwards neither config has anything to do and neither folder changed."""
    workdir = tmp_path / "wd"
    shutil.copytree(ci_workflow.parents[1], workdir, symlinks=True)  # copy2: the same mtimes
    ci_folder = workdir / results_of(CI)
    ci_files = mtimes(ci_folder)
    assert GRID_RECORD in ci_files

    clash = load(CI)
    clash["es"]["settings"]["sigma"] = 0.02
    clash_file = tmp_path / "ci_sigma.yaml"
    clash_file.write_text(yaml.safe_dump(clash))
    out = snakemake_dry_run(workdir, clash_file)
    assert out.returncode != 0
    lines = [line for line in (out.stdout + out.stderr).splitlines() if "results_dir results/ci holds" in line]
    assert len(lines) == 1, out.stdout + out.stderr
    # both config files named by path (the recorded one as the grid record holds it)
    assert f"holds the grid of {CI}, and this config ({clash_file}) has other settings " \
           "(es.settings.sigma: 0.01 -> 0.02)" in lines[0]
    print("\n" + lines[0])

    small_file = tmp_path / "small.yaml"
    small_file.write_text(yaml.safe_dump({"results_dir": "results/small", **SMALL_GRID}))
    run_workflow(workdir, small_file)
    small_folder = workdir / "results" / "small"
    assert (small_folder / "tiny" / "sum_yesno" / "es-n2-s0" / "eval.json").exists()
    assert (small_folder / "tables" / "base_passk.md").exists() and (small_folder / GRID_RECORD).exists()
    assert mtimes(ci_folder) == ci_files  # the second grid wrote nothing into the first's folder
    small_files = mtimes(small_folder)

    for configfile in (CI, small_file):  # each grid is complete: nothing to rerun in either
        out = snakemake_dry_run(workdir, configfile)
        assert out.returncode == 0 and "Nothing to be done" in out.stdout + out.stderr, out.stdout[-3000:]
    # A parse of a grid's own config may cache the plan's prompt lengths in its data folder
    # (esgrpo.plan.prompts); nothing else changed in either folder.
    assert mtimes(ci_folder, (CACHE_FILE,)) == mtimes_without(ci_files, CACHE_FILE)
    assert mtimes(small_folder, (CACHE_FILE,)) == mtimes_without(small_files, CACHE_FILE)


def mtimes_without(files: dict[str, int], name: str) -> dict[str, int]:
    return {path: mtime for path, mtime in files.items() if Path(path).name != name}
