# The resource plan (rules/resources.smk, esgrpo.plan): one row per job, with its GPUs, GPU memory needed and
# there, host memory and runtime; and its GPU-hours by kind of job (a row of docs/cluster.md's cost table).
#   snakemake --configfile=configs/paper_b.yaml plan              every job of the config (target all)
#   snakemake --configfile=configs/paper_b.yaml plan_paper_b      the jobs the paper_b target runs


rule plan:
    output:
        csv=f"{RESULTS}/plan.csv",
        md=f"{RESULTS}/plan.md",
        cost=f"{RESULTS}/plan_cost.md",
    log:
        f"{RESULTS}/logs/plan.log",
    localrule: True
    params:
        rows=plan_fingerprint,
    run:
        write_plan_files("all", output.csv, output.md, output.cost, log[0])


rule plan_target:
    output:
        csv=f"{RESULTS}/plan_{{plan_target}}.csv",
        md=f"{RESULTS}/plan_{{plan_target}}.md",
        cost=f"{RESULTS}/plan_{{plan_target}}_cost.md",
    log:
        f"{RESULTS}/logs/plan_{{plan_target}}.log",
    # the rule's own constraint: a global one declared after the other rules drops theirs under a default
    # storage provider (rules/heldout.smk says how)
    wildcard_constraints:
        plan_target="paper_a|paper_b",
    localrule: True
    params:
        rows=plan_fingerprint,
    run:
        write_plan_files(wildcards.plan_target, output.csv, output.md, output.cost, log[0])


rule plan_paper_a:
    input:
        f"{RESULTS}/plan_paper_a_cost.md",
    localrule: True


rule plan_paper_b:
    input:
        f"{RESULTS}/plan_paper_b_cost.md",
    localrule: True
