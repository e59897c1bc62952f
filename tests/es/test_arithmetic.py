"""Tests of the papers' ES arithmetic as settings (esgrpo.es.arithmetic, esgrpo.noise's seedings) on the
transformers backend: each variant against the papers' arithmetic computed outside the project
(tests/data/es_arithmetic/make_expected.py, written from the papers' code; its header gives the commits and
the command), the seedings' noise, the population engine's members, and a kill -9 resume in place.
The vLLM workers' variants are tested in tests/es/test_vllm_backend.py against the same file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from esgrpo.es.arithmetic import InPlacePopulation, apply_update_in_place, perturbation
from esgrpo.es.backend import FitnessResult
from esgrpo.es.hf_backend import HFESBackend, make_population_evaluator
from esgrpo.es.loop import train_es
from esgrpo.es.ops import member_seeds
from esgrpo.es.settings import ESConfig
from esgrpo.files import read_jsonl
from esgrpo.noise import Noise, Population
from esgrpo.parameter_names import module_type
from tests.conftest import REPO
from tests.es.helpers import ROWS, members_of, quadratic_evaluator, saved_weights, tiny_llama

torch.set_num_threads(1)
EXPECTED = REPO / "tests" / "data" / "es_arithmetic" / "expected.pt"
HF_VARIANTS = ["paper_a/inplace_sequential", "paper_b/inplace_summed", "paper_b/inplace_sequential",
               "paper_a/exact", "paper_b/exact", "per_tensor/inplace_summed"]


@pytest.fixture(scope="module")
def expected():
    return torch.load(EXPECTED, weights_only=True)


def bf16_model(initial: dict[str, torch.Tensor]):
    """The script's tiny Llama: transformers' names and shapes, its bf16 weights."""
    model = tiny_llama(hidden=16, layers=1, vocab=32).to(torch.bfloat16)
    assert {n: tuple(p.shape) for n, p in model.named_parameters()} == {n: tuple(t.shape) for n, t in initial.items()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(initial[name])
    return model


def fixed_fitness(fitness: list[list[float]], read_members: bool = True):
    """The script's fitness for iteration t, in turn; reads every member it is handed (the chains run)."""
    calls = []

    def evaluate(population, rows, cfg, generator=None):
        if read_members:
            members_of(population)
        calls.append(1)
        return FitnessResult(fitness=np.array(fitness[len(calls) - 1]))

    return evaluate


def script_config(expected, variant: str, **extra) -> ESConfig:
    seeding, arithmetic = variant.split("/")
    return ESConfig(population_size=expected["n"], sigma=expected["sigma"], alpha=expected["alpha"],
                    iterations=expected["iterations"], seed=expected["run_seed"], prompts_per_iteration=2,
                    noise_seeding=seeding, arithmetic=arithmetic, **extra)


@pytest.mark.parametrize("variant,population", [(v, "stacked") for v in HF_VARIANTS]
                         + [(v, "sequential") for v in HF_VARIANTS[:2]])  # the papers' own two, member by member
def test_each_variant_gives_the_direct_computations_weights_bit_for_bit(expected, variant, population, tmp_path):
    model = bf16_model(expected["initial"])
    backend = HFESBackend(model, None, fixed_fitness(expected["fitness"]), population=population)
    train_es(backend, ROWS, script_config(expected, variant), tmp_path / "o", tmp_path / "p", log=lambda s: None)
    want = expected["expected"][f"hf/{variant}"]
    assert backend.theta.keys() == want.keys()
    for name, value in want.items():
        assert backend.theta[name].dtype == value.dtype, name  # bf16 in place, the fp32 master when exact
        assert torch.equal(backend.theta[name], value), name
    initial = expected["initial"]
    assert sum(not torch.equal(want[n].to(torch.bfloat16), initial[n]) for n in want) >= len(want) - 1  # it moved
    if variant.endswith("inplace_summed") or variant.endswith("inplace_sequential"):
        saved = saved_weights(tmp_path / "o")  # the export holds exactly the weights
        assert all(torch.equal(saved[n], want[n]) for n in want)


def test_paper_a_seeding_gives_same_shaped_tensors_identical_noise_and_the_projects_does_not():
    q, o, k = ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.o_proj.weight",
               "model.layers.3.self_attn.k_proj.weight")
    paper_a = Noise("full", 1, "paper_a", torch.bfloat16)
    a = paper_a.draw(123, q, (16, 16))
    assert a.dtype == torch.bfloat16
    assert torch.equal(a, paper_a.draw(123, o, (16, 16))) and torch.equal(a, paper_a.draw(123, k, (16, 16)))
    assert not torch.equal(a, paper_a.draw(124, q, (16, 16)))
    assert torch.equal(paper_a.dense(123, q, (16, 16)), a.float())
    for seeding in ("per_tensor", "paper_b"):
        noise = Noise("full", 1, seeding)
        draws = [noise.draw(123, name, (16, 16)) for name in (q, o, k)]
        assert all(d.dtype == torch.float32 for d in draws)
        assert not torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
        assert not torch.equal(draws[0], Noise("full", 1, "paper_a" if seeding == "paper_b" else "paper_b")
                               .draw(123, q, (16, 16)).float())


def test_default_settings_keep_the_exact_arithmetic_and_the_fingerprint():
    cfg = ESConfig()
    assert (cfg.noise_seeding, cfg.arithmetic) == ("per_tensor", "exact")
    assert "noise_seeding" not in cfg.trajectory_settings() and "arithmetic" not in cfg.trajectory_settings()
    other = ESConfig(noise_seeding="paper_b", arithmetic="inplace_summed").trajectory_settings()
    assert (other["noise_seeding"], other["arithmetic"]) == ("paper_b", "inplace_summed")


@pytest.mark.parametrize("settings,message", [
    ({"noise_seeding": "paper_c"}, "ESConfig.noise_seeding must be one of"),
    ({"arithmetic": "bf16"}, "ESConfig.arithmetic must be one of"),
    ({"noise": "lowrank", "arithmetic": "inplace_summed"}, "ESConfig.noise 'lowrank' needs"),
    ({"noise": "lowrank", "noise_seeding": "paper_a"}, "ESConfig.noise 'lowrank' needs"),
])
def test_bad_arithmetic_settings_are_named(settings, message):
    with pytest.raises(ValueError, match=message):
        ESConfig(**settings)


def test_paper_a_seeding_refuses_weights_of_several_dtypes():
    model = tiny_llama()
    model.model.norm.to(torch.bfloat16)
    backend = HFESBackend(model, None, fixed_fitness([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="several"):
        backend.start(ESConfig(population_size=2, noise_seeding="paper_a", iterations=1))


def test_members_form_a_chain_of_inexact_restores():
    """Member n starts from member n-1's restore, in any order the tensors are asked for; asking again walks
    the chain again; the chain's end is what the weights become."""
    w = {"a": (1.0 + 0.01 * torch.randn(64)).to(torch.bfloat16), "b": (0.02 * torch.randn(8, 8)).to(torch.bfloat16)}
    seeds = member_seeds(3, 0, 4, antithetic=True)
    noise = Noise("full", 1, "paper_b")
    pop = InPlacePopulation(w, seeds, 0.003, noise)
    current = dict(w)
    members = []
    for seed, sign in seeds:
        member = {}
        for name, value in current.items():
            step = perturbation(noise.draw(seed, name, value.shape), sign, 0.003, torch.bfloat16)
            member[name] = value + step
            current[name] = member[name] - step
        members.append(member)
    assert not torch.equal(current["a"], w["a"])  # the restores did not give the weights back
    assert torch.equal(pop.stacked("b"), torch.stack([m["b"].float() for m in members]))
    for n in (3, 1, 2):  # out of order: walked again from the weights
        assert torch.equal(pop.member(n, "a"), members[n]["a"].float())
    ends = pop.finish()
    assert all(torch.equal(ends[n], current[n]) for n in w)
    assert all(torch.equal(pop.theta[n], w[n]) for n in w)  # the weights themselves are only read


def test_update_in_place_rounds_each_member_or_the_sum():
    w = {"x": (1.0 + 0.05 * torch.randn(4096)).to(torch.bfloat16)}
    seeds, z = member_seeds(1, 0, 8, antithetic=False), np.linspace(-1.5, 1.5, 8)
    noise = Noise("full", 1, "paper_a", torch.bfloat16)
    intended = sum(float(c) * noise.dense(s, "x", (4096,)) for (s, _), c in zip(seeds, z * 1e-4 / 8, strict=True))
    for arithmetic in ("inplace_sequential", "inplace_summed"):
        value = {"x": w["x"].clone()}
        norm = apply_update_in_place(value, seeds, z, 1e-4, noise, arithmetic)
        moved = value["x"].double() - w["x"].double()
        assert norm == pytest.approx(float(moved.norm()), rel=1e-12)
        # the intended step is below half an ulp of 1.0 (2^-8): summed, it rounds away almost everywhere
        changed = float((moved != 0).double().mean())
        assert changed < (0.2 if arithmetic == "inplace_summed" else 1.0)
        assert float(intended.abs().max()) < 2 ** -9
    with pytest.raises(ValueError, match="in-place arithmetic must be one of"):
        apply_update_in_place(w, seeds, z, 1e-4, noise, "exact")


def test_the_population_engine_builds_the_chain_members(tokenizer_rows):
    """The population engine (fp32 matmuls) handed the lazy in-place population generates exactly what it
    generates from the chain's members stacked, and leaves the chain's end, also for fp32 weights (where
    it would otherwise build members straight from theta and the noise)."""
    from esgrpo.engines.population import population_generate

    tokenizer, rows = tokenizer_rows
    cfg = ESConfig(population_size=4, sigma=0.05, max_new_tokens=5, arithmetic="inplace_summed")
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_llama(vocab=len(tokenizer), layers=1).to(dtype)
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        seeds = member_seeds(0, 0, 4, antithetic=True)
        verifier = lambda text, row: float(len(text) % 3) / 2  # noqa: E731
        engine = make_population_evaluator(model, tokenizer, verifier, population_generate)
        lazy = InPlacePopulation(weights, seeds, cfg.sigma, cfg.noise_spec)
        got = engine(lazy, rows, cfg)
        stacked = InPlacePopulation(weights, seeds, cfg.sigma, cfg.noise_spec)
        want = engine({n: stacked.stacked(n) for n in weights}, rows, cfg)
        np.testing.assert_array_equal(got.fitness, want.fitness)
        assert got.generated_tokens == want.generated_tokens and got.entropy == want.entropy
        exact = engine(Population({n: w.float() for n, w in weights.items()}, seeds, cfg.sigma,
                                  dtypes={n: dtype for n in weights}), rows, cfg)
        assert exact.generated_tokens > 0
        ends, fresh = lazy.finish(), stacked.finish()
        assert all(torch.equal(ends[n], fresh[n]) for n in weights)


@pytest.mark.parametrize("variant", ["paper_a/inplace_sequential", "paper_b/inplace_summed"])
def test_training_through_the_population_engine_updates_the_chain_end(tokenizer_rows, variant, tmp_path):
    """train_es with the real population engine (which generates in inference mode) and a paper's arithmetic:
    the update adds into the weights the members' restores left, two iterations running, as `make run` does."""
    from esgrpo.engines.population import population_generate

    tokenizer, rows = tokenizer_rows
    seeding, arithmetic = variant.split("/")
    cfg = ESConfig(population_size=4, sigma=0.05, alpha=0.02, max_new_tokens=4, iterations=2,
                   prompts_per_iteration=2, noise_seeding=seeding, arithmetic=arithmetic)
    model = tiny_llama(vocab=len(tokenizer), layers=1).to(torch.bfloat16)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    verifier = lambda text, row: float(len(text) % 3) / 2  # noqa: E731
    backend = HFESBackend(model, tokenizer, make_population_evaluator(model, tokenizer, verifier, population_generate))
    summary = train_es(backend, rows, cfg, tmp_path / "o", tmp_path / "p", log=lambda s: None)
    assert summary.updates >= 1 and all(t.dtype == torch.bfloat16 for t in backend.theta.values())
    assert any(not torch.equal(backend.theta[n], start[n]) for n in start)
    assert all(torch.equal(p.detach(), backend.theta[n]) for n, p in model.named_parameters())


@pytest.fixture(scope="module")
def tokenizer_rows():
    from esgrpo.models.default import train_tokenizer

    tokenizer = train_tokenizer(["12+3=15", "what is 4*5? 20", "7-2=5 done"], vocab_size=280)
    rows = [{"id": str(i), "prompt": [{"role": "user", "content": q}], "answer": "x"}
            for i, q in enumerate(["1+2", "what is 33?"])]
    return tokenizer, rows


# --------------------------------------------------------------------------- kill -9 and resume, in place


def _kill_resume_in_place(out_dir: str, progress_dir: str, iterations: int, sleep_s: float,
                          variant: str = "paper_a/inplace_sequential") -> dict:
    """The run the kill test repeats: a bf16 tiny Llama, a paper's arithmetic, seeded noisy fitness."""
    torch.set_num_threads(1)
    model = tiny_llama(layers=2, seed=3).to(torch.bfloat16)
    target = {k: v.detach().float() + 0.1 for k, v in model.named_parameters()}
    quadratic = quadratic_evaluator(target)

    def slow(population, rows, cfg, generator=None):
        time.sleep(sleep_s)
        result = quadratic(population, rows, cfg)
        jitter = torch.rand(len(result.fitness), generator=generator, dtype=torch.float64).numpy()
        return FitnessResult(fitness=result.fitness + jitter)

    cfg = ESConfig(population_size=6, sigma=0.02, alpha=0.01, iterations=iterations, checkpoint_every=2,
                   prompts_per_iteration=3, seed=5, noise_seeding=variant.split("/")[0],
                   arithmetic=variant.split("/")[1])
    return train_es(HFESBackend(model, None, slow), ROWS, cfg, out_dir, progress_dir, log=lambda s: None)


@pytest.mark.parametrize("variant", ["paper_a/inplace_sequential", "paper_b/inplace_summed"])
def test_sigkill_then_resume_in_place_gives_identical_weights(tmp_path, variant):
    _kill_resume_in_place(str(tmp_path / "ref"), str(tmp_path / "ref_prog"), 6, 0.0, variant)
    out, prog = tmp_path / "run", tmp_path / "run_prog"
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from tests.es.test_arithmetic import _kill_resume_in_place; "
            f"_kill_resume_in_place({str(out)!r}, {str(prog)!r}, 6, 0.4, {variant!r})")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    child = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and child.poll() is None:
        steps = [int(p.name.split("-")[1]) for p in prog.glob("step-*")]
        if steps and max(steps) == 2 and (out / "metrics.jsonl").exists() \
                and len(read_jsonl(out / "metrics.jsonl")) >= 3:
            os.kill(child.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    child.wait()
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()[-2000:]
    assert not (out / "summary.json").exists()
    summary = _kill_resume_in_place(str(out), str(prog), 6, 0.0, variant)
    assert summary.resumed_from in (2, 4) and summary.settings["arithmetic"] == variant.split("/")[1]
    ref, got = saved_weights(tmp_path / "ref"), saved_weights(out)
    assert ref.keys() == got.keys() and all(v.dtype == torch.bfloat16 for v in got.values())
    for k in ref:
        assert torch.equal(ref[k], got[k]), k
    rows, ref_rows = read_jsonl(out / "metrics.jsonl"), read_jsonl(tmp_path / "ref" / "metrics.jsonl")
    for a, b in zip(rows, ref_rows, strict=True):
        for k in ("fitness_mean", "update_norm", "distance_from_init"):
            assert a[k] == b[k], k


@pytest.mark.parametrize("variant", ["paper_a/inplace_sequential", "paper_b/inplace_summed", "paper_b/exact"])
def test_step_agreement_is_the_weights_step_against_the_fp32_sum(expected, variant, tmp_path):
    """metrics.jsonl's step_cosine and changed_share (esgrpo.distance.StepAgreement): one iteration's change of
    the weights (the restores' drift included) against the fp32 sum of coefficients times noise, recomputed here
    in numpy from the weights before and after. Exact arithmetic takes the intended step to float32 rounding;
    in place in bf16 it does not."""
    import dataclasses

    from esgrpo.es.ops import normalize_fitness

    cfg = dataclasses.replace(script_config(expected, variant), iterations=1)
    backend = HFESBackend(bf16_model(expected["initial"]), None, fixed_fitness(expected["fitness"]))
    summary = train_es(backend, ROWS, cfg, tmp_path / "o", tmp_path / "p", log=lambda s: None)
    row = read_jsonl(tmp_path / "o" / "metrics.jsonl")[0]

    seeds_signs = member_seeds(cfg.seed, 0, cfg.population_size, cfg.antithetic)
    weights = normalize_fitness(expected["fitness"][0], cfg.normalization, cfg.unit_rms_weights)
    dot = applied_sq = intended_sq = changed = elements = 0.0
    by_module: dict[str, list[int]] = {}  # module type -> [changed, elements]
    for name, start in expected["initial"].items():
        intended = sum(cfg.alpha / len(seeds_signs) * w * sign
                       * backend.noise.draw(seed, name, start.shape, start.device).double().numpy()
                       for (seed, sign), w in zip(seeds_signs, weights, strict=True))
        applied = backend.theta[name].double().numpy() - start.double().numpy()
        dot += float((applied * intended).sum())
        applied_sq += float((applied ** 2).sum())
        intended_sq += float((intended ** 2).sum())
        changed += int(np.count_nonzero(applied))
        elements += applied.size
        counts = by_module.setdefault(module_type(name), [0, 0])
        counts[0] += int(np.count_nonzero(applied))
        counts[1] += applied.size
    cosine = dot / np.sqrt(applied_sq * intended_sq)
    assert row["step_cosine"] == pytest.approx(cosine, rel=1e-9, abs=1e-12)
    assert row["changed_share"] == changed / elements
    assert row["changed_share_by_module"] == {kind: c / n for kind, (c, n) in sorted(by_module.items())}
    assert {"attention", "mlp", "norm", "embedding"} <= set(by_module)
    assert summary.extra["step_cosine_mean"] == row["step_cosine"]
    assert summary.extra["changed_share_by_module_mean"] == row["changed_share_by_module"]
    if variant.endswith("exact"):
        assert cosine > 1 - 1e-9
    else:  # bf16 rounding of the members' restores and the update: visibly not the intended step
        assert cosine < 0.999 and changed / elements < 0.99
