# Thin entry point of every paper table and figure rule: params.stage names the function in
# esgrpo.report.registry (STAGES); all logic lives in esgrpo.report.
from esgrpo.workflow.bridge import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, "esgrpo.report.loading:run_paper_stage")  # noqa: F821
