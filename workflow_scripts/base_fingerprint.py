# Thin entry point: all logic lives in esgrpo.pipeline.models.write_base_fingerprint.
from esgrpo.workflow import run_stage

if __name__ == "__main__":
    run_stage(snakemake, "esgrpo.pipeline.models:write_base_fingerprint")  # noqa: F821
