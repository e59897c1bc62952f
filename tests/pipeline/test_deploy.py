"""The workflow deployed the way catalog workflows are: snakedeploy copies a clone's config and profiles into a
fresh folder and writes a Snakefile that uses every rule of this one as a module; the CI config runs there to
completion from that other working directory (README, "Usage")."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.deploy

BIN = Path(sys.executable).parent


def local_clone(dest: Path) -> Path:
    """The working tree's files that git would commit (tracked, and untracked ones it does not ignore): what
    a clone holds, without results or virtual environments."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source, target = REPO / name, dest / name
        if source.is_symlink() or source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    return dest


def snakemake(cwd: Path, *args: str, clone: Path, timeout: int) -> subprocess.CompletedProcess:
    # The driver imports esgrpo from the clone, as after the README's `pip install` of it.
    env = {**os.environ, "PYTHONPATH": str(clone / "src"), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([str(BIN / "snakemake"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A clone, and a folder deployed from it with snakedeploy (its config: configs/ci.yaml)."""
    root = tmp_path_factory.mktemp("deploy")
    clone = local_clone(root / "esgrpo")
    dest = root / "analysis"
    # a local clone is deployed as it is: snakedeploy requires a branch (or tag) and checks nothing out
    result = subprocess.run([str(BIN / "snakedeploy"), "deploy-workflow", str(clone), str(dest), "--name", "esgrpo",
                             "--branch", "main"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    snakefile = dest / "workflow" / "Snakefile"
    text = snakefile.read_text()
    # the embedded default arrives as the deployment's config to edit (config/config.yaml links to it)
    assert (dest / "config" / "config.yaml").read_text() == (REPO / "config.yaml").read_text()
    assert (dest / "profiles" / "slurm" / "config.yaml").is_file()
    # snakedeploy names a local clone's Snakefile relative to the clone ("Snakefile"), which the deployed
    # Snakefile would resolve against its own folder: name it by its path, as github(...) names it by URL.
    declaration = re.compile(r'(snakefile:\s*)"Snakefile"')
    assert declaration.search(text), text
    snakefile.write_text(declaration.sub(lambda m: f'{m.group(1)}"{clone / "Snakefile"}"', text))
    shutil.copy(REPO / "configs" / "ci.yaml", dest / "config" / "config.yaml")
    return clone, dest


def test_deployed_workflow_runs_the_ci_grid(deployed):
    clone, dest = deployed
    run = snakemake(dest, "--cores", "2", clone=clone, timeout=2400)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    results = dest / "results" / "ci"
    for name in ("base_passk", "a_accuracy", "b_passk", "claims"):
        assert (results / "tables" / f"{name}.csv").stat().st_size > 0, name
    # the jobs ran from the deployment's working directory, the workflow's own files read from the clone
    fingerprint = json.loads((results / "tiny" / "base" / "fingerprint.json").read_text())
    assert fingerprint["reference"]["verdict"]  # compared with the clone's docs/base_reference.json
    assert not (clone / "results").exists()


def test_empty_config_stops_with_one_line(deployed, tmp_path):
    """A deploying workflow that passes no config (or an empty one) to the module."""
    clone, _ = deployed
    (tmp_path / "Snakefile").write_text(
        f'module esgrpo:\n    snakefile:\n        "{clone / "Snakefile"}"\n    config:\n        {{}}\n\n\n'
        "use rule * from esgrpo\n")
    run = snakemake(tmp_path, "-n", clone=clone, timeout=300)
    assert run.returncode != 0
    lines = [line for line in (run.stdout + run.stderr).splitlines() if "config is empty or missing" in line]
    assert len(lines) == 1 and "config/config.yaml" in lines[0], run.stdout + run.stderr
