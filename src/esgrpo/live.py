"""Live training curves and ETAs: the scalars ES and GRPO both log, under one name per run.

A config's `logging` block (schemas/config.schema.yaml) picks the backends: TensorBoard (the default,
when the `tensorboard` package is installed), Weights & Biases, trackio. Both trainers hand every
metrics row (the row `metrics.jsonl` gets, `esgrpo.es.loop` / `esgrpo.grpo.trainer`) to `LiveLog.row`,
which writes the same tags for either method, so one TensorBoard over the grid's logdir draws ES and
GRPO curves on the same charts:

    tensorboard --logdir results/default/tensorboard  # runs: {model}/{task}/{run}

Nothing here feeds back into training: the writers only read the rows (no RNG, no model access), so
tables and weights are the same with logging on or off.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["BACKENDS", "ENV", "SHARED", "Eta", "LiveLog", "LiveSettings", "format_seconds", "live_settings"]

BACKENDS = ("tensorboard", "wandb", "trackio")
ENV = "ESGRPO_LIVE"  # JSON set by rules/config.smk from the config's logging block (see `live_settings`)

# tag -> metrics.jsonl key: the same for an ES iteration and a GRPO step (step = iteration / step number).
SHARED = {
    "train/reward": "fitness_mean",
    "train/reward_std": "fitness_std",
    "train/entropy": "entropy",
    "train/update_norm": "update_norm",
    "train/distance_from_init": "distance_from_init",
    "train/generated_tokens": "generated_tokens",
    "train/rollouts": "rollouts",
    "train/seconds": "seconds",
}
# The reward again with a budget on the step axis (TensorBoard's x axis is the step): the matched-budget
# comparisons of the papers' tables, while the runs train.
BUDGET_AXES = {"train/reward_by_rollouts": "rollouts", "train/reward_by_generated_tokens": "generated_tokens"}
# Row keys that are counters or labels, not curves.
NOT_CURVES = {"iteration", "updates", "prompts", "method", "entropy_estimator"}


@dataclass(frozen=True)
class LiveSettings:
    """Where one run's live curves go: its backends, TensorBoard folder, name, project and config."""

    report_to: tuple[str, ...] = ()
    logdir: str | None = None  # this run's TensorBoard folder ({results}/tensorboard/{model}/{task}/{run})
    run_name: str = "run"  # {model}/{task}/{run}: the same in every backend
    project: str = "esgrpo"
    config: dict = field(default_factory=dict)  # the run's settings, shown by W&B / trackio

    def __post_init__(self) -> None:
        unknown = [b for b in self.report_to if b not in BACKENDS]
        if unknown:
            raise ValueError(f"logging.report_to: unknown backend(s) {unknown}; allowed: {list(BACKENDS)}")
        if "tensorboard" in self.report_to and not self.logdir:
            raise ValueError("logging.report_to has tensorboard but no logdir was given")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "report_to": list(self.report_to)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> LiveSettings:
        d = dict(d or {})
        return cls(**{**d, "report_to": tuple(d.get("report_to") or ())})


def live_settings(model: str, task: str, run: str, config: Mapping[str, Any] | None = None,
                  env: Mapping[str, str] | None = None) -> LiveSettings:
    """One run's settings from `ESGRPO_LIVE` ({"report_to", "root", "project"}; absent: no live curves).

    rules/config.smk sets the variable from the config's logging block instead of passing it as a rule
    parameter: a parameter would retrain every run when only the logging changes.
    """
    text = (os.environ if env is None else env).get(ENV)
    if not text:
        return LiveSettings()
    block = json.loads(text)
    root = block.get("root")
    return LiveSettings(report_to=tuple(block.get("report_to") or ()),
                        logdir=str(Path(root) / model / task / run) if root else None,
                        run_name=f"{model}/{task}/{run}", project=block.get("project") or "esgrpo",
                        config=dict(config or {}))


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


class LiveLog:
    """The open writers of one run; `row` writes a metrics row to each. A context manager.

    `resumed_after`: the iteration the run resumed after (0: a fresh start). A fresh start clears the
    run's TensorBoard folder (an earlier run's events would mix in); a resume opens it with
    ``purge_step`` so that TensorBoard drops the interrupted run's events past the checkpoint, which the
    resumed run logs again.
    """

    def __init__(self, settings: LiveSettings | None, resumed_after: int = 0,
                 log: Callable[[str], Any] = print) -> None:
        self.settings = settings or LiveSettings()
        self.writers: list[Any] = []
        self._open(int(resumed_after), log)

    def _open(self, resumed_after: int, log: Callable[[str], Any]) -> None:
        s = self.settings
        missing = [b for b in s.report_to if b != "tensorboard" and not _installed(b)]
        if missing:  # asked for by name in the config: an error before training, not a silent gap
            raise ImportError(f"logging.report_to lists {missing}, not installed here: pip install "
                              f"{' '.join(missing)}, or remove {missing} from the config's logging.report_to")
        if "tensorboard" in s.report_to:
            if _installed("tensorboard"):
                from torch.utils.tensorboard import SummaryWriter

                if resumed_after == 0:
                    shutil.rmtree(s.logdir, ignore_errors=True)
                self.writers.append(_TensorBoard(SummaryWriter(
                    s.logdir, purge_step=resumed_after + 1 if resumed_after else None)))
                log(f"live curves: tensorboard --logdir {Path(s.logdir).parents[2]} (run {s.run_name})")
            else:  # the default backend: skipped with a note where the package is absent
                log("live curves: tensorboard is not installed (pip install tensorboard); no event files")
        if "wandb" in s.report_to:
            import wandb

            self.writers.append(_Hosted(wandb.init(project=s.project, name=s.run_name, config=s.config,
                                                   dir=s.logdir and str(Path(s.logdir).parents[3]))))
        if "trackio" in s.report_to:
            import trackio

            trackio.init(project=s.project, name=s.run_name, config=s.config)
            self.writers.append(_Hosted(trackio))  # its module-level log / finish act on the run just begun

    def row(self, row: Mapping[str, Any]) -> None:
        """Write one metrics row at its iteration: the shared tags, the budget axes, then every other
        numeric key under ``{method}/{key}`` (ES's fitness spread and JS diversity, GRPO's loss, KL, ...)."""
        if not self.writers:
            return
        step = int(row["iteration"])
        scalars = {tag: row[key] for tag, key in SHARED.items() if key in row}
        used = set(SHARED.values())
        scalars.update({f"{row['method']}/{k}": v for k, v in row.items()
                        if k not in used and k not in NOT_CURVES and isinstance(v, int | float)})
        scalars = {tag: float(v) for tag, v in scalars.items() if math.isfinite(float(v))}
        budgets = {tag: (int(row[axis]), float(row["fitness_mean"])) for tag, axis in BUDGET_AXES.items()
                   if axis in row and math.isfinite(float(row.get("fitness_mean", math.nan)))}
        for writer in self.writers:
            writer.write(step, scalars, budgets)

    def close(self) -> None:
        for writer in self.writers:
            writer.close()
        self.writers = []

    def __enter__(self) -> LiveLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _TensorBoard:
    def __init__(self, writer: Any) -> None:
        self.writer = writer

    def write(self, step: int, scalars: dict[str, float], budgets: dict[str, tuple[int, float]]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        for tag, (at, value) in budgets.items():
            self.writer.add_scalar(tag, value, at)
        self.writer.flush()  # live: each row on disk as it comes, not at the writer's 2-minute flush

    def close(self) -> None:
        self.writer.close()


class _Hosted:
    """W&B and trackio runs share one call shape: ``run.log(dict, step=...)``, then finish. Their charts
    take any logged key (train/rollouts, train/generated_tokens) as the x axis: no budget tags needed."""

    def __init__(self, run: Any) -> None:
        self.run = run

    def write(self, step: int, scalars: dict[str, float], budgets: dict[str, tuple[int, float]]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


def format_seconds(seconds: float) -> str:
    """``1h02m``, ``3m05s``, ``42s``: an ETA at the precision a reader needs."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Eta:
    """Time left from the pace of this process: the work done since it started (a resumed run's earlier
    iterations ran elsewhere and do not count), extrapolated over what remains."""

    def __init__(self, total: float, done: float = 0.0) -> None:
        self.total, self.start_done, self.began = float(total), float(done), time.perf_counter()

    def __call__(self, done: float) -> str:
        progressed = float(done) - self.start_done
        if progressed <= 0:
            return "eta ?"
        left = (time.perf_counter() - self.began) / progressed * (self.total - float(done))
        return f"eta {format_seconds(left)}"
