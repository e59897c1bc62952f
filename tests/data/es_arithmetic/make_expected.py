"""The papers' ES arithmetic computed directly, outside the project, for tests/es/test_arithmetic.py.

Written from a reading of the papers' workers (nothing imported from esgrpo; torch, numpy and hashlib only):
- paper A: Bhoy1/ESvsGRPO at 43eed8c, src/es_vs_grpo/train/es_worker.py (perturb_self_weights,
  restore_self_weights) and src/es_vs_grpo/train/es.py (per_seed_coeffs and the update loop);
- paper B: yunpengba7/understanding-es at 240d87852c3d51bcf5e6c909e7ee78bae5286fe7, src/es_reproduction/worker.py
  (_stable_tensor_id, _mixed_seed, _apply_seeded_noise, _apply_population_update).
The structure follows the papers' (member by member over every tensor), not the project's.

A tiny Llama's tensors (the names and shapes of transformers' LlamaForCausalLM with vocab 32, hidden 16,
intermediate 32, one layer, 2 heads, untied head), bf16, in HF layout and in vLLM's fused layout (qkv_proj,
gate_up_proj). Three iterations of N = 4 members with the project's member seeds (numpy SeedSequence
[run seed, iteration, 0], as esgrpo.es.ops.member_seeds draws them) and fixed fitness values, z-scored
(population std, + 1e-8). Every member is perturbed and restored in order on one engine, then the update.

Regenerate (from the repository root):
    /work/main/.venv/bin/python tests/data/es_arithmetic/make_expected.py tests/data/es_arithmetic/expected.pt
(torch 2.x CPU generators; the file records torch's version.)
"""

import hashlib
import sys

import numpy as np
import torch

RUN_SEED, ITERATIONS, N, SIGMA, ALPHA = 11, 3, 4, 0.01, 0.004
HF_SHAPES = {
    "model.embed_tokens.weight": (32, 16),
    "model.layers.0.self_attn.q_proj.weight": (16, 16),
    "model.layers.0.self_attn.k_proj.weight": (16, 16),
    "model.layers.0.self_attn.v_proj.weight": (16, 16),
    "model.layers.0.self_attn.o_proj.weight": (16, 16),
    "model.layers.0.mlp.gate_proj.weight": (32, 16),
    "model.layers.0.mlp.up_proj.weight": (32, 16),
    "model.layers.0.mlp.down_proj.weight": (16, 32),
    "model.layers.0.input_layernorm.weight": (16,),
    "model.layers.0.post_attention_layernorm.weight": (16,),
    "model.norm.weight": (16,),
    "lm_head.weight": (32, 16),
}


def blake8(name):
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8"), digest_size=8).digest(), "little")


def project_mix(seed, name):
    """The project's per-tensor seed: blake2b-8 of the two values as little-endian 64-bit words, 63 bits."""
    data = b"".join(int(v & ((1 << 64) - 1)).to_bytes(8, "little") for v in (seed, blake8(name)))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") & ((1 << 63) - 1)


def noise(seeding, seed, name, p):
    gen = torch.Generator()
    if seeding == "paper_a":  # every tensor from the member seed, drawn in the weight's dtype
        gen.manual_seed(int(seed))
        return torch.randn(p.shape, dtype=p.dtype, generator=gen)
    gen.manual_seed(((int(seed) ^ blake8(name)) & 0xFFFFFFFFFFFFFFFF) if seeding == "paper_b"
                    else project_mix(seed, name))
    return torch.randn(p.shape, generator=gen, dtype=torch.float32)


def initial():
    torch.manual_seed(1234)
    return {n: (1.0 + 0.1 * torch.randn(s) if len(s) == 1 else 0.02 * torch.randn(s)).to(torch.bfloat16)
            for n, s in HF_SHAPES.items()}


def fused(hf):
    out = {}
    for n, t in hf.items():
        if ".k_proj." in n or ".v_proj." in n or ".up_proj." in n:
            continue
        if ".q_proj." in n:
            out[n.replace("q_proj", "qkv_proj")] = torch.cat(
                [t, hf[n.replace("q_proj", "k_proj")], hf[n.replace("q_proj", "v_proj")]])
        elif ".gate_proj." in n:
            out[n.replace("gate_proj", "gate_up_proj")] = torch.cat([t, hf[n.replace("gate_proj", "up_proj")]])
        else:
            out[n] = t
    return out


def seeds_of(t):
    rng = np.random.default_rng(np.random.SeedSequence([RUN_SEED, t, 0]))
    return [int(s) for s in rng.integers(0, (1 << 63) - 1, size=N, dtype=np.int64, endpoint=True)]


FITNESS = [np.array([0.25, 0.5, 0.0, 1.0]), np.array([0.75, 0.25, 0.5, 0.125]), np.array([0.0, 0.375, 1.0, 0.5])]


def zscores(f):
    return (f - f.mean()) / (f.std() + 1e-8)


def paper_a(params, seeding):
    """es_worker.py: perturb adds 1.0 * sigma * noise, restore adds -sigma * noise; es.py: coefficients
    (alpha / N) * z_n, each applied with perturb_self_weights, in member order."""
    for t in range(ITERATIONS):
        seeds = seeds_of(t)
        for s in seeds:
            for name, p in params.items():
                p.add_((1.0 * SIGMA * noise(seeding, s, name, p)).to(p.dtype))
            for name, p in params.items():
                p.add_((-SIGMA * noise(seeding, s, name, p)).to(p.dtype))
        for s, z in zip(seeds, zscores(FITNESS[t]), strict=True):
            coeff = (ALPHA / N) * float(z)
            for name, p in params.items():
                p.add_((1.0 * coeff * noise(seeding, s, name, p)).to(p.dtype))
    return params


def paper_b(params, seeding):
    """worker.py: delta = noise * sigma in fp32, cast, added; revert with -sigma; the update sums
    noise * (lr / N * weight) in fp32, casts once and adds."""
    for t in range(ITERATIONS):
        seeds = seeds_of(t)
        for sigma in [x for s in seeds for x in ((s, SIGMA), (s, -SIGMA))]:
            s, scaled = sigma
            for name, p in params.items():
                delta = noise(seeding, s, name, p).float()
                delta.mul_(float(scaled))
                p.add_(delta.to(dtype=p.dtype))
        scale = ALPHA / N
        for name, p in params.items():
            total = torch.zeros(p.shape, dtype=torch.float32)
            for s, w in zip(seeds, zscores(FITNESS[t]), strict=True):
                total.add_(noise(seeding, s, name, p).float(), alpha=float(scale * float(w)))
            p.add_(total.to(dtype=p.dtype))
    return params


def exact(params, seeding):
    """The project's exact arithmetic (esgrpo.es.ops.apply_update) with a paper's noise: an fp32 master,
    members from it (restore exact), the update sum_seed c_seed eps_seed in fp32, times alpha / N, added."""
    theta = {n: p.float() for n, p in params.items()}
    for t in range(ITERATIONS):
        for name, value in theta.items():
            total = torch.zeros(value.shape, dtype=torch.float32)
            for s, w in zip(seeds_of(t), zscores(FITNESS[t]), strict=True):
                total.add_(noise(seeding, s, name, params[name]).float(), alpha=float(w) * 1.0)
            total.mul_(ALPHA / N)
            value.add_(total)
    return theta


def main(path):
    hf = initial()
    out = {"torch": str(torch.__version__), "run_seed": RUN_SEED, "iterations": ITERATIONS, "n": N, "sigma": SIGMA,
           "alpha": ALPHA, "fitness": [f.tolist() for f in FITNESS], "initial": hf, "expected": {}}
    for layout, start in (("hf", hf), ("vllm", fused(hf))):
        cases = {("paper_a", "inplace_sequential"): paper_a, ("paper_b", "inplace_summed"): paper_b,
                 ("paper_b", "inplace_sequential"): paper_a, ("paper_a", "exact"): exact, ("paper_b", "exact"): exact}
        if layout == "hf":  # the project's seeding names HF tensors only
            cases[("per_tensor", "inplace_summed")] = paper_b
        for (seeding, arithmetic), run in cases.items():
            result = run({n: t.clone() for n, t in start.items()}, seeding)
            out["expected"][f"{layout}/{seeding}/{arithmetic}"] = result
    torch.save(out, path)


if __name__ == "__main__":
    main(sys.argv[1])
