"""ES rollout throughput: the population engine (full-rank and low-rank members) against one `generate`
per member and against batch inference of the unperturbed model, on the same N x B sequences.

    python benchmarks/es_throughput.py [--shapes small,4M,smollm2] [--members 4,16] [--prompts 8,16]
        [--prompt-len 40] [--new 32] [--rank 4] [--threads 1] [--calls 3] [--repeats 2] [--es-iterations 0]
        [--device cpu|cuda] [--quick]

In this one process: dense fp32 matmul FLOP/s (a 2048^3 mm after warm-up; re-measured at the end), the
CPU's model and its memory read speed (`read_gbs`),
then for each random model shape (`SHAPES`: a ~0.2M and a ~4M Llama, SmolLM2-135M-Instruct's shape, and
1B-class shapes for a GPU) and each N x B: N members theta + sigma * eps_n on B left-padded prompts of
~T tokens, greedy, `--new` tokens each (no EOS: every path generates exactly N x B x new tokens):
  (a) full-rank population    - `population_generate` on an `esgrpo.noise.Population` (full-rank noise)
  (b) one generate per member - `sequential_generate`: load member n's weights, `model.generate` (public ES code)
  (c) low-rank population     - the same with rank-`--rank` noise (A B^T / sqrt(r), `esgrpo.noise`)
  (d) batch inference         - the unperturbed model, all N x B sequences in ONE `model.generate` call
  (e) engine batch inference  - the population engine on the unperturbed model, N x B rows (its own bound)
Each path's time includes building its members from theta and the seeds (noise generation: (a), (b),
(c)); (d) and (e) have no members to build. (a) and (c) keep their member buffers from call to call
(`esgrpo.engines.population.MemberBuffers`, as the ES evaluator does); (a') is (a) on memory of each call's
own (the engine before the buffers were kept).

Every path runs `--calls` times in a row, each call on fresh members (new seeds, as `train_es` makes them
every iteration): the headline is the first call and the steady state (the mean of the later calls), what
an ES iteration pays. Then `--repeats` - 1 more calls on the last call's members: "best of, same members"
(the least of those and the last fresh call) is a second figure, not what an iteration pays. Printed per
path: generated tokens/s, model GFLOP/s and that as a share of the measured matmul, and the fraction of
(d)'s tokens/s (steady state; best-of apart); then the identical-token checks
where the maths is the same: (a) vs (b) (the same full-rank members; a differing sequence is checked for
a float-rounding near-tie, `near_ties`), (c) vs (b) run on the first two low-rank members (dense A B^T),
(e) vs (d). ESGRPO_PANEL_KERNEL=0 runs the population engine on oneDNN's packed layout instead of
`esgrpo.engines.panel_matmul` (the line after the matmul says which ran).

Model FLOPs count what a forward of every processed position needs: 2 * (decoder-layer params) per
position (prompt positions included, pad positions too: every path computes them), 2 * V * H for each
next-token logit row, and 4 * context * heads * head_dim per layer and position for attention (causal
context); the same count for every path. Timings are wall and this process's CPU time (other processes
share the CPUs here; ratios are given for both).

`--es-iterations K` adds the end-to-end figure: K iterations of `train_es` on the transformers backend
(`HFESBackend`, the default evaluator with its kept buffers) at each shape and N x B (random weights, a small
trained tokenizer, a reward that depends on the text), against the same loop with one `generate` per member
(`sequential_generate` as the evaluator's generation): seconds per iteration (the first and the mean of the
rest), and each iteration's mean fitness and update norm (the two engines' greedy tokens agree up to
near-ties, so these agree too unless one occurs).
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from esgrpo import randn  # noqa: E402
from esgrpo.engines import panel_matmul  # noqa: E402
from esgrpo.engines.population import MemberBuffers, population_generate, sequential_generate  # noqa: E402
from esgrpo.models.fingerprint import cpu_model  # noqa: E402
from esgrpo.noise import Noise, Population  # noqa: E402


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    tie: bool
    kind: str = "llama"  # "qwen2": q/k/v biases


SHAPES = {s.name: s for s in (
    Shape("small", hidden=64, layers=3, heads=4, kv_heads=2, intermediate=192, vocab=400, tie=False),
    Shape("4M", hidden=256, layers=4, heads=4, kv_heads=2, intermediate=1024, vocab=400, tie=False),
    # HuggingFaceTB/SmolLM2-135M-Instruct's config.json
    Shape("smollm2", hidden=576, layers=30, heads=9, kv_heads=3, intermediate=1536, vocab=49152, tie=True),
    # meta-llama/Llama-3.2-1B and Qwen/Qwen2.5-1.5B-Instruct's config.json (for a GPU: ~5-6 GB per fp32 member)
    Shape("llama1b", hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab=128256, tie=True),
    Shape("qwen1.5b", hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936, tie=True,
          kind="qwen2"),
)}


def build(shape: Shape, device: str, seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if shape.kind == "qwen2" else (LlamaConfig,
                                                                                             LlamaForCausalLM)
    config = config_cls(vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                        intermediate_size=shape.intermediate, tie_word_embeddings=shape.tie,
                        max_position_embeddings=512, bos_token_id=None, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(seed)
    model = model_cls(config).to(device).eval()
    # A larger init than 0.02 gives logits with real gaps, as in a trained model: float-rounding
    # near-ties (which could flip an argmax between two correct implementations) become rare.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.1)
    return model


def prompts(batch: int, length: int, vocab: int, device: str, seed: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded prompts of lengths length-6 .. length."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    for b in range(batch):
        pad = int(torch.randint(0, 7, (1,), generator=g))
        ids[b, :pad], mask[b, :pad] = 0, 0
    return ids.to(device), mask.to(device)


def model_flops(model: torch.nn.Module, mask: torch.Tensor, n: int, new: int) -> float:
    """FLOPs of one population rollout (see module docstring)."""
    c = model.config
    layer_params = sum(p.numel() for name, p in model.named_parameters() if ".layers." in name)
    heads, hd = c.num_attention_heads, c.hidden_size // c.num_attention_heads
    b, t = mask.shape
    positions = b * (t + new - 1)
    flops = 2.0 * layer_params * positions + 2.0 * c.vocab_size * c.hidden_size * b * new
    real = mask.sum(-1).double().cpu()
    ctx = (real * (real + 1) / 2).sum() + sum((real + j + 1).sum() for j in range(new - 1))
    flops += 4.0 * c.num_hidden_layers * heads * hd * float(ctx)
    return n * flops


def matmul_gflops(device: str, size: int = 2048, seconds: float = 1.0) -> float:
    """Best fp32 throughput of one size^3 matmul on `device` (TF32 off on CUDA: the engine computes in fp32)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    a, b = torch.randn(size, size, device=device), torch.randn(size, size, device=device)
    torch.mm(a, b)
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        _sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def read_gbs(megabytes: int = 400, tries: int = 3) -> float:
    """Best memory read speed (GB/s) of a sum over `megabytes` (10^6 bytes) of fp32 on torch's threads: at
    B = 8 the population path's decode reads every member's weights for few rows, so its share of batch
    inference (which the matmul bounds) depends on this machine's read speed against its matmul."""
    x = torch.ones(megabytes * 10**6 // 4)
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best / 1e9


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, device: str) -> tuple[float, float, object]:
    """Wall time and CPU time (this process) of one call, and its output.

    CPU time is reported too because other processes share the CPUs here: it leaves out the time
    this process waited for a core (not the cache and memory-bandwidth contention).
    """
    gc.collect()
    _sync(device)
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    _sync(device)
    return time.perf_counter() - w, time.process_time() - c, out


@dataclass
class Calls:
    """One path's calls: the first, the steady state (mean of the later fresh calls), best of the same members."""

    first: tuple[float, float]
    steady: tuple[float, float]
    best: tuple[float, float]
    out: object


def calls(fn, fresh: int, repeats: int, device: str) -> Calls:
    """`fn(call)` for calls 0 .. fresh - 1 (fresh members each), then `repeats` - 1 more of call fresh - 1."""
    runs = [timed(lambda i=i: fn(i), device) for i in range(fresh)]
    same = [runs[-1]] + [timed(lambda: fn(fresh - 1), device) for _ in range(repeats - 1)]
    later = runs[1:] or runs
    steady = (sum(r[0] for r in later) / len(later), sum(r[1] for r in later) / len(later))
    return Calls(runs[0][:2], steady, (min(r[0] for r in same), min(r[1] for r in same)), runs[-1][2])


def same_rows(a: torch.Tensor, b: torch.Tensor) -> str:
    """'k/n' sequences token-identical (a and b: [..., L])."""
    same = int((a.cpu() == b.cpu()).all(-1).sum())
    total = a[..., 0].numel()
    return f"{same}/{total}" + ("" if same == total else "  <-- differ")


def near_ties(a, b) -> str:
    """For sequences two paths generate differently: at the first differing step, how far apart the two
    chosen tokens' log-probs are, beside how far the paths' log-probs differ where the tokens agree. A
    gap below that agreement is a float-rounding near-tie (two correct implementations may pick either)."""
    differ = (a.tokens != b.tokens).cpu()
    if not differ.any():
        return ""
    same_rows_mask = ~differ.any(-1)
    agree = float((a.logprobs.cpu() - b.logprobs.cpu())[same_rows_mask].abs().max()) if same_rows_mask.any() else 0.0
    gaps = []
    for n, r in differ.any(-1).nonzero().tolist():
        j = int(differ[n, r].nonzero()[0])
        gaps.append(abs(float(a.logprobs[n, r, j]) - float(b.logprobs[n, r, j])))
    return (f"; at the first differing token the two picks' log-probs are {max(gaps):.1e} apart (log-probs of "
            f"agreeing sequences differ by up to {agree:.1e}: {'a near-tie' if max(gaps) <= agree else 'NOT a near-tie'})")


def run(shape: Shape, n: int, batch: int, args: argparse.Namespace, peak: float) -> dict:
    device, new = args.device, args.new
    model = build(shape, device)
    theta = {name: p.detach().clone() for name, p in model.named_parameters()}

    def seeds(call: int) -> list[tuple[int, float]]:  # fresh members every call
        return [(1000 + 100 * call + i, 1.0) for i in range(n)]

    full, low = Noise(), Noise("lowrank", args.rank)
    kept_full, kept_low = MemberBuffers(), MemberBuffers()
    ids, mask = prompts(batch, args.prompt_len, shape.vocab, device)
    gen = (new, None, 0)  # eos None: never stop, every path emits exactly `new` tokens
    wide_ids, wide_mask = ids.repeat(n, 1), mask.repeat(n, 1)

    def hf_batch():
        out = model.generate(input_ids=wide_ids, attention_mask=wide_mask, max_new_tokens=new, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        return out[:, ids.shape[1]:].reshape(n, batch, new)

    paths = {
        "(a) full-rank population": lambda c: population_generate(model, Population(theta, seeds(c), 0.01, full),
                                                                   ids, mask, *gen, buffers=kept_full),
        "(a') (a) on memory of each call's own": lambda c: population_generate(
            model, Population(theta, seeds(c), 0.01, full), ids, mask, *gen),
        "(b) one generate per member": lambda c: sequential_generate(model, Population(theta, seeds(c), 0.01, full),
                                                                      ids, mask, *gen),
        f"(c) low-rank r={args.rank} population": lambda c: population_generate(
            model, Population(theta, seeds(c), 0.01, low), ids, mask, *gen, buffers=kept_low).tokens,
        "(d) batch inference (generate)": lambda c: hf_batch(),
        "(e) engine batch inference": lambda c: population_generate(model, None, wide_ids, wide_mask,
                                                                     *gen).tokens.view(n, batch, new),
    }
    chosen = {k: v for k, v in paths.items() if k[1:3].rstrip(")") in args.paths}
    population_generate(model, Population(theta, seeds(0)[:1], 0.01, low), ids[:2], mask[:2], 2, None, 0)  # warm-up
    params = sum(p.numel() for p in model.parameters())
    flops = model_flops(model, mask, n, new)
    tokens = n * batch * new
    print(f"  {shape.name} ({params / 1e6:.1f}M params, hidden {shape.hidden}, {shape.layers} layers): "
          f"N={n} B={batch} T={args.prompt_len} new={new}", flush=True)
    results = {}
    for tag, fn in chosen.items():
        results[tag] = calls(fn, args.calls, args.repeats, device)
        gc.collect()
    ref = next((v for k, v in results.items() if k.startswith("(d)")), None)
    for figure in ("first", "steady", "best"):
        label = {"first": "first call (fresh members)", "steady": f"steady state (fresh members, calls 2-{args.calls})",
                 "best": f"best of {args.repeats}, same members (NOT what an iteration pays)"}[figure]
        print(f"    {label}:")
        for tag, r in results.items():
            wall, cpu = getattr(r, figure)
            vs = "" if ref is None else (f"  = {getattr(ref, figure)[0] / wall:4.2f} of (d) wall, "
                                         f"{getattr(ref, figure)[1] / cpu:4.2f} cpu")
            print(f"      {tag:38s} {tokens / wall:8.1f} tok/s  {wall:7.2f} s wall ({cpu:7.2f} s cpu)  "
                  f"{flops / wall / 1e9:6.1f} GFLOP/s = {flops / wall / peak:5.1%} of matmul{vs}", flush=True)
    times = {k[:k.index(")") + 1]: v for k, v in results.items()}
    tokens_of = {k: (v.out if isinstance(v.out, torch.Tensor) else v.out.tokens) for k, v in times.items()}
    if "(a)" in times and "(b)" in times:
        a, b = times["(a)"], times["(b)"]
        for figure in ("first", "steady", "best"):
            print(f"    {figure}: (a)/(b) = {getattr(b, figure)[0] / getattr(a, figure)[0]:.2f}x wall "
                  f"({getattr(b, figure)[1] / getattr(a, figure)[1]:.2f}x cpu)")
        print(f"    identical tokens (a) vs (b): {same_rows(a.out.tokens, b.out.tokens)}{near_ties(a.out, b.out)}")
    if "(a')" in times and "(a)" in times:
        same = same_rows(tokens_of["(a)"], tokens_of["(a')"])
        print(f"    identical tokens (a) vs (a'): {same}")
    if "(c)" in times:
        rows = torch.arange(min(2, n))
        check = sequential_generate(model, Population(theta, seeds(args.calls - 1), 0.01, low), ids, mask, *gen,
                                    member_rows=rows)
        print(f"    identical tokens (c) vs one generate per low-rank member (members 0-{len(rows) - 1}): "
              f"{same_rows(tokens_of['(c)'][rows], check.tokens)}")
    if "(d)" in times and "(e)" in times:
        print(f"    identical tokens (e) vs (d): {same_rows(tokens_of['(e)'], tokens_of['(d)'])}")
    if args.es_iterations:
        es_loop(model, n, batch, args)
    return {k: tokens / v.steady[0] for k, v in times.items()}


def es_loop(model: torch.nn.Module, n: int, batch: int, args: argparse.Namespace) -> None:
    """Seconds per `train_es` iteration on the transformers backend: the default evaluator (population engine,
    kept buffers) against one `generate` per member in the same loop."""
    import json
    import tempfile

    from esgrpo.es.hf_backend import HFESBackend, make_population_evaluator
    from esgrpo.es.loop import train_es
    from esgrpo.es.settings import ESConfig
    from esgrpo.models.default import train_tokenizer

    words = ["alpha", "beta", "gamma", "delta", "sum", "of", "is", "what", "the", "answer", "yes", "no"]
    g = torch.Generator().manual_seed(3)
    texts = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (args.prompt_len // 2,), generator=g))
             for _ in range(4 * batch)]
    tokenizer = train_tokenizer(texts, vocab_size=min(384, model.config.vocab_size))
    rows = [{"id": str(i), "prompt": t, "answer": "x"} for i, t in enumerate(texts)]
    cfg = ESConfig(population_size=n, sigma=1e-3, alpha=1e-3, iterations=args.es_iterations,
                   prompts_per_iteration=batch, max_new_tokens=args.new, checkpoint_every=0)
    theta = {k: p.detach().clone() for k, p in model.named_parameters()}
    engines = {"population engine (kept buffers)": None, "one generate per member": sequential_generate}
    for label, gen_fn in engines.items():
        with torch.no_grad():
            for k, p in model.named_parameters():
                p.copy_(theta[k])
        # the reward reads the text: members that write other tokens score differently
        evaluate = make_population_evaluator(model, tokenizer, lambda text, row: float(len(text) % 3 == 0), gen_fn)
        with tempfile.TemporaryDirectory() as tmp:
            train_es(HFESBackend(model, tokenizer, evaluate), rows, cfg, f"{tmp}/out", f"{tmp}/progress",
                     log=lambda s: None)
            metrics = [json.loads(line) for line in Path(f"{tmp}/out/metrics.jsonl").read_text().splitlines()]
        seconds = [m["seconds"] for m in metrics]
        per = [b - a for a, b in zip([0.0, *seconds[:-1]], seconds, strict=True)]
        rest = per[1:] or per
        print(f"    ES iteration, {label:34s}: first {per[0]:6.2f} s, then {sum(rest) / len(rest):6.2f} s "
              f"(N={n}, {batch} prompts); fitness {[m['fitness_mean'] for m in metrics]}, "
              f"update norms {[m['update_norm'] for m in metrics]}", flush=True)
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(theta[k])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="small,4M,smollm2", help=f"comma-separated, of {sorted(SHAPES)}")
    parser.add_argument("--members", default="4,16", help="comma-separated population sizes N")
    parser.add_argument("--prompts", default="8,16", help="comma-separated prompt counts B")
    parser.add_argument("--prompt-len", type=int, default=40)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--paths", default="abcde", help="letters of the paths to run (a' is a')")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=3, help="calls in a row, fresh members each")
    parser.add_argument("--repeats", type=int, default=2, help="best of the last call and repeats - 1 more on its members")
    parser.add_argument("--es-iterations", type=int, default=0, help="ES iterations of the end-to-end figure (0: none)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="small and 4M only, N=4, B=8, 16 new tokens")
    args = parser.parse_args()
    if args.quick:
        args.shapes, args.members, args.prompts, args.new = "small,4M", "4", "8", 16
    torch.set_num_threads(args.threads)
    peak = matmul_gflops(args.device) * 1e9
    print(f"torch {torch.__version__}, device {args.device}, threads {args.threads}, cpus {os.cpu_count()}, "
          f"load average {os.getloadavg()}")
    print(f"dense fp32 matmul (2048^3 mm): {peak / 1e9:.1f} GFLOP/s", flush=True)
    if args.device == "cpu":
        print(f"CPU: {cpu_model()}; memory read (sum over 400 MB): {read_gbs():.1f} GB/s", flush=True)
    tile = "8-row AVX-512 tile" if panel_matmul.wide_tile() else "4-row AVX2 tile"
    kernel = (f"panel kernel (esgrpo.engines.panel_matmul, {tile})" if panel_matmul.available(args.device)
              else f"oneDNN packed ({panel_matmul.unavailable_reason() or 'not a CPU'})")
    print(f"per-member matrices of the population engine: {kernel}; CPU noise draws: {randn.kernel_name()}",
          flush=True)
    for name in args.shapes.split(","):
        for n in (int(x) for x in args.members.split(",")):
            for b in (int(x) for x in args.prompts.split(",")):
                run(SHAPES[name], n, b, args, peak)
    print(f"matmul re-measured after: {matmul_gflops(args.device):.1f} GFLOP/s; load average {os.getloadavg()}")


if __name__ == "__main__":
    main()
