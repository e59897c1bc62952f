# The resource plan of the config (rules/common.smk, esgrpo.plan): one row per job, with its GPUs,
# GPU memory needed and there, host memory and runtime.
#   snakemake --configfile=configs/paper_b.yaml plan


rule plan:
    output:
        csv=f"{RESULTS}/plan.csv",
        md=f"{RESULTS}/plan.md",
    params:
        rows=plan_fingerprint,
    log:
        f"{RESULTS}/logs/plan.log",
    localrule: True
    run:
        write_plan_files(output.csv, output.md, log[0])
