"""The checks a snakemake-workflows catalog user runs: the Snakemake floor, the report, snakefmt."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from tests.conftest import REPO, results_of

BIN = Path(sys.executable).parent


def test_min_version_is_the_tested_floor():
    """min_version, pyproject's floor and the Snakemake every environment pins (the one the suite runs) agree."""
    import snakemake

    floor = re.search(r'min_version\("([^"]+)"\)', (REPO / "Snakefile").read_text()).group(1)
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"snakemake>={floor},<10" in deps
    for env in ("envs/cpu.yaml", "envs/gpu.yaml", "envs/vllm-cpu.txt"):
        pinned = re.search(r"snakemake==([\d.]+)", (REPO / env).read_text()).group(1)
        assert Version(pinned).release[:2] == Version(floor).release[:2], env
    assert Version(snakemake.__version__).release[:2] == Version(floor).release[:2]


@pytest.mark.slow
def test_report_has_the_workflow_description_and_labels(ci_workflow):
    """`snakemake --report` on the CI grid: the front page (report/workflow.rst, the grid's folder rendered in)
    and every table and figure under its labels."""
    workdir = ci_workflow.parents[1]
    configfile = REPO / "configs" / "ci.yaml"
    result = subprocess.run([str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), "-d", str(workdir),
                             f"--configfile={configfile}", "--report", "report.html"],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    html = (workdir / "report.html").read_text()
    assert "regenerates the tables and figures of two papers" in html
    assert f"configuration: here, {results_of(configfile)}" in html
    for labels in ({"paper": "Paper A", "kind": "table", "name": "a_accuracy"},
                   {"paper": "Paper B", "kind": "figure", "name": "passk_curves"},
                   {"paper": "Claims", "kind": "table", "name": "claims_stability"},
                   {"paper": "Base model", "kind": "figure", "name": "base_passk"}):
        assert f'"labels": {json.dumps(labels)}' in html, labels


def test_snakefmt_check():
    """The Snakefile and the rule files as snakefmt writes them (pyproject's [tool.snakefmt])."""
    result = subprocess.run([str(BIN / "snakefmt"), "--check", "Snakefile", "rules/"], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
