# Thin entry point: all logic lives in esgrpo.pipeline.tables.base_passk.
from esgrpo.pipeline.tables import base_passk
from esgrpo.workflow import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, base_passk)  # noqa: F821
