"""The docs cannot go stale: docs/cluster.md's job counts are what `snakemake -n` plans for each shipped
config (scripts/job_counts.py writes them); the README's Layout names every file and module, and only
paths that exist; the README's shell commands run (dry runs, --help)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, load_script


@pytest.mark.slow
def test_cluster_doc_job_counts_are_the_dry_runs(tmp_path):
    counts = load_script("scripts/job_counts.py")
    doc = (REPO / "docs" / "cluster.md").read_text()
    written = doc[doc.index(counts.BEGIN):doc.index(counts.END) + len(counts.END)]
    planned = counts.table(tmp_path)
    assert written == planned, ("docs/cluster.md is stale: python scripts/job_counts.py --write docs/cluster.md\n"
                                + planned)
    # issue 22: the dry run's count (issue 30: + 5 snapshots and their evaluations, pin_model, 4 benchmarks; issue 31:
    # + paper B's arithmetic on the 4 easy models, trained and evaluated, then their drift analyses for b_drift, and
    # their 4 sparsity analyses for b_sparsity)
    assert "| `configs/paper_b.yaml` | `paper_b` | 146 |" in planned


def _resolves(reference: str) -> bool:
    """Whether a dotted `esgrpo.` name is a module, or an attribute path inside one."""
    import importlib

    parts = reference.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_dotted_reference_resolves():
    """A docstring, the schema, a rule or a doc that names `esgrpo.x.y` names something that exists."""
    import re

    pattern = re.compile(r"\besgrpo(?:\.[A-Za-z_]\w*)+")
    files = [REPO / "README.md", REPO / "Snakefile"] + [
        p for folder in ("src", "schemas", "docs", "rules") for p in sorted((REPO / folder).rglob("*"))
        if p.suffix in {".py", ".yaml", ".md", ".smk"}]
    dangling = sorted({(m.group(0), str(p.relative_to(REPO))) for p in files
                       for m in pattern.finditer(p.read_text()) if not _resolves(m.group(0))})
    assert len(files) > 100
    assert not dangling, dangling


# --------------------------------------------------------------------------- the README's Layout


def layout_blocks() -> tuple[str, str]:
    """The README Layout's two code blocks: the repository, and the package."""
    import re

    section = (REPO / "README.md").read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```\n(.*?)^```$", section, re.M | re.S)
    assert len(blocks) >= 2, section[:500]
    return blocks[0], blocks[1]


def layout_entries(block: str, indent: str = "") -> dict[str, str]:
    """path -> its text (continuation lines included): an entry starts at `indent` with a non-space."""
    entries: dict[str, str] = {}
    current = ""
    for line in block.splitlines():
        if line.startswith(indent) and line[len(indent):len(indent) + 1].strip():
            current, _, text = line[len(indent):].partition(" ")
            entries[current] = text
        else:
            entries[current] = entries.get(current, "") + "\n" + line
    return entries


def tracked_files() -> list[str]:
    import subprocess

    return subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()


def test_every_path_the_layout_names_exists_and_every_file_is_named():
    import re

    entries = layout_entries(layout_blocks()[0])
    named = set()
    for path, text in entries.items():
        assert (REPO / path).is_dir() if path.endswith("/") else (REPO / path).is_file(), path
        named.add(path)
        if path.endswith("/"):
            for name in re.findall(r"(?<![\w./*-])([\w-][\w./-]*\.(?:py|smk|yaml|sh|txt|toml|json))\b", text):
                assert (REPO / path / name).is_file(), f"README Layout: {path}{name} does not exist"
                named.add(path + name)
    files = [f for f in tracked_files() if not f.startswith(".")]
    top = {f.split("/")[0] + ("/" if "/" in f else "") for f in files}
    absent = sorted(t for t in top if not any(n == t or n.startswith(t) for n in named))
    assert not absent, f"README Layout does not name {absent}"
    # the folders whose every file the Layout names (the rest: one line for the folder, tests/ and docs/ say more)
    listed = ("configs/", "rules/", "envs/", "benchmarks/", "scripts/", "profiles/", "schemas/")
    missing = [f for f in files if f.startswith(listed) and f not in named]
    assert not missing, f"README Layout does not name {missing}"


def test_every_package_module_is_named_in_the_layout():
    import re

    package = REPO / "src" / "esgrpo"
    entries = layout_entries(layout_blocks()[1].split("\n", 1)[1], indent="  ")
    folders = {path: text for path, text in entries.items() if path.endswith("/")}
    shared = "\n".join(f"{path} {text}" for path, text in entries.items() if not path.endswith("/"))
    for folder in folders:
        assert (package / folder / "__init__.py").is_file(), f"README Layout: src/esgrpo/{folder} is not a package"
    unnamed = []
    for module in sorted(package.rglob("*.py")):
        parts = module.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__":
            continue
        text = folders.get(f"{parts[0]}/", "") if len(parts) > 1 else shared
        if not re.search(rf"\b{parts[-1]}\b", text) or any(f"{sub}/" not in text for sub in parts[1:-1]):
            unnamed.append("/".join(parts))
    assert not unnamed, f"README Layout does not name these modules: {unnamed}"
    packages = {p.parent.name + "/" for p in package.glob("*/__init__.py")}
    assert packages == set(folders), packages ^ set(folders)


# --------------------------------------------------------------------------- the README's commands


def readme_commands() -> list[str]:
    """Every line of the README's bash code blocks, comments cut."""
    import re

    text = (REPO / "README.md").read_text()
    lines = []
    for block in re.findall(r"^```bash\n(.*?)^```$", text, re.M | re.S):
        lines += [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    return lines


def fresh_checkout(where: Path) -> Path:
    """The tracked files of this working tree (what a clone of it holds), copied to `where`."""
    import shutil

    for name in tracked_files():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, where / name)
    return where


@pytest.mark.slow
def test_every_readme_command_a_dry_run_can_check_runs(tmp_path, ci_workflow):
    """In a fresh checkout holding the CI grid's finished outputs: each `snakemake` line as a dry run (the SLURM
    profile's with a dummy account; `--report`, which builds the report whatever -n says, for real), `make`
    targets with -n, scripts with --help, and the TensorBoard folder the README points at (in the CI grid's
    folder). A line of another kind fails the test until it is
    handled here; `pip install` lines (they install) and the Usage section's `git clone` / `snakedeploy
    deploy-workflow` of the published repository (tests/pipeline/test_deploy.py runs them from a local clone) are left out."""
    import os
    import shutil
    import subprocess
    import sys

    checkout = fresh_checkout(tmp_path / "clone")
    # copy2: the outputs keep their times. Not the grid's .snakemake/metadata: it names base_fingerprint's
    # input docs/base_reference.json by the absolute path of the checkout that ran it (rules/models.smk).
    shutil.copytree(ci_workflow, checkout / "results" / "ci")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(checkout / "src")}
    env.pop("ESGRPO_SLURM_ACCOUNT", None)
    checked = []
    for line in readme_commands():
        words = line.split()
        if words[0] == "export":
            name, _, value = words[1].partition("=")
            env[name] = "dummy_account" if name == "ESGRPO_SLURM_ACCOUNT" else value
            continue
        if words[:2] == ["pip", "install"]:
            continue
        if words[:2] in (["git", "clone"], ["snakedeploy", "deploy-workflow"]):
            # the Usage section's steps against the published repository (network, a release): the deploy stage
            # runs the same steps from a local clone (tests/pipeline/test_deploy.py)
            assert "https://github.com/<owner>/esgrpo" in line, line
            continue
        if words[0] == "tensorboard":
            logdir = words[words.index("--logdir") + 1]
            assert logdir == "results/default/tensorboard", line  # the default grid's: the CI grid's beside it
            assert list((checkout / "results" / "ci" / "tensorboard").rglob("events.out.tfevents.*")), line
            checked.append(line)
            continue
        if words[0] == "snakemake":  # --report builds the report from the finished grid, dry run or not
            cmd = [sys.executable, "-m", "snakemake", *words[1:], *([] if "--report" in words else ["-n"])]
        elif words[0] == "make":
            cmd = ["make", "-n", *words[1:]]
        elif words[0] == "python" and words[1].startswith(("scripts/", "benchmarks/")):
            cmd = [sys.executable, words[1], "--help"]
        else:
            pytest.fail(f"README command of a kind this test does not check: {line}")
        out = subprocess.run(cmd, cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, f"{line}\n{(out.stdout + out.stderr)[-3000:]}"
        if "--report" in words:
            report = checkout / words[words.index("--report") + 1]
            assert report.stat().st_size > 100_000 and "a_accuracy" in report.read_text(errors="replace"), line
        if words[0] == "snakemake" and "--configfile=configs/ci.yaml" in words and "--report" not in words:
            assert "Nothing to be done" in out.stdout + out.stderr, (line, out.stdout[-4000:])
        if "profiles/slurm" in words:
            assert "SLURM: account dummy_account" in out.stdout + out.stderr, line
        checked.append(line)
    assert len(checked) >= 12, checked
