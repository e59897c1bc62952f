# Thin entry point of every paper table and figure rule: params.stage names the function in
# esgrpo.pipeline.paper (TABLES / FIGURES); all logic lives there.
from esgrpo.pipeline.paper import run_paper_stage
from esgrpo.workflow import run_stage

if __name__ == "__main__":  # vLLM's worker processes re-import this file (spawn): only run here
    run_stage(snakemake, run_paper_stage)  # noqa: F821
