# Thin entry point: all logic lives in esgrpo.report.base_table.base_passk.
from esgrpo.workflow.bridge import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, "esgrpo.report.base_table:base_passk")  # noqa: F821
