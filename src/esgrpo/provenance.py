"""What made an output: the config, the package versions, the git commit, the seed."""

from __future__ import annotations

import datetime as _dt
import platform
import subprocess
from importlib import metadata
from pathlib import Path

PACKAGES = ("esgrpo", "torch", "transformers", "trl", "datasets", "tokenizers", "accelerate",
            "math-verify", "reasoning-gym", "snakemake", "pandas", "seaborn", "numpy", "vllm")


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The commit of the working tree, with '+dirty' when it has uncommitted changes."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                                check=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def provenance(config: dict | None = None, seed: int | None = None, **extra) -> dict:
    """A record to embed in every summary file."""
    return {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(Path(__file__).resolve().parent),
        "packages": package_versions(),
        "python": platform.python_version(),
        "seed": seed,
        "config": config,
        **extra,
    }
