# Thin entry point: all logic lives in esgrpo.workflow.stages.models.pin_model.
from esgrpo.workflow.bridge import run_stage

if __name__ == "__main__":
    run_stage(snakemake, "esgrpo.workflow.stages.models:pin_model")  # noqa: F821
