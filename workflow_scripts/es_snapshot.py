# Thin entry point: all logic lives in esgrpo.workflow.stages.training.export_snapshot.
from esgrpo.workflow.bridge import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, "esgrpo.workflow.stages.training:export_snapshot")  # noqa: F821
