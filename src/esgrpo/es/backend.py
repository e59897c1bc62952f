"""The interface between the ES trainer (`esgrpo.es.loop.train_es`) and whatever holds and runs the weights.

The trainer owns the loop: member seeds, prompt batches, fitness shaping, metrics, checkpoints,
snapshots and the summary. A backend owns the weights: an fp32 master copy theta of the trainable
tensors, the population built from it for given member seeds, the update, and the export. Only
seeds, scalars and file paths cross the interface, so the trainer never imports transformers'
generation or vLLM. Two backends implement it: `esgrpo.es.hf_backend.HFESBackend` (the transformers
population engine, CPU or one GPU) and `esgrpo.es.vllm_backend.VLLMESBackend` (one vLLM engine per GPU).
Both build members and the update with `esgrpo.es.ops`, so their trajectories are the same
function of (seed, iteration, tensor name).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from esgrpo.engines.rollout import ENTROPY_EXACT

if TYPE_CHECKING:
    from esgrpo.es.settings import ESConfig

__all__ = ["THETA_FILE", "BackendStart", "ESBackend", "FitnessResult"]

THETA_FILE = "theta.safetensors"  # theta, fp32, in a checkpoint folder (`save_state` / `load_state`); the vLLM
# backend streams it into theta-0000i-of-0000n.safetensors shards when it exceeds one (esgrpo.models.tensor_files)


@dataclass
class FitnessResult:
    """What evaluating one population on one prompt batch gives.

    fitness: [N] mean reward per member; success: [N, B] correct flags (reward >= 1) per member
    and prompt, for the population's JS diversity (None if unknown); generated_tokens: tokens
    generated in this evaluation; entropy: mean token entropy (NaN if unknown), of the kind
    `entropy_estimator` names ("exact" from the full distribution; the vLLM backend's estimate or
    bound, `esgrpo.engines.vllm_engine.entropy_estimator`); rollouts: completions generated (None: N x B).
    """

    fitness: np.ndarray
    success: np.ndarray | None = None
    generated_tokens: int = 0
    entropy: float = math.nan
    rollouts: int | None = None
    entropy_estimator: str = ENTROPY_EXACT

    @classmethod
    def from_rewards(cls, rewards: np.ndarray, generated_tokens: int, entropy: float,
                     entropy_estimator: str = ENTROPY_EXACT) -> FitnessResult:
        """From the rewards [N, B] of N members on B prompts: a member's fitness is its mean reward, a
        completion a success at reward >= 1 (every backend's rule, so their fitness is one function)."""
        rewards = np.asarray(rewards, dtype=float)
        if rewards.ndim != 2:
            raise ValueError(f"rewards must be [members, prompts], got shape {rewards.shape}")
        return cls(fitness=rewards.mean(axis=1), success=rewards >= 1.0, generated_tokens=int(generated_tokens),
                   entropy=float(entropy), rollouts=int(rewards.size), entropy_estimator=entropy_estimator)


@dataclass
class BackendStart:
    """What a backend reports once it holds the starting weights.

    parameters: d, the trainable parameters (the norm theory's alpha * sqrt(updates * d / N));
    tensors: how many trainable tensors; identity: JSON-able facts that make another run (tensor
    names, the model reference), part of the resume fingerprint; start_weights: tensors whose bytes
    join the fingerprint (the fp32 theta0), or None when `identity` already names the start.
    """

    parameters: int
    tensors: int
    identity: dict[str, Any] = field(default_factory=dict)
    start_weights: Mapping[str, Any] | None = None


class ESBackend(ABC):
    """Holds theta and evaluates populations around it; see the module docstring."""

    name: str = "?"  # the `es.backend` value: in log lines and the summary

    @abstractmethod
    def start(self, cfg: ESConfig) -> BackendStart:
        """Take the fp32 master copy theta0 of the tensors `cfg.trainable` selects; theta = theta0."""

    @abstractmethod
    def evaluate(self, seeds_signs: Sequence[tuple[int, float]], batch: Sequence[dict], cfg: ESConfig,
                 rollout_seed: int) -> FitnessResult:
        """Build members ``theta + sign * sigma * eps(seed)`` and score each on `batch`; theta is unchanged.

        Sampled rollouts (``cfg.fitness_temperature > 0``) draw from `rollout_seed`, so they repeat on resume.
        """

    @abstractmethod
    def apply_update(self, seeds_signs: Sequence[tuple[int, float]], weights: np.ndarray, alpha: float) -> float:
        """``theta += alpha / N * sum_n w_n sign_n eps_n`` (`esgrpo.es.ops.apply_update`); returns ||step||."""

    @abstractmethod
    def distance_from_init(self) -> float:
        """||theta - theta0||."""

    @abstractmethod
    def save_state(self, folder: Path) -> None:
        """Write theta (fp32) into a checkpoint folder; `load_state` reads it back exactly."""

    @abstractmethod
    def load_state(self, folder: Path) -> None:
        """theta <- the checkpoint in `folder` (a run resuming)."""

    @abstractmethod
    def export(self, model_dir: Path) -> None:
        """The model with theta, as a transformers-loadable folder written whole."""

    def summary(self) -> dict[str, Any]:
        """Backend facts for the run's summary.json."""
        return {}

    def step_agreement(self) -> dict[str, float] | None:
        """The last update's `esgrpo.distance.StepAgreement` (step_cosine, changed_share); None where the
        backend does not measure it."""
        return None
