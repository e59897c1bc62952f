"""The transformers ES backend (`es.backend: hf`): theta in this process, members scored by the
population engine (`esgrpo.engines.population`), on a CPU or one GPU.

`HFESBackend` keeps the fp32 master theta of the trainable tensors beside the model; a member's
weights are ``theta + sign * sigma * eps`` (`esgrpo.noise`, full-rank or low-rank), handed to an evaluator
either as a whole `esgrpo.noise.Population` (one population-batched generation, which builds the members in
its own layout; indexed by name it gives stacked ``[N, *shape]`` members) or one member at a time
(``population="sequential"``: d numbers in memory instead of N x d). After every evaluation and
update the model's parameters are rewritten from theta (cast to their dtype), so a bf16 model
keeps its small updates in the fp32 master; `master_from` reads theta0 from the checkpoint's own
(e.g. fp32) tensors instead of the loaded model's (e.g. bf16) ones. Under the papers' in-place arithmetic
(`ESConfig.arithmetic`, `esgrpo.es.arithmetic`) theta is instead a copy of the weights in the model's dtype,
members and updates rounded to it, and theta0 is the weights as loaded (`master_from` unused). `make_population_evaluator` is the evaluator the
workflow uses: population-batched generation, then the reward function.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from esgrpo.distance import StepAgreement, distance
from esgrpo.engines.rollout import eos_token_ids, prompt_texts
from esgrpo.es.arithmetic import InPlacePopulation, apply_update_in_place
from esgrpo.es.backend import THETA_FILE, BackendStart, ESBackend, FitnessResult
from esgrpo.es.ops import apply_update, select_trainable
from esgrpo.es.settings import ESConfig
from esgrpo.noise import Population

__all__ = ["HFESBackend", "load_theta_into_model", "make_population_evaluator", "theta_from_checkpoint",
           "theta_from_model", "trainable_names"]

Row = dict[str, Any]
Theta = dict[str, torch.Tensor]
# A population as an evaluator gets it: the lazy `esgrpo.noise.Population` (a Mapping name -> [N, *shape]
# stacked members; the population engine builds members from it in its own layout) or one member at a time
Members = Population | Iterator[dict[str, torch.Tensor]]
# evaluate_population(population, prompt_rows, cfg, generator=torch.Generator) -> FitnessResult
EvaluatePopulation = Callable[..., FitnessResult]


# --------------------------------------------------------------------------- theta and the model


def trainable_names(model: torch.nn.Module, patterns: Sequence[str]) -> list[str]:
    """Parameter names (as `named_parameters` gives them: tied weights once) matching any glob."""
    return select_trainable([name for name, _ in model.named_parameters()], patterns)


def theta_from_model(model: torch.nn.Module, names: Sequence[str]) -> Theta:
    """The fp32 master copy of the trainable tensors (a clone, on the parameters' device)."""
    params = dict(model.named_parameters())
    return {n: params[n].detach().to(torch.float32).clone() for n in names}


def theta_from_checkpoint(model_ref: str, names: Sequence[str], device: torch.device | str) -> Theta:
    """The fp32 master copy of the trainable tensors read from the checkpoint's files, one tensor at a time.

    A model loaded in bf16 holds the checkpoint rounded; an fp32 checkpoint (an earlier stage's export)
    keeps its small updates only here.
    """
    from esgrpo.models.tensor_files import TensorFiles, local_model_dir

    files = TensorFiles(local_model_dir(model_ref))
    return {n: files.get(n).to(device, torch.float32) for n in names}


@torch.no_grad()
def load_theta_into_model(model: torch.nn.Module, theta: Mapping[str, torch.Tensor]) -> None:
    """Write fp32 tensors into the model's parameters, cast to each parameter's own dtype."""
    params = dict(model.named_parameters())
    for name, value in theta.items():
        params[name].copy_(value)


# --------------------------------------------------------------------------- the backend


class HFESBackend(ESBackend):
    """ES on a transformers model in this process.

    evaluate_population(pop, prompt_rows, cfg, generator=...) -> FitnessResult, where pop is the
    members as an `esgrpo.noise.Population` (population="stacked": a Mapping name -> [N, *shape], built
    on demand) or an iterator of member dicts (population="sequential"); `generator` is a torch.Generator seeded from the
    iteration's rollout seed, for sampled rollouts. `tokenizer` (may be None) is saved with the model.
    master_from: the checkpoint (folder or Hub id) the model was loaded from, to read theta0 in fp32
    when the model runs in a lower precision; None takes theta0 from the model.
    """

    name = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer: Any, evaluate_population: EvaluatePopulation, *,
                 population: Literal["stacked", "sequential"] = "stacked", master_from: str | None = None):
        if population not in ("stacked", "sequential"):
            raise ValueError(f"population must be 'stacked' or 'sequential', got {population!r}")
        self.model, self.tokenizer = model, tokenizer
        self.evaluate_population, self.population = evaluate_population, population
        self.master_from = master_from
        self.theta0: Theta = {}
        self.theta: Theta = {}
        # in place: the weights before this iteration's members (their restores drift); the last update's
        # agreement with the intended step
        self._iteration_start: Theta | None = None
        self._agreement: StepAgreement | None = None

    def start(self, cfg: ESConfig) -> BackendStart:
        self.model.eval()
        names = trainable_names(self.model, cfg.trainable)
        params = dict(self.model.named_parameters())
        self.dtypes = {n: params[n].dtype for n in names}
        self.device = params[names[0]].device
        self.arithmetic = cfg.arithmetic
        if self.arithmetic != "exact":  # no master: the weights in their own dtype
            self.theta0 = {n: params[n].detach().clone() for n in names}
        else:
            self.theta0 = (theta_from_model(self.model, names) if self.master_from is None
                           else theta_from_checkpoint(self.master_from, names, self.device))
        self.theta = {k: v.clone() for k, v in self.theta0.items()}
        self.noise = _noise_of(cfg, self.dtypes)
        load_theta_into_model(self.model, self.theta)
        return BackendStart(parameters=sum(t.numel() for t in self.theta0.values()), tensors=len(names),
                            identity={"names": names, "population": self.population}, start_weights=self.theta0)

    @torch.no_grad()
    def evaluate(self, seeds_signs: Sequence[tuple[int, float]], batch: Sequence[Row], cfg: ESConfig,
                 rollout_seed: int) -> FitnessResult:
        # Evaluators that sample from torch's global RNG (HF generate) also repeat on resume.
        torch.manual_seed(rollout_seed)
        generator = torch.Generator(device=self.device)
        generator.manual_seed(rollout_seed)
        if self.arithmetic != "exact":
            members = InPlacePopulation(self.theta, seeds_signs, cfg.sigma, self.noise)
        else:
            members = Population(self.theta, seeds_signs, cfg.sigma, self.noise, self.dtypes)
        pop: Members = members if self.population == "stacked" else members.members()
        result = self.evaluate_population(pop, batch, cfg, generator=generator)
        del pop
        if self.arithmetic != "exact":  # the weights after the last member's (inexact) restore
            if self._iteration_start is None:
                self._iteration_start = self.theta
            self.theta = members.finish()
        # Restore exactly: a sequential evaluator may have loaded members into the model.
        load_theta_into_model(self.model, self.theta)
        return result

    def apply_update(self, seeds_signs: Sequence[tuple[int, float]], weights: np.ndarray, alpha: float) -> float:
        self._agreement = StepAgreement()
        if self.arithmetic != "exact":
            norm = apply_update_in_place(self.theta, seeds_signs, weights, alpha, self.noise, self.arithmetic,
                                         agreement=self._agreement, start=self._iteration_start)
            self._iteration_start = None
        else:
            norm = apply_update(self.theta, seeds_signs, weights, alpha, self.noise, agreement=self._agreement)
        load_theta_into_model(self.model, self.theta)
        return norm

    def step_agreement(self) -> dict[str, float] | None:
        return None if self._agreement is None else self._agreement.to_dict()

    def distance_from_init(self) -> float:
        return distance(self.theta, self.theta0)

    def save_state(self, folder: Path) -> None:
        from safetensors.torch import save_file

        save_file({k: v.detach().cpu().contiguous() for k, v in self.theta.items()}, str(folder / THETA_FILE))

    def load_state(self, folder: Path) -> None:
        from safetensors.torch import load_file

        saved = load_file(str(folder / THETA_FILE))
        if saved.keys() != self.theta.keys():
            raise ValueError(f"{folder}: tensors differ from this run's trainable set")
        # In the trainable set's order, not the file's (sorted by name): the update and distance norms sum
        # tensor by tensor in dict order, and a resumed run must log the metrics of an uninterrupted one to
        # the last bit (seen on a real Slurm: ~1e-16 apart in update_norm and distance_from_init).
        self.theta = {k: saved[k].to(self.device) for k in self.theta}
        load_theta_into_model(self.model, self.theta)

    def export(self, model_dir: Path) -> None:
        """The fp32 master cast to the model's dtype, saved in HF layout (with the tokenizer if there is one)."""
        load_theta_into_model(self.model, self.theta)
        if self.tokenizer is not None:
            from esgrpo.models.loading import save_model

            save_model(self.model, self.tokenizer, model_dir)
        else:
            from esgrpo.files import atomic_directory

            with atomic_directory(model_dir) as tmp:
                self.model.save_pretrained(tmp)


def _noise_of(cfg: ESConfig, dtypes: Mapping[str, torch.dtype]):
    """The run's `esgrpo.noise.Noise`; paper A's seeding draws in the weights' dtype, which must be one."""
    noise = cfg.noise_spec
    if noise.seeding != "paper_a":
        return noise
    if len(set(dtypes.values())) != 1:
        raise ValueError(f"ESConfig.noise_seeding 'paper_a' draws in the weights' dtype, and the trainable tensors "
                         f"have several: {sorted(str(d) for d in set(dtypes.values()))}")
    return dataclasses.replace(noise, dtype=next(iter(dtypes.values())))


# --------------------------------------------------------------------------- the population evaluator


def make_population_evaluator(model: torch.nn.Module, tokenizer: Any, verifier: Callable[[str, Row], float],
                              generate_fn: Callable[..., Any] | None = None, *,
                              prompt_chunk: int | None = None) -> EvaluatePopulation:
    """The default `evaluate_population`: population-batched generation, then the reward function.

    verifier: ``reward_fn(completion_text, row) -> float`` (the caller binds verifier name,
    reward scheme and format bonus); a completion counts as a success when its reward >= 1.
    generate_fn: ``generate_fn(model, stacked, input_ids, attention_mask, max_new_tokens,
    eos_token_ids (a list), pad_token_id, temperature, top_p, generator)`` returning ``.tokens`` [N,B,L],
    ``.lengths`` [N,B] and ``.entropies`` [N,B,L]; default `esgrpo.engines.population.population_generate`
    on member buffers kept from one evaluation to the next (fresh members of the same shapes every iteration:
    nothing allocated or first-touched after the first).
    A sequential population (an iterator of member dicts) is run one member at a time as N=1.
    prompt_chunk bounds how many prompts one generation call holds (memory).
    """

    kept = {}

    def evaluate(population: Members, prompt_rows: Sequence[Row], cfg: ESConfig,
                 generator: torch.Generator | None = None) -> FitnessResult:
        gen_fn = generate_fn
        if gen_fn is None:
            from esgrpo.engines.population import MemberBuffers, population_generate

            buffers = kept.setdefault("buffers", MemberBuffers())
            gen_fn = functools.partial(population_generate, buffers=buffers)
        scorer = _Scorer(model, tokenizer, verifier, gen_fn, cfg, generator)
        texts = prompt_texts(tokenizer, prompt_rows)
        chunk = prompt_chunk or len(texts)
        members = [population] if isinstance(population, Mapping) else (
            {name: value.unsqueeze(0) for name, value in member.items()} for member in population)
        per_member_group = []
        side = tokenizer.padding_side
        tokenizer.padding_side = "left"  # generation continues at the right edge of every row
        try:
            for stacked in members:
                per_member_group.append(np.concatenate([
                    scorer.score(stacked, texts[start:start + chunk], prompt_rows[start:start + chunk])
                    for start in range(0, len(texts), chunk)], axis=1))
        finally:
            tokenizer.padding_side = side
        return FitnessResult.from_rewards(
            np.concatenate(per_member_group, axis=0), scorer.tokens,
            scorer.entropy_sum / scorer.entropy_count if scorer.entropy_count else math.nan)

    return evaluate


class _Scorer:
    """Generates and grades chunks of one population evaluation, keeping its token and entropy totals."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, verifier: Callable[[str, Row], float],
                 gen_fn: Callable[..., Any], cfg: ESConfig, generator: torch.Generator | None):
        self.model, self.tokenizer, self.verifier, self.gen_fn = model, tokenizer, verifier, gen_fn
        self.cfg, self.generator = cfg, generator
        self.eos = eos_token_ids(model, tokenizer)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos[0]
        self.device = next(model.parameters()).device
        self.tokens, self.entropy_sum, self.entropy_count = 0, 0.0, 0

    def score(self, stacked: Mapping[str, torch.Tensor], texts: Sequence[str], rows: Sequence[Row]) -> np.ndarray:
        """Rewards [members, prompts] of one generation call."""
        cfg, tokenizer = self.cfg, self.tokenizer
        enc = tokenizer(list(texts), return_tensors="pt", padding=True, add_special_tokens=False)
        out = self.gen_fn(self.model, stacked, enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device),
                          cfg.max_new_tokens, self.eos, self.pad, cfg.fitness_temperature, cfg.fitness_top_p,
                          self.generator)
        tokens, lengths = out.tokens.cpu(), out.lengths.cpu().long()
        valid = torch.arange(tokens.shape[-1])[None, None, :] < lengths[..., None]
        self.entropy_sum += float((out.entropies.cpu().double() * valid).sum())
        self.entropy_count += int(valid.sum())
        self.tokens += int(lengths.sum())
        rewards = np.zeros(tuple(lengths.shape))
        cache: dict[tuple[int, str], float] = {}  # greedy members often write the same text
        for n in range(tokens.shape[0]):
            for b, row in enumerate(rows):
                text = tokenizer.decode(tokens[n, b, :lengths[n, b]].tolist(), skip_special_tokens=True)
                if (b, text) not in cache:
                    cache[(b, text)] = float(self.verifier(text, row))
                rewards[n, b] = cache[(b, text)]
        return rewards
