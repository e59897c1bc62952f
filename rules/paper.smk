# The tables and figures of papers A and B, and the claims table: one rule per file set, each
# reading only the tidy files of what the config trains (esgrpo.pipeline.paper.paper_inputs,
# through planned_runs). Model analyses come from `analysis_targets(model)` (rules/analysis.smk)
# when that file is included; without it the analysis tables say "not run".
from esgrpo.pipeline import paper as paper_stages

PAPER_SETUP = paper_stages.paper_setup(config)
PAPER_TABLES = {
    **{name: "Paper A" for name in paper_stages.PAPER_A_TABLES},
    **{name: "Paper B" for name in paper_stages.PAPER_B_TABLES},
    "claims": "Claims",
}
PAPER_FIGURES = {
    **{name: "Paper A" for name in paper_stages.PAPER_A_FIGURES},
    **{name: "Paper B" for name in paper_stages.PAPER_B_FIGURES},
}


def paper_analysis_paths():
    """Every model-analysis file the workflow can build (empty when rules/analysis.smk is absent)."""
    targets = globals().get("analysis_targets")
    if targets is None:
        return []
    return [str(path) for model in MODELS for path in targets(model)]


def paper_input_function(name):
    def inputs(wildcards):
        return paper_stages.paper_inputs(config, name, paper_analysis_paths(), RESULTS)

    return inputs


def paper_figure_targets(name):
    return [f"{RESULTS}/figures/{name}.png", f"{RESULTS}/figures/{name}.pdf"]


def paper_a_targets():
    return [
        *[p for n in paper_stages.PAPER_A_TABLES for p in table_targets(n)],
        *[p for n in paper_stages.PAPER_A_FIGURES for p in paper_figure_targets(n)],
    ]


def paper_b_targets():
    return [
        *[p for n in paper_stages.PAPER_B_TABLES for p in table_targets(n)],
        *[p for n in paper_stages.PAPER_B_FIGURES for p in paper_figure_targets(n)],
    ]


def paper_targets():
    """Every paper table (CSV, Markdown, LaTeX), figure (PNG, PDF) and the claims table."""
    return [*paper_a_targets(), *paper_b_targets(), *table_targets("claims")]


for _table, _category in PAPER_TABLES.items():

    rule:
        name:
            f"table_{_table}"
        input:
            unpack(paper_input_function(_table)),
        output:
            csv=f"{RESULTS}/tables/{_table}.csv",
            md=report(
                f"{RESULTS}/tables/{_table}.md",
                caption=f"../report/{_table}.rst",
                category=_category,
                subcategory="tables",
            ),
            tex=f"{RESULTS}/tables/{_table}.tex",
        params:
            stage=_table,
            setup=PAPER_SETUP,
        log:
            f"{RESULTS}/logs/paper/{_table}.log",
        localrule: True
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
            ),
            pdf=f"{RESULTS}/figures/{_figure}.pdf",
        params:
            stage=_figure,
            setup=PAPER_SETUP,
        log:
            f"{RESULTS}/logs/paper/{_figure}.log",
        localrule: True
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
