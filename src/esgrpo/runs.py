"""Run names <-> run specifications: what a `{results_dir}/{model}/{task}/{run}/` folder was trained with.

A run's name says everything that distinguishes it, so Snakemake wildcards, tables and
people read the same thing:

| name                       | meaning                                                     |
|----------------------------|-------------------------------------------------------------|
| `es-n16-s0`                | ES, population 16, seed 0, the config's ES settings          |
| `es-n16-norm_rank-s0`      | ... with rank normalisation (`norm_none`: raw fitness)       |
| `es-n16-anti-s0`           | ... with antithetic (two-point) members                     |
| `es-n16-r4-s0`             | ... with low-rank noise of rank 4 (`ESConfig.noise`)          |
| `es-n16-arith_paper_a-s0`  | ... with paper A's (or B's) seeding and in-place arithmetic  |
|                            | (`ARITHMETIC_VARIANTS`), on the weights in bf16              |
| `grpo-g8-s0`               | GRPO, group size 8, seed 0                                   |
| `es-then-grpo-s0`          | GRPO started from `es-n{main}-s0` of the same task           |
| `grpo-then-es-s0`          | ES started from `grpo-g{main}-s0` of the same task           |
| `cl_es-s0-k2`              | continual sequence, method ES, stage 2 (task = order[1]),   |
|                            | started from stage 1's checkpoint on order[0]               |
| `es-n16-it10-s0`           | `es-n16-s0` after 10 of its iterations (`es.snapshots`):    |
|                            | exported by that run, not trained again                     |

A run's settings are the config's `es.settings` / `grpo.settings`, under its model's own
(`models.<model>.es.settings`) and, where given, the model's on the run's task
(`models.<model>.per_task.<task>.es.settings`): `trainer_settings`. They are the train job's Snakemake
params, so changing one model's override reruns that model's runs only.

Continual stages train with the main run's settings (each on its own task), except for a budget of their own where
`sequential.continual_budget` gives one (paper A: 100 ES iterations and ~79 GRPO steps per task,
docs/references.md). Stage 1 (the method on order[0] from the base) is then the main run on
order[0] itself when their budgets agree, so it is not trained twice: `cl_es-s0-k2` starts from
`es-n16-s0` on order[0], and tables read that run as `cl_es-s0-k1` (`continual_stage_one`). When the
budgets differ, stage 1 is a run of its own, `cl_es-s0-k1`, and stage 2 starts from it.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

# The grammar of a run name: the one place that parses or formats one (the table above).
ES_RE = re.compile(r"es-n(?P<n>\d+)(?:-r(?P<rank>\d+))?(?:-norm_(?P<norm>rank|none|zscore))?(?P<anti>-anti)?"
                   r"(?:-arith_(?P<arith>paper_a|paper_b))?-s(?P<seed>\d+)")
# es.ablations.arithmetic: a variant -> its ESConfig settings, each paper's seeding with its own arithmetic
# (esgrpo.es.arithmetic). Such a run holds its weights in bf16 (a bf16 copy of an fp32 model: what the papers'
# arithmetic rounds to) and runs on one engine (`arithmetic_run`).
ARITHMETIC_VARIANTS = {"paper_a": {"noise_seeding": "paper_a", "arithmetic": "inplace_sequential"},
                       "paper_b": {"noise_seeding": "paper_b", "arithmetic": "inplace_summed"}}
GRPO_RE = re.compile(r"grpo-g(?P<g>\d+)-s(?P<seed>\d+)")
SEQ_RE = re.compile(r"(?P<first>es|grpo)-then-(?P<second>es|grpo)-s(?P<seed>\d+)")
CL_RE = re.compile(r"cl_(?P<method>es|grpo)-s(?P<seed>\d+)-k(?P<stage>\d+)")
SNAPSHOT_RE = re.compile(r"es-n(?P<n>\d+)-it(?P<it>\d+)-s(?P<seed>\d+)")


def _strip_groups(pattern: re.Pattern) -> str:
    return re.sub(r"\(\?P<[a-z]+>", "(?:", pattern.pattern)


TRAINED_RUN_PATTERN = "|".join(_strip_groups(p) for p in (ES_RE, GRPO_RE, SEQ_RE, CL_RE))
SNAPSHOT_RUN_PATTERN = _strip_groups(SNAPSHOT_RE)
RUN_PATTERN = f"{TRAINED_RUN_PATTERN}|{SNAPSHOT_RUN_PATTERN}"


@dataclass(frozen=True)
class RunName:
    """What a run name says; a part that does not apply to its family is None."""

    family: str  # "es" | "snapshot" | "grpo" | "sequential" | "continual"
    method: str  # the method trained last: "es" | "grpo"
    seed: int
    variant: str  # the name without its seed: what seeds are averaged over (es-n16, cl_es-k2)
    population: int | None = None  # es, snapshot
    normalization: str | None = None  # es, snapshot ("zscore" unless the name says otherwise)
    antithetic: bool | None = None  # es, snapshot
    rank: int | None = None  # es: the rank of low-rank noise; None: full-rank noise
    arithmetic: str | None = None  # es: a key of ARITHMETIC_VARIANTS; None: the exact arithmetic
    group: int | None = None  # grpo
    iterations: int | None = None  # snapshot: its parent's iterations when it was exported
    first: str | None = None  # sequential: the method of the run it starts from
    stage: int | None = None  # continual: 1-based position in sequential.continual


def _without_seed(run: str, match: re.Match) -> str:
    return run[:match.start("seed") - len("-s")] + run[match.end("seed"):]


@functools.lru_cache(maxsize=4096)  # tables parse the run of every row; a grid has few distinct names
def parse_run_name(run: str) -> RunName:
    """The parts of `run`; ValueError naming it when it is not a run name."""
    if m := ES_RE.fullmatch(run):
        return RunName("es", "es", int(m["seed"]), _without_seed(run, m), population=int(m["n"]),
                       normalization=m["norm"] or "zscore", antithetic=bool(m["anti"]),
                       rank=int(m["rank"]) if m["rank"] else None, arithmetic=m["arith"])
    if m := SNAPSHOT_RE.fullmatch(run):  # exported by the main run: z-scored, one-sided
        return RunName("snapshot", "es", int(m["seed"]), _without_seed(run, m), population=int(m["n"]),
                       normalization="zscore", antithetic=False, iterations=int(m["it"]))
    if m := GRPO_RE.fullmatch(run):
        return RunName("grpo", "grpo", int(m["seed"]), _without_seed(run, m), group=int(m["g"]))
    if m := SEQ_RE.fullmatch(run):
        return RunName("sequential", m["second"], int(m["seed"]), _without_seed(run, m), first=m["first"])
    if m := CL_RE.fullmatch(run):
        return RunName("continual", m["method"], int(m["seed"]), _without_seed(run, m), stage=int(m["stage"]))
    raise ValueError(f"run {run!r} is not a run name; expected one of: es-n16-s0, es-n16-norm_rank-s0, "
                     f"es-n16-anti-s0, es-n16-r4-s0, es-n16-arith_paper_a-s0, grpo-g8-s0, es-then-grpo-s0, grpo-then-es-s0, cl_es-s0-k2, "
                     f"es-n16-it10-s0")


# An analysis of an ES run and the main GRPO run of one seed: s0 (the main ES run), arith_paper_a-s0 (the run of
# paper A's arithmetic in the main ES run's place).
PAIR_RE = re.compile(r"(?:arith_(?P<arith>paper_a|paper_b)-)?s(?P<seed>\d+)")
PAIR_PATTERN = _strip_groups(PAIR_RE)  # the pair analyses' wildcard (rules/analysis.smk)
# The dtype a run of a paper's arithmetic holds its weights in, and so its start: the bf16 copy of an fp32
# checkpoint (of a bf16 one, the checkpoint itself).
IN_PLACE_DTYPE = "bfloat16"


def pair_seed(name: str) -> int | None:
    """The seed of a pair analysis's file name (``s0``, ``arith_paper_a-s0`` -> 0); None for a run name."""
    m = PAIR_RE.fullmatch(name)
    return int(m["seed"]) if m else None


def pair_arithmetic(name: str) -> str | None:
    """The paper's arithmetic (a key of ARITHMETIC_VARIANTS) whose run a pair analysis takes as its ES end;
    None: the main (exact) ES run."""
    m = PAIR_RE.fullmatch(name)
    if m is None:
        raise ValueError(f"{name!r} is not a pair analysis name; expected s0 or arith_paper_a-s0")
    return m["arith"]


def pair_name(seed: int, arithmetic: str | None = None) -> str:
    """The file name of the pair analysis of `seed` (with the run of a paper's `arithmetic` as its ES end)."""
    return f"s{seed}" if arithmetic is None else f"arith_{arithmetic}-s{seed}"


def es_name(n: int, seed: int, normalization: str = "zscore", antithetic: bool = False,
            rank: int | None = None, arithmetic: str | None = None) -> str:
    """rank: low-rank noise of that rank; None: full-rank noise. arithmetic: a key of ARITHMETIC_VARIANTS;
    None: the exact arithmetic."""
    norm = "" if normalization == "zscore" else f"-norm_{normalization}"
    low = "" if rank is None else f"-r{int(rank)}"
    arith = "" if arithmetic is None else f"-arith_{arithmetic}"
    return f"es-n{n}{low}{norm}{'-anti' if antithetic else ''}{arith}-s{seed}"


def snapshot_name(n: int, iteration: int, seed: int) -> str:
    return f"es-n{n}-it{iteration}-s{seed}"


def grpo_name(g: int, seed: int) -> str:
    return f"grpo-g{g}-s{seed}"


def sequential_name(first: str, second: str, seed: int) -> str:
    return f"{first}-then-{second}-s{seed}"


def continual_name(method: str, seed: int, stage: int) -> str:
    return f"cl_{method}-s{seed}-k{stage}"


@dataclass
class RunSpec:
    """How to train one run: the method, its settings, and where it starts from."""

    method: str  # "es" | "grpo"
    settings: dict
    seed: int
    init: tuple[str, str] | None = None  # (task, run) whose final model is the start; None = base
    labels: dict = field(default_factory=dict)  # what tables group by (population, normalization, ...)


def es_snapshots(config: dict) -> list[int]:
    """The iterations after which the main ES runs export their model (`es.snapshots`)."""
    return sorted({int(k) for k in (config.get("es") or {}).get("snapshots") or []})


def config_rank(config: dict) -> int | None:
    """The rank of es.settings' low-rank noise (`noise: lowrank`), None for full-rank noise: what the
    main ES runs' names say."""
    settings = config["es"]["settings"]
    return int(settings.get("rank", 1)) if settings.get("noise", "full") == "lowrank" else None


def arithmetic_run_name(config: dict, seed: int, arithmetic: str) -> str:
    """The run of a paper's `arithmetic` (es.ablations.arithmetic) on `seed`: at the main population, full-rank."""
    return es_name(config["es"]["population_sizes"][0], seed, arithmetic=arithmetic)


def main_es_name(config: dict, seed: int) -> str:
    return es_name(config["es"]["population_sizes"][0], seed, rank=config_rank(config))


def main_grpo_name(config: dict, seed: int) -> str:
    return grpo_name(config["grpo"]["group_sizes"][0], seed)


def main_name(config: dict, method: str, seed: int) -> str:
    """The main run of `method` ("es" | "grpo") and `seed`."""
    return main_es_name(config, seed) if method == "es" else main_grpo_name(config, seed)


def reward_rules_setting(config: dict) -> dict:
    """{"reward_rules": the config's rewards.rules} for every job that grades (training runs here,
    evaluations in rules/inputs.smk), so that other rules are other settings and rerun those jobs;
    {} when the config names none (the settings' own default, "esgrpo")."""
    rules = (config.get("rewards") or {}).get("rules")
    return {} if rules is None else {"reward_rules": rules}


def trainer_settings(config: dict, method: str, model: str, task: str) -> dict:
    """`method`'s settings block ("es" | "grpo") as `model` trains on `task`: `{method}.settings`, then the
    model's (`models.<model>.{method}.settings`), then the model's on that task
    (`models.<model>.per_task.<task>.{method}.settings`). Without overrides the block itself, key order
    included (Snakemake compares params by their repr)."""
    spec = config["models"][model]
    own = (spec.get(method) or {}).get("settings") or {}
    on_task = ((((spec.get("per_task") or {}).get(task) or {}).get(method) or {}).get("settings")) or {}
    return {**config[method]["settings"], **own, **on_task}


def eval_settings(config: dict, model: str) -> dict:
    """The eval block as `model`'s checkpoints are evaluated: `eval`, then `models.<model>.eval` (one
    setting for all of a model's evaluations: its base and every run are measured alike)."""
    return {**(config.get("eval") or {}), **(config["models"][model].get("eval") or {})}


def _es_settings(config: dict, model: str, task: str, seed: int, **overrides) -> dict:
    return {**trainer_settings(config, "es", model, task), "seed": seed, **reward_rules_setting(config), **overrides}


def _noise_settings(config: dict, rank: int | None) -> dict:
    """The noise a name's rank asks for, as settings overrides where it differs from es.settings' own (a
    full-rank name under a full-rank config adds no key: its Snakemake params stay as they were)."""
    if rank == config_rank(config):
        return {}
    return {"noise": "full"} if rank is None else {"noise": "lowrank", "rank": int(rank)}


def _grpo_settings(config: dict, model: str, task: str, seed: int, **overrides) -> dict:
    return {**trainer_settings(config, "grpo", model, task), "seed": seed, **reward_rules_setting(config),
            **overrides}


def run_spec(config: dict, model: str, task: str, run: str) -> RunSpec:
    """The spec of `model`'s `run` on `task`; ValueError naming the run when it is not a valid name."""
    name = parse_run_name(run)
    seed = name.seed
    if name.family == "es":
        n, norm, anti = name.population, name.normalization, name.antithetic
        # Only the main run exports snapshots; other runs' settings (Snakemake params) carry no key
        snapshots = es_snapshots(config) if run == main_es_name(config, seed) else []
        settings = _es_settings(config, model, task, seed, population_size=n, normalization=norm, antithetic=anti,
                                **_noise_settings(config, name.rank), **({"snapshots": snapshots} if snapshots else {}),
                                **ARITHMETIC_VARIANTS.get(name.arithmetic, {}))
        labels = {"population": n, "normalization": norm, "antithetic": anti}
        if name.rank is not None:
            labels["rank"] = name.rank
        if name.arithmetic is not None:
            labels["arithmetic"] = name.arithmetic
        return RunSpec("es", settings, seed, labels=labels)
    if name.family == "snapshot":
        n, it = name.population, name.iterations
        parent = es_name(n, seed, rank=config_rank(config))
        if parent != main_es_name(config, seed) or it not in es_snapshots(config):
            raise ValueError(f"run {run!r}: only the main ES run ({main_es_name(config, seed)}) exports "
                             f"snapshots, at es.snapshots = {es_snapshots(config)}")
        settings = {**_no_snapshots(run_spec(config, model, task, parent).settings), "iterations": it}
        return RunSpec("snapshot", settings, seed, init=(task, parent),
                       labels={"population": n, "iterations": it, "snapshot_of": parent})
    if name.family == "grpo":
        return RunSpec("grpo", _grpo_settings(config, model, task, seed, num_generations=name.group), seed,
                       labels={"group": name.group})
    if name.family == "sequential":
        first, second = name.first, name.method
        if first == second:
            raise ValueError(f"run {run!r}: a sequential run needs two different methods")
        spec = run_spec(config, model, task, main_name(config, second, seed))
        return RunSpec(second, _no_snapshots(spec.settings), seed, init=(task, main_name(config, first, seed)),
                       labels={"sequence": f"{first}->{second}"})
    return _continual_spec(config, model, task, run, name)


def _continual_spec(config: dict, model: str, task: str, run: str, name: RunName) -> RunSpec:
    method, seed, stage = name.method, name.seed, name.stage
    order = config["sequential"]["continual"]
    if not 1 <= stage <= len(order):
        raise ValueError(f"run {run!r}: stage {stage} outside 1..{len(order)} (sequential.continual)")
    if order[stage - 1] != task:
        raise ValueError(f"run {run!r}: stage {stage} trains on {order[stage - 1]!r}, not {task!r}")
    if stage == 1:
        init = None
    elif stage == 2:
        init = continual_stage_one_run(config, model, method, seed)
    else:
        init = (order[stage - 2], continual_name(method, seed, stage - 1))
    return RunSpec(method, _continual_settings(config, model, task, method, seed), seed, init=init,
                   labels={"stage": stage})


# sequential.continual_budget key -> (method, the setting it sets)
CONTINUAL_BUDGET_KEYS = {"es_iterations": ("es", "iterations"), "grpo_steps": ("grpo", "steps")}


def _main_settings(config: dict, model: str, task: str, method: str, seed: int) -> dict:
    """The settings of `model`'s main run of `method` on `task`, without its snapshots."""
    return _no_snapshots(run_spec(config, model, task, main_name(config, method, seed)).settings)


def _continual_settings(config: dict, model: str, task: str, method: str, seed: int) -> dict:
    """A continual stage's settings on `task`: the main run's there, at `sequential.continual_budget`'s budget
    if given."""
    budget = (config.get("sequential") or {}).get("continual_budget") or {}
    return {**_main_settings(config, model, task, method, seed),
            **{setting: int(budget[key]) for key, (m, setting) in CONTINUAL_BUDGET_KEYS.items()
               if m == method and key in budget}}


def _no_snapshots(settings: dict) -> dict:
    """A main run's settings for a run that starts elsewhere (only the main run exports snapshots)."""
    return {k: v for k, v in settings.items() if k != "snapshots"}


def planned_runs(config: dict, model: str) -> list[tuple[str, str]]:
    """Every (task, run) the config asks for on `model`, in a stable order."""
    tasks = config["models"][model]["tasks"]
    es, grpo = config.get("es"), config.get("grpo")
    runs: list[tuple[str, str]] = []
    if es:
        for task in tasks:
            runs += [(task, es_name(n, s, rank=config_rank(config))) for n in es["population_sizes"]
                     for s in es["seeds"]]
        ablation = es.get("ablations") or {}
        if ablation.get("task") in tasks:
            task, seeds = ablation["task"], ablation.get("seeds", es["seeds"])
            runs += [(task, es_name(n, s, rank=config_rank(config))) for n in ablation.get("population_sizes", [])
                     for s in seeds]
            runs += [(task, es_name(es["population_sizes"][0], s, rank=r)) for r in ablation.get("ranks", [])
                     for s in seeds]
            runs += [(task, es_name(es["population_sizes"][0], s, normalization=norm, rank=config_rank(config)))
                     for norm in ablation.get("normalization", []) for s in seeds]
            if ablation.get("antithetic"):
                runs += [(task, es_name(es["population_sizes"][0], s, antithetic=True, rank=config_rank(config)))
                         for s in seeds]
            runs += [(task, arithmetic_run_name(config, s, a)) for a in ablation.get("arithmetic", []) for s in seeds]
    if es:
        runs += [(task, snapshot_name(es["population_sizes"][0], k, s)) for task in tasks
                 for k in es_snapshots(config) for s in es["seeds"]]
    if grpo:
        for task in tasks:
            runs += [(task, grpo_name(g, s)) for g in grpo["group_sizes"] for s in grpo["seeds"]]
    seq = config.get("sequential") or {}
    if es and grpo and seq.get("task") in tasks:
        runs += [(seq["task"], sequential_name(a, b, s)) for a, b in (("es", "grpo"), ("grpo", "es"))
                 for s in es["seeds"]]
    for method in seq.get("continual_methods", []) if seq.get("continual") else []:
        if not (es if method == "es" else grpo):
            continue
        for s in (es if method == "es" else grpo)["seeds"]:
            runs.append(continual_stage_one_run(config, model, method, s))
            runs += [(t, continual_name(method, s, k)) for k, t in enumerate(seq["continual"], 1) if k >= 2]
    seen, unique = set(), []
    for item in runs:
        if item not in seen:
            seen.add(item)
            unique.append(item)
    return unique


def continual_stage_one(config: dict, model: str, method: str, seed: int) -> tuple[str, str, str] | None:
    """(task, run, alias): `model`'s main run that is stage 1 of the continual sequence of `method` and
    `seed`, and the continual name tables give it (``cl_es-s0-k1``); None when the continual budget
    differs from the main run's, so stage 1 is the run ``cl_es-s0-k1`` itself."""
    order = config["sequential"]["continual"]
    main = main_name(config, method, seed)
    if _continual_settings(config, model, order[0], method, seed) != _main_settings(config, model, order[0],
                                                                                     method, seed):
        return None
    return order[0], main, continual_name(method, seed, 1)


def continual_stage_one_run(config: dict, model: str, method: str, seed: int) -> tuple[str, str]:
    """(task, run) `model` trains as stage 1: the main run on order[0], or ``cl_es-s0-k1`` when budgets differ."""
    alias = continual_stage_one(config, model, method, seed)
    return alias[:2] if alias else (config["sequential"]["continual"][0], continual_name(method, seed, 1))
