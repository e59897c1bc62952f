# The tables and figures of papers A and B, and the claims table: one rule per file set, each
# reading only the tidy files of what the config trains (inputs: paper_input_function in
# rules/targets.smk; code: the stage of that name in esgrpo.report.registry).


for _table, _category in PAPER_TABLES.items():

    rule:
        name:
            f"table_{_table}"
        input:
            unpack(paper_input_function(_table)),
        output:
            csv=f"{RESULTS}/tables/{_table}.csv",
            md=f"{RESULTS}/tables/{_table}.md",
            tex=f"{RESULTS}/tables/{_table}.tex",
            # the report shows this page (the Markdown's frame as HTML); a Markdown file would be a download
            html=report(
                f"{RESULTS}/tables/{_table}.html",
                caption=f"../report/{_table}.rst",
                category=_category,
                subcategory="tables",
                labels={"paper": _category, "kind": "table", "name": _table},
            ),
        log:
            f"{RESULTS}/logs/paper/{_table}.log",
        localrule: True
        conda:
            SOFTWARE_ENV
        params:
            stage=_table,
            setup=PAPER_SETUP,
            jobs=paper_jobs_function(_table),
        script:
            "../workflow_scripts/paper_stage.py"


for _figure, _category in PAPER_FIGURES.items():

    rule:
        name:
            f"figure_{_figure}"
        input:
            unpack(paper_input_function(_figure)),
        output:
            png=report(
                f"{RESULTS}/figures/{_figure}.png",
                caption=f"../report/{_figure}.rst",
                category=_category,
                subcategory="figures",
                labels={"paper": _category, "kind": "figure", "name": _figure},
            ),
            pdf=f"{RESULTS}/figures/{_figure}.pdf",
        log:
            f"{RESULTS}/logs/paper/{_figure}.log",
        localrule: True
        conda:
            SOFTWARE_ENV
        params:
            stage=_figure,
            setup=PAPER_SETUP,
            jobs=paper_jobs_function(_figure),
        script:
            "../workflow_scripts/paper_stage.py"


rule paper_a:
    input:
        paper_a_targets(),
    localrule: True


rule paper_b:
    input:
        paper_b_targets(),
    localrule: True


rule claims:
    input:
        table_targets("claims"),
    localrule: True
