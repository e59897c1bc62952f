# Thin entry point: all logic lives in esgrpo.workflow.stages.theory.theory_stage.
from esgrpo.workflow.bridge import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, "esgrpo.workflow.stages.theory:theory_stage")  # noqa: F821
