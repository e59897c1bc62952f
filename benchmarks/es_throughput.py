"""ES rollout throughput: N separate `model.generate` calls vs one population-batched generator.

    python benchmarks/es_throughput.py [--quick] [--threads 1,2] [--members 16] [--repeats 3]

For each torch thread count, in this one process: dense fp32 matmul FLOP/s (a 2048^3 `torch.mm`
after warm-up), then for a ~0.2M and a ~4M parameter random Llama, N members (theta + sigma *
eps_n) on B left-padded prompts of ~20 tokens, greedy, a fixed number of new tokens (no EOS, so
both paths generate exactly the same number of tokens):
  (a) `sequential_generate`  - load each member's weights, call `model.generate` (public ES code's shape)
  (b) `population_generate`  - all members in one batched forward per step
It prints generated tokens/s of each, the ratio b/a, whether (a) and (b) emitted identical
tokens, and the model FLOP/s each achieved as a fraction of the measured matmul FLOP/s.

Model FLOPs count what a forward of every processed position needs: 2 * (decoder-layer params)
per position (prompt positions included, pad positions too: both paths compute them), 2 * V * H
for each next-token logit row, and 4 * context * heads * head_dim per layer and position for
attention (causal context). Timings are the best of `--repeats` runs (other processes share the
CPUs; the minimum is the least disturbed run) and include preparing/loading member weights.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from esgrpo.engines.population import population_generate, sequential_generate  # noqa: E402
from esgrpo.models.fingerprint import matmul_gflops  # noqa: E402


@dataclass
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie: bool


SMALL = Shape("small", hidden=64, layers=3, heads=4, kv_heads=2, intermediate=192, vocab=400, tie=False)
LARGE = Shape("4M", hidden=256, layers=4, heads=4, kv_heads=2, intermediate=1024, vocab=400, tie=False)


def build(shape: Shape, seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                         num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                         intermediate_size=shape.intermediate, tie_word_embeddings=shape.tie,
                         max_position_embeddings=256, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    # A larger init than 0.02 gives logits with real gaps, as in a trained model: float-rounding
    # near-ties (which could flip an argmax between two correct implementations) become rare.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.1)
    return model


def members(model: torch.nn.Module, n: int, sigma: float, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {name: p.detach()[None] + sigma * torch.randn((n, *p.shape), generator=g)
            for name, p in model.named_parameters()}


def prompts(batch: int, length: int, vocab: int, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of lengths length-6 .. length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for b in range(batch):
        pad = int(torch.randint(0, 7, (1,), generator=g))
        ids[b, :pad], mask[b, :pad] = 0, 0
    return ids, mask


def model_flops(model: torch.nn.Module, mask: torch.Tensor, n: int, new: int) -> float:
    """FLOPs of one population rollout (see module docstring)."""
    c = model.config
    layer_params = sum(p.numel() for name, p in model.named_parameters() if ".layers." in name)
    heads, hd = c.num_attention_heads, c.hidden_size // c.num_attention_heads
    b, t = mask.shape
    positions = b * (t + new - 1)
    flops = 2.0 * layer_params * positions + 2.0 * c.vocab_size * c.hidden_size * b * new
    real = mask.sum(-1).double()
    ctx = (real * (real + 1) / 2).sum() + sum((real + j + 1).sum() for j in range(new - 1))
    flops += 4.0 * c.num_hidden_layers * heads * hd * float(ctx)
    return n * flops


def matmul_flops(seconds: float = 1.0) -> float:
    return matmul_gflops(size=2048, seconds=seconds) * 1e9


def best_of(fn, repeats: int) -> tuple[float, float, object]:
    """Best wall time and best CPU time (this process) over `repeats` runs, and the last output.

    CPU time is reported too because other processes share the CPUs here: it leaves out the time
    this process waited for a core (not the cache and memory-bandwidth contention).
    """
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = min(wall, time.perf_counter() - w), min(cpu, time.process_time() - c)
    return wall, cpu, out


def run(shape: Shape, n: int, batch: int, length: int, new: int, repeats: int, peak: float) -> dict:
    model = build(shape)
    stacked = members(model, n, sigma=0.01)
    ids, mask = prompts(batch, length, shape.vocab)
    args = (ids, mask, new, None, 0)  # eos None: never stop, both paths emit exactly `new` tokens
    params = sum(p.numel() for p in model.parameters())
    population_generate(model, stacked, *args)  # warm-up (allocator, MKL)
    sequential_generate(model, stacked, ids[:2], mask[:2], 2, None, 0)
    t_seq, c_seq, seq = best_of(lambda: sequential_generate(model, stacked, *args), repeats)
    t_pop, c_pop, pop = best_of(lambda: population_generate(model, stacked, *args), repeats)
    tokens = n * batch * new
    same = int((seq.tokens == pop.tokens).all(-1).sum())
    flops = model_flops(model, mask, n, new)
    print(f"  {shape.name:>5} ({params / 1e6:.2f}M params, hidden {shape.hidden}, {shape.layers} layers): "
          f"N={n} B={batch} T={length} new={new}")
    for tag, t, c in (("(a) sequential generate", t_seq, c_seq), ("(b) population batched ", t_pop, c_pop)):
        print(f"    {tag}: {tokens / t:9.0f} tok/s  {t:7.3f} s wall ({c:7.3f} s cpu)  "
              f"{flops / t / 1e9:6.1f} GFLOP/s = {flops / t / peak:5.1%} of matmul")
    print(f"    b/a = {t_seq / t_pop:.2f}x wall ({c_seq / c_pop:.2f}x cpu); identical token sequences: "
          f"{same}/{n * batch}{'' if same == n * batch else '  <-- MISMATCH'}")
    return {"ratio": t_seq / t_pop, "fraction": flops / t_pop / peak, "same": same == n * batch}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, 1 thread, smaller population")
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    parser.add_argument("--members", type=int, default=16)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=20)
    parser.add_argument("--new", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="small,4M")
    args = parser.parse_args()
    threads = [int(x) for x in args.threads.split(",")]
    repeats, n = args.repeats, args.members
    if args.quick:
        threads, repeats, n = threads[:1], 1, min(n, 8)
    shapes = [s for s in (SMALL, LARGE) if s.name in args.models.split(",")]
    print(f"torch {torch.__version__}, cpus {os.cpu_count()}, load average {os.getloadavg()}")
    for k in threads:
        torch.set_num_threads(k)
        peak = matmul_flops()
        print(f"threads={k}: dense fp32 matmul (2048^3 mm) {peak / 1e9:.1f} GFLOP/s")
        for shape in shapes:
            run(shape, n, args.prompts, args.prompt_len, args.new, repeats, peak)
        print(f"  matmul re-measured after: {matmul_flops() / 1e9:.1f} GFLOP/s; "
              f"load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
