"""The numbers the docs give are the workflow's: docs/cluster.md's job counts are what `snakemake -n`
plans for each shipped config (scripts/job_counts.py writes them)."""

from __future__ import annotations

import pytest
from conftest import REPO, load_script


@pytest.mark.slow
def test_cluster_doc_job_counts_are_the_dry_runs(tmp_path):
    counts = load_script("scripts/job_counts.py")
    doc = (REPO / "docs" / "cluster.md").read_text()
    written = doc[doc.index(counts.BEGIN):doc.index(counts.END) + len(counts.END)]
    planned = counts.table(tmp_path)
    assert written == planned, ("docs/cluster.md is stale: python scripts/job_counts.py --write docs/cluster.md\n"
                                + planned)
    assert "| `configs/paper_b.yaml` | `paper_b` | 130 |" in planned  # issue 22: the dry run's count (issue 30: + 5 snapshots and their evaluations, pin_model, 4 benchmarks)


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
