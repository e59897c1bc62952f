"""A config of the repository as a dict, for the plan's tests."""

from __future__ import annotations

import yaml

from tests.conftest import REPO


def load(name: str) -> dict:
    return yaml.safe_load((REPO / name).read_text())
