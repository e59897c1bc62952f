# The base model's table (CSV + Markdown + LaTeX + the report's HTML) and figure, from its evaluation summaries
# (esgrpo.report.base_table).


rule table_base_passk:
    input:
        evals=base_eval_targets(),
    output:
        csv=f"{RESULTS}/tables/base_passk.csv",
        md=f"{RESULTS}/tables/base_passk.md",
        tex=f"{RESULTS}/tables/base_passk.tex",
        html=report(
            f"{RESULTS}/tables/base_passk.html",
            caption="../report/base_passk.rst",
            category="Base model",
            subcategory="tables",
            labels={"paper": "Base model", "kind": "table", "name": "base_passk"},
        ),
        figure=report(
            f"{RESULTS}/figures/base_passk.png",
            caption="../report/base_passk_figure.rst",
            category="Base model",
            subcategory="figures",
            labels={"paper": "Base model", "kind": "figure", "name": "base_passk"},
        ),
        figure_pdf=f"{RESULTS}/figures/base_passk.pdf",
    log:
        f"{RESULTS}/logs/tables/base_passk.log",
    localrule: True
    conda:
        SOFTWARE_ENV
    script:
        "../workflow_scripts/table_base_passk.py"
