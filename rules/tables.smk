# The base model's table (CSV + Markdown + LaTeX) and figure, from its evaluation summaries
# (esgrpo.report.base_table).


rule table_base_passk:
    input:
        evals=base_eval_targets(),
    output:
        csv=f"{RESULTS}/tables/base_passk.csv",
        md=f"{RESULTS}/tables/base_passk.md",
        tex=f"{RESULTS}/tables/base_passk.tex",
        figure=f"{RESULTS}/figures/base_passk.png",
        figure_pdf=f"{RESULTS}/figures/base_passk.pdf",
    log:
        f"{RESULTS}/logs/tables/base_passk.log",
    localrule: True
    conda:
        SOFTWARE_ENV
    script:
        "../workflow_scripts/table_base_passk.py"
