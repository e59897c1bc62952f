"""The host-memory model (esgrpo.plan.host): the fp32 copies it counts, and the model against real jobs'
measured peaks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from esgrpo.plan import (
    shipped,
)
from tests.conftest import REPO


def test_host_memory_counts_the_fp32_copies_of_sharded_grpo_and_es():
    """Sharded GRPO: every process loads the whole fp32 model first (4 B/param each) and rank 0 keeps two
    fp32 copies (8 B/param); ES keeps one fp32 theta0 whatever its number of engines (4 B/param)."""
    from esgrpo.plan.host import gpu_job_host

    arch = shipped("Qwen/Qwen2.5-7B-Instruct")
    p = arch.parameters
    grpo = gpu_job_host(arch, "grpo", processes=4, engines=0)
    assert grpo["load"]["fp32 model being loaded (per process)"] == 4 * 4 * p
    assert grpo["train"]["callback theta0 + pre-step copies (fp32, rank 0)"] == 8 * p
    for engines in (1, 4, 8):
        es = gpu_job_host(arch, "es", processes=1, engines=engines)["train"]
        assert es["fp32 master (one per job)"] == 4 * p


# --------------------------------------------------------------------------- host memory, measured


@pytest.mark.slow
def test_host_memory_model_within_25_percent_of_measured_peaks(tmp_path):
    """Real ES and GRPO jobs (the workflow's train_run stage) at ~0.1M and ~4M parameters."""
    out = tmp_path / "rss.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "plan_memory.py"), "--cases", "tiny,4m",
                    "--work", str(tmp_path), "--json", str(out)], check=True, cwd=REPO, timeout=1200)
    rows = json.loads(out.read_text())
    assert {(r["case"], r["method"]) for r in rows} == {(c, m) for c in ("tiny", "4m") for m in ("es", "grpo")}
    for row in rows:
        assert 0.75 <= row["ratio"] <= 1.25, row
