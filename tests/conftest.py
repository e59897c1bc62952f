"""Shared fixtures: one thread per process (docs/references.md: more threads than cores thrash), the CI workflow
run once per session through the Snakemake Python API, and the tiny boxed yes/no model (tests/grpo/helpers.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parents[1]

# model_dir, the tiny boxed yes/no model the GRPO trainer's and the live TensorBoard tests train
pytest_plugins = ["tests.grpo.helpers"]


def pytest_configure(config):
    import torch

    torch.set_num_threads(1)


def load_script(path: str):
    """A script of the repository (scripts/, benchmarks/) as a module, for the functions it holds."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(Path(path).stem, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def results_of(configfile: Path) -> str:
    """The results folder a config writes to, relative to the workdir (esgrpo.grids.results_folder)."""
    import yaml

    from esgrpo.grids import results_folder

    return results_folder(yaml.safe_load(Path(configfile).read_text()).get("results_dir"), [configfile])


# Tests marked `vllm` need vLLM (a GPU, or the CPU build of `make vllm-env`): elsewhere they skip, unless
# ESGRPO_REQUIRE_VLLM=1 (the vLLM stage of `make test`), where a vLLM that does not import is an error.
REQUIRE_VLLM = os.environ.get("ESGRPO_REQUIRE_VLLM") == "1"


def vllm_import_error() -> str | None:
    """Why `import vllm` fails here, or None when it works (imported once per session)."""
    if not hasattr(vllm_import_error, "result"):
        try:
            import vllm  # noqa: F401

            vllm_import_error.result = None
        except Exception as error:  # an ImportError, or a broken build's own error
            vllm_import_error.result = f"{type(error).__name__}: {error}"
    return vllm_import_error.result


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if item.get_closest_marker("vllm") is None or (error := vllm_import_error()) is None:
        return
    if REQUIRE_VLLM:
        pytest.fail(f"ESGRPO_REQUIRE_VLLM=1 but vllm does not import ({error})", pytrace=False)
    pytest.skip(f"vllm does not import ({error})")


def run_workflow(workdir: Path, configfile: Path, targets: list[str] | None = None, dryrun: bool = False,
                 cores: int = 2, forcerun: list[str] | None = None) -> None:
    """Run (or dry-run) the workflow in `workdir` through the Snakemake API; `forcerun` files are remade
    (with everything downstream of them)."""
    from snakemake.api import SnakemakeApi
    from snakemake.scheduling.greedy import SchedulerSettings as GreedySchedulerSettings
    from snakemake.settings.types import (
        ConfigSettings,
        DAGSettings,
        ExecutionSettings,
        OutputSettings,
        ResourceSettings,
        SchedulingSettings,
    )

    with SnakemakeApi(OutputSettings(dryrun=dryrun, quiet={"progress"} if not dryrun else set())) as api:
        workflow = api.workflow(
            resource_settings=ResourceSettings(cores=cores),
            config_settings=ConfigSettings(configfiles=[configfile]),
            snakefile=REPO / "Snakefile",
            workdir=workdir,
        )
        dag = workflow.dag(DAGSettings(targets=frozenset(targets or []), forcerun=frozenset(forcerun or [])))
        # greedy, as profiles/default sets: the ILP scheduler's solver costs CPU the jobs need
        dag.execute_workflow(executor="dryrun" if dryrun else "local",
                             execution_settings=ExecutionSettings(),
                             scheduling_settings=SchedulingSettings(scheduler="greedy"),
                             scheduler_settings=GreedySchedulerSettings())


@pytest.fixture(scope="session")
def ci_workflow(tmp_path_factory) -> Path:
    """The CI config run end to end once; tests read its outputs (its results folder, results/ci)."""
    workdir = tmp_path_factory.mktemp("ci_workflow")
    run_workflow(workdir, REPO / "configs" / "ci.yaml")
    return workdir / results_of(REPO / "configs" / "ci.yaml")


# The wall time of the stages CI reports (.ci/run): every phase of the tests of each marker, summed.
STAGE_MARKERS = ("slurm", "vllm", "deploy", "storage")
_STAGES: dict[str, dict[str, float]] = {}


_MARKED: dict[str, str] = {}  # nodeid -> its stage marker


def pytest_collection_modifyitems(items):
    for item in items:
        for marker in STAGE_MARKERS:
            if item.get_closest_marker(marker):
                _MARKED[item.nodeid] = marker


def pytest_runtest_logreport(report):
    if report.nodeid in _MARKED:
        tests = _STAGES.setdefault(_MARKED[report.nodeid], {})
        tests[report.nodeid] = tests.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    for marker, tests in _STAGES.items():
        terminalreporter.write_line(f"{marker} tests: {len(tests)}, {sum(tests.values()):.0f} s")
