# Thin entry point: all logic lives in esgrpo.workflow.stages.models.write_base_fingerprint.
from esgrpo.workflow.bridge import run_stage

if __name__ == "__main__":
    run_stage(snakemake, "esgrpo.workflow.stages.models:write_base_fingerprint")  # noqa: F821
