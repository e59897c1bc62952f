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
