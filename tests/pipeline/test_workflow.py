"""The workflow, end to end on configs/ci.yaml through the Snakemake API, and dry runs of every config."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from esgrpo.engines import panel_matmul
from esgrpo.files import read_json, read_jsonl
from tests.conftest import REPO, run_workflow

pytestmark = pytest.mark.slow


def test_every_config_dry_runs(tmp_path):
    for configfile in [REPO / "config.yaml", *sorted((REPO / "configs").glob("*.yaml"))]:
        run_workflow(tmp_path / configfile.stem, configfile, dryrun=True)


def test_snakemake_lint_passes():
    """`snakemake --lint` (rules vs helper functions, a log and a conda env on every rule, ...)."""
    import os
    import subprocess
    import sys

    snakemake = Path(sys.executable).with_name("snakemake")
    result = subprocess.run([str(snakemake), "--lint"], cwd=REPO, capture_output=True, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Congratulations" in result.stdout + result.stderr


def test_the_dag_parse_imports_no_torch(tmp_path):
    """`snakemake -n` runs every rule file and input function in one process; torch (seconds to import)
    belongs to the jobs. -X importtime lists every module the parse imported."""
    import os
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "snakemake", "-n", "-q",
                             "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), f"--configfile={REPO / 'config.yaml'}"],
                            capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "snakemake.workflow" in imported and "esgrpo.config" in imported
    assert not imported & {"torch", "transformers", "datasets", "vllm", "trl"}, sorted(imported & {"torch"})


# The package's rooms from the bottom up, as the data flows (tasks -> models -> ES / GRPO -> evaluation
# -> analyses -> report), with the engines below the models that use them (the warm-up generates) and
# the shared top-level modules at the bottom. `config` checks every room's settings, so it sits above
# ES and GRPO. A module may import its own room or any lower one, never a higher one.
LAYERS = [
    {"esgrpo", "esgrpo.files", "esgrpo.provenance", "esgrpo.settings", "esgrpo.runs", "esgrpo.progress",
     "esgrpo.estimators", "esgrpo.noise", "esgrpo.distance", "esgrpo.run_record",
     "esgrpo.live", "esgrpo.grids", "esgrpo.parameter_names"},
    {"esgrpo.tasks"},
    {"esgrpo.engines"},
    {"esgrpo.models"},
    {"esgrpo.es", "esgrpo.grpo"},
    {"esgrpo.config"},
    {"esgrpo.evaluation"},
    {"esgrpo.analysis"},
    {"esgrpo.plan"},
    {"esgrpo.report"},
    {"esgrpo.workflow"},
]


def package_imports() -> dict[str, set[str]]:
    """Every esgrpo module -> the esgrpo modules it imports, at module level or inside a function."""
    import ast

    src = REPO / "src"
    modules = {".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): p
               for p in (src / "esgrpo").rglob("*.py")}

    def imports(name: str) -> set[str]:
        found = set()
        for node in ast.walk(ast.parse(modules[name].read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                          for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        return {m for m in found if m in modules and m != name}

    return {name: imports(name) for name in modules}


def layer_of(module: str) -> int:
    """The room of a module: the longest prefix that LAYERS names."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        for rank, room in enumerate(LAYERS):
            if prefix in room:
                return rank
    raise AssertionError(f"{module} is in no room of LAYERS: add it where it belongs")


def test_no_import_from_a_lower_room_to_a_higher_one():
    graph = package_imports()
    upward = [f"{name} (room {layer_of(name)}) -> {dep} (room {layer_of(dep)})"
              for name, deps in sorted(graph.items()) for dep in sorted(deps) if layer_of(dep) > layer_of(name)]
    assert not upward, "\n".join(upward)
    # the walk sees real edges (a test that finds no edge could not fail)
    assert "esgrpo.es.backend" in graph["esgrpo.es.loop"]
    assert "esgrpo.noise" in graph["esgrpo.engines.vllm_layout"]


def test_no_import_circle_in_the_package():
    """No esgrpo module imports (at module level or inside a function) one that imports it back."""
    graph = package_imports()
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        for dep in graph[name]:
            assert dep not in path, " -> ".join([*path[path.index(dep):], dep])
            if dep not in done:
                visit(dep, [*path, dep])
        done.add(name)

    for name in sorted(graph):
        visit(name, [name])


def test_workflow_scripts_run_their_stage_only_as_main():
    """vLLM starts its engine processes with spawn, which re-imports the job's main file (Snakemake points
    __file__ at the workflow script): a stage called at import time would run again there, without the
    `snakemake` object. Every script calls run_stage under `if __name__ == "__main__":`."""
    import ast

    scripts = sorted((REPO / "workflow_scripts").glob("*.py"))
    assert len(scripts) >= 10
    for path in scripts:
        tree = ast.parse(path.read_text())
        top_calls = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
        guarded = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "__name__ == '__main__'"]
        assert not top_calls and len(guarded) == 1, path.name
        assert "run_stage(snakemake" in ast.unparse(guarded[0]), path.name


def test_base_table_has_real_numbers_for_every_task(ci_workflow):
    table = pd.read_csv(ci_workflow / "tables" / "base_passk.csv")
    import yaml

    tasks = yaml.safe_load((REPO / "configs" / "ci.yaml").read_text())["models"]["tiny"]["tasks"]
    assert sorted(table["task"]) == sorted(tasks)
    for column in ("greedy", "pass@1", "pass@8", "mean@n"):
        assert table[column].between(0, 1).all()
    # Pass@k is non-decreasing in k and the estimator's Pass@1 equals mean@n.
    assert (table["pass@8"] >= table["pass@1"]).all()
    assert (table["pass@1"] - table["mean@n"]).abs().max() < 1e-12
    assert (ci_workflow / "tables" / "base_passk.md").read_text().count("| tiny") == len(tasks)
    assert (ci_workflow / "figures" / "base_passk.png").stat().st_size > 1000


def test_default_model_is_in_the_accuracy_band(ci_workflow):
    """The warm-up stops with a base that is right sometimes, not always (5%..70% greedy per task),
    and sampling finds answers greedy misses (Pass@k above Pass@1)."""
    build = read_json(ci_workflow / "tiny" / "base" / "build.json")
    assert build["warmup"]["stopped_because"] != "steps_max"
    evaluations = read_json(ci_workflow / "tiny" / "base" / "eval.json")["evaluations"]
    for ev in evaluations:
        assert 0.05 <= ev["greedy_accuracy"] <= 0.7, ev["eval_task"]
        assert ev["pass@8"] > ev["pass@1"] + 0.05, ev["eval_task"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(ci_workflow / "tiny" / "base" / "model")
    tokenizer = AutoTokenizer.from_pretrained(ci_workflow / "tiny" / "base" / "model")
    assert model.config.model_type == "llama" and tokenizer.eos_token == "<|end|>"


def test_outputs_record_provenance(ci_workflow):
    for path in [ci_workflow / "tiny" / "base" / "eval.json", ci_workflow / "tiny" / "base" / "build.json",
                 ci_workflow / "data" / "countdown3" / "info.json"]:
        record = read_json(path)["provenance"]
        assert record["packages"]["torch"] and record["packages"]["transformers"]
        assert record["config"] and "seed" in record
        assert "git_commit" in record


def test_es_runs_train_log_and_evaluate(ci_workflow):
    run = ci_workflow / "tiny" / "countdown3" / "es-n4-s0"
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [row["iteration"] for row in metrics] == [1, 2, 3]
    for key in ("fitness_mean", "fitness_std", "update_norm", "distance_from_init", "rollouts",
                "generated_tokens", "seconds", "entropy", "js_diversity", "skipped"):
        assert key in metrics[-1], key
    summary = read_json(run / "summary.json")
    assert summary["method"] == "es" and summary["provenance"]["config"]["settings"]["population_size"] == 4
    assert summary["member_matmul"] == panel_matmul.kernel_name("cpu")  # what rounded its rollouts
    evaluations = read_json(run / "eval.json")["evaluations"]
    assert {ev["eval_task"] for ev in evaluations} == {"countdown3", "sum_yesno"}
    rank_run = read_json(ci_workflow / "tiny" / "countdown3" / "es-n4-norm_rank-s0" / "summary.json")
    assert rank_run["provenance"]["config"]["settings"]["normalization"] == "rank"
    # es.ablations.ranks [1]: a low-rank run beside the full-rank main run, at its N
    low = read_json(ci_workflow / "tiny" / "countdown3" / "es-n4-r1-s0" / "summary.json")["provenance"]["config"]
    assert (low["settings"]["noise"], low["settings"]["rank"], low["settings"]["population_size"]) == ("lowrank", 1, 4)
    prompts = read_jsonl(run / "eval_prompts.jsonl")
    assert all(0 <= p["correct"] <= p["n"] for p in prompts)
    json.dumps(prompts[0])


def test_es_snapshot_is_a_run_of_its_own(ci_workflow):
    """es.snapshots: [2] makes es-n4-it2-s0 on every task from the main ES run's export after 2 of its 3
    iterations: the same files (hard links), its first 2 metric rows, an evaluation, and a column of
    a_accuracy."""
    import pandas as pd

    from esgrpo.workflow.stages.analysis import load_params

    tiny = ci_workflow / "tiny"
    for task in ("countdown3", "sum_yesno"):
        parent, snap = tiny / task / "es-n4-s0", tiny / task / "es-n4-it2-s0"
        for path in (parent / "snapshots" / "it2" / "model").iterdir():
            assert (snap / "model" / path.name).samefile(path)
        rows = read_jsonl(snap / "metrics.jsonl")
        assert rows == read_jsonl(parent / "metrics.jsonl")[:2]
        summary = read_json(snap / "summary.json")
        assert summary["iteration"] == summary["iterations"] == 2 and summary["snapshot_of"] == "es-n4-s0"
        assert summary["distance_from_init"] == pytest.approx(rows[-1]["distance_from_init"], rel=1e-9)
        weights, final = load_params(str(snap / "model")), load_params(str(parent / "model"))
        assert any(not bool((weights[k] == final[k]).all()) for k in final)  # 2 iterations, not 3
        assert {ev["eval_task"] for ev in read_json(snap / "eval.json")["evaluations"]} == {"countdown3", "sum_yesno"}
    table = pd.read_csv(ci_workflow / "tables" / "a_accuracy.csv")
    on_task = table[table["budget"] == "iterations"]
    assert {"base", "ES", "ES (2 it)", "GRPO"} <= set(on_task["method"])


def test_second_stages_start_from_the_first_stage_weights(ci_workflow):
    """ES->GRPO, GRPO->ES and continual stage 2 load the first stage's final weights: the distance each
    logs from its start equals the distance of its final weights to that first stage's model, and
    not the distance to the base."""
    import torch

    from esgrpo.workflow.stages.analysis import load_params

    tiny = ci_workflow / "tiny"
    base = load_params(str(tiny / "base" / "model"))
    for task, run, first in (("countdown3", "es-then-grpo-s0", "es-n4-s0"),
                             ("countdown3", "grpo-then-es-s0", "grpo-g4-s0"),
                             ("sum_yesno", "cl_es-s0-k2", "es-n4-s0"), ("sum_yesno", "cl_grpo-s0-k2", "grpo-g4-s0")):
        summary = read_json(tiny / task / run / "summary.json")
        first_dir = tiny / ("countdown3" if run.startswith("cl_") else task) / first
        assert summary["init_model"] == str(first_dir.relative_to(ci_workflow.parents[1]) / "model")
        final = load_params(str(tiny / task / run / "model"))
        start = load_params(str(first_dir / "model"))

        def dist(a, b):
            return float(torch.sqrt(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a)))

        logged = read_jsonl(tiny / task / run / "metrics.jsonl")[-1]["distance_from_init"]
        assert dist(final, start) == pytest.approx(logged, rel=1e-4), run
        assert abs(dist(final, base) - logged) > 1e-3 * logged, run  # the base is not where it started


def test_every_analysis_table_and_figure_is_made(ci_workflow):
    """`rule all` on the CI grid: analyses with real rows, every paper table in three formats, the claims."""
    from esgrpo.report import registry
    from esgrpo.report.claims import CLAIMS

    analysis = ci_workflow / "analysis" / "tiny"
    interp = pd.read_csv(analysis / "interpolation" / "countdown3" / "s0.csv")
    assert {"es-grpo", "base-es", "base-grpo", "dir-es", "dir-grpo", "dir-random"} <= set(interp["path"])
    assert sorted(interp.loc[interp["path"] == "es-grpo", "lam"].unique()) == [0.0, 0.5, 1.0]
    sparsity = pd.read_csv(analysis / "sparsity" / "countdown3" / "es-n4-s0.csv")
    assert sorted(sparsity["keep_fraction"].dropna().unique()) == [0.0, 0.1, 1.0]
    drift = pd.read_csv(analysis / "drift" / "sum_yesno" / "cl_es-s0-k2.csv")
    # stage 2 started from stage 1, not the base: its distance from its start differs from the base's
    assert abs(drift["init_l2"].pow(2).sum() - drift["l2"].pow(2).sum()) > 1e-6 * drift["l2"].pow(2).sum()
    for name in [*registry.stage_names("Paper A", "table"), *registry.stage_names("Paper B", "table")]:
        for ext in ("csv", "md", "tex", "html"):
            assert (ci_workflow / "tables" / f"{name}.{ext}").stat().st_size > 0, (name, ext)
    for name in registry.stage_names(kind="figure"):
        assert (ci_workflow / "figures" / f"{name}.png").stat().st_size > 1000, name
    claims = pd.read_csv(ci_workflow / "tables" / "claims.csv")
    assert list(claims["id"]) == [c.id for c in CLAIMS]
    # the low-rank ablation (es.ablations.ranks) has its rows, its contrast and a measured claim
    ablations = pd.read_csv(ci_workflow / "tables" / "b_ablations.csv")
    assert {"low-rank r=1", "low-rank r=1 - full-rank"} <= set(ablations["setting"])
    assert claims.set_index("id").loc["es_lowrank_matches", "status"] == "measured"
    # continual stage 1 (the main run) reaches the sequential table under its continual name
    sequential = pd.read_csv(ci_workflow / "tables" / "a_sequential.csv")
    assert 1 in set(sequential["stage"])


# wall-clock fields of a training curve's rows (esgrpo.es.loop, esgrpo.grpo.trainer): the only bytes a rerun may change
WALL_CLOCK = ("seconds", "seconds_step")


def test_an_identical_rerun_gives_byte_identical_tables(ci_workflow, tmp_path):
    """Issue 14: the same config and seeds twice on one machine give byte-identical tables. A copy of the CI
    results retrains the main ES and GRPO runs of sum_yesno from scratch (their progress folders removed, so
    neither resumes its last checkpoint) and remakes everything downstream of them: evaluations, analyses and
    every table (25 jobs). Tables record no provenance (report.writing: numbers and captions only), so every
    byte must match; so must the retrained weights, the evaluations and the training curves less their
    WALL_CLOCK fields. Measured on CPU with one thread per job (conftest); other thread counts can change
    float reductions and are not covered."""
    import shutil
    import time

    workdir = tmp_path / "rerun"
    shutil.copytree(ci_workflow.parents[1], workdir, symlinks=True)  # copy2: the same mtimes, nothing out of date
    folder = ci_workflow.relative_to(ci_workflow.parents[1])  # results/ci
    results = workdir / folder
    runs = [Path("tiny/sum_yesno/es-n4-s0"), Path("tiny/sum_yesno/grpo-g4-s0")]
    for run in runs:
        shutil.rmtree(results / "progress" / run)
    tables = sorted(p.name for p in (ci_workflow / "tables").iterdir())
    started = time.time()
    run_workflow(workdir, REPO / "configs" / "ci.yaml", targets=[f"{folder}/tables/{name}" for name in tables],
                 forcerun=[f"{folder}/{run}/summary.json" for run in runs])

    def curve(results_dir: Path, run: Path) -> list[dict]:
        return [{k: v for k, v in row.items() if k not in WALL_CLOCK}
                for row in read_jsonl(results_dir / run / "metrics.jsonl")]

    for run in runs:
        assert (results / run / "summary.json").stat().st_mtime > started, run  # retrained, not kept
        assert curve(results, run) == curve(ci_workflow, run), run
        weights = [p.relative_to(ci_workflow) for p in sorted((ci_workflow / run / "model").iterdir())
                   if not p.name.startswith(".")]
        for path in [*weights, run / "eval_prompts.jsonl"]:
            assert (results / path).read_bytes() == (ci_workflow / path).read_bytes(), path
    assert sorted(p.name for p in (results / "tables").iterdir()) == tables
    differ = [name for name in tables
              if (results / "tables" / name).read_bytes() != (ci_workflow / "tables" / name).read_bytes()]
    assert not differ, differ
    remade = [name for name in tables if (results / "tables" / name).stat().st_mtime > started]
    assert "claims.csv" in remade and "b_passk.csv" in remade, remade


# --------------------------------------------------------------------------- settings per model (issue 30)


def _snakemake(workdir: Path, configfile: Path, *args: str) -> str:
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"),
                          "--directory", str(workdir), f"--configfile={configfile}", *args],
                         cwd=REPO, capture_output=True, text=True, timeout=900,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    return out.stdout + out.stderr


def _jobs_to_run(text: str) -> set[tuple[str, str]]:
    """(rule, model) of every job a `snakemake -n` output lists."""
    import re

    jobs = re.findall(r"^rule (\w+):\n((?:    .*\n)+)", text, re.M)
    return {(rule, re.search(r"wildcards: .*model=(\w+)", body)[1]) for rule, body in jobs if "wildcards:" in body}


def test_a_changed_model_override_reruns_that_model_s_jobs_only(tmp_path):
    """Two models from one base folder, trained and evaluated for real; then one model's es.settings override
    changes, then the other's eval override: each time Snakemake (its params trigger: a run's params are its
    merged settings) has exactly that model's affected jobs to run, and none of the other model's."""
    import yaml

    from esgrpo.models.default import TinyLlamaSpec, build_tiny_llama, train_tokenizer
    from esgrpo.models.loading import save_model

    base = tmp_path / "base_model"
    tokenizer = train_tokenizer(["Is 3 + 4 = 7? yes", "Is 2 + 2 = 5? no", "system user assistant"], vocab_size=300)
    save_model(build_tiny_llama(tokenizer, TinyLlamaSpec(), seed=0), tokenizer, base)
    config = {
        "results_dir": "results/two", "tasks": {"sum_yesno": {"train_size": 16, "test_size": 4}},
        "models": {m: {"source": str(base), "tasks": ["sum_yesno"]} for m in ("a", "b")},
        "eval": {"n_samples": 2, "ks": [1, 2], "test_size": 4, "max_new_tokens": 6},
        "es": {"population_sizes": [2], "settings": {"sigma": 0.01, "alpha": 0.005, "iterations": 1,
                                                     "prompts_per_iteration": 4, "max_new_tokens": 6}},
    }
    configfile = tmp_path / "two.yaml"
    configfile.write_text(yaml.safe_dump(config))
    targets = [f"results/two/{m}/{path}" for m in ("a", "b") for path in ("base/eval.json",
                                                                          "sum_yesno/es-n2-s0/eval.json")]
    _snakemake(tmp_path, configfile, "--cores", "2", *targets)
    assert _jobs_to_run(_snakemake(tmp_path, configfile, "-n", *targets)) == set()

    config["models"]["b"]["es"] = {"settings": {"max_new_tokens": 8}}
    configfile.write_text(yaml.safe_dump(config))
    assert _jobs_to_run(_snakemake(tmp_path, configfile, "-n", *targets)) == {("train_run", "b"), ("eval_run", "b")}
    # each output's status (`--summary`; Snakemake 9.27's --list-params-changes also lists the last output of
    # every unchanged job: its ParamsChange.__or__ keeps the files of an empty change)
    rows = [line.split("\t") for line in _snakemake(tmp_path, configfile, "--summary", *targets).splitlines()]
    status = {row[0]: row[4] for row in rows if len(row) > 4 and row[0].startswith("results/two/")}
    run = "results/two/b/sum_yesno/es-n2-s0"
    assert {path for path, s in status.items() if s == "params changed"} == {
        f"{run}/{name}" for name in ("model", "metrics.jsonl", "summary.json")}, status
    assert {s for path, s in status.items() if path.startswith("results/two/a/")} == {"ok"}, status

    config["models"]["b"].pop("es")
    config["models"]["a"]["eval"] = {"max_new_tokens": 8}
    configfile.write_text(yaml.safe_dump(config))
    assert _jobs_to_run(_snakemake(tmp_path, configfile, "-n", *targets)) == {("eval_base", "a"), ("eval_run", "a")}
