"""ES's working set beside the fp32 master, measured against what the plan counts (issue 21).

    python benchmarks/es_update_memory.py [--json OUT]

Each case is a one-tensor model driven through the code the jobs run: the vLLM workers'
`ESWorkerExtension` (es_perturb + es_restore, es_apply_update, es_distance_from_init; the CPU tests'
way of driving it, a `model_runner` holding the module) and the transformers backend's
`HFESBackend` (apply_update, distance_from_init). The cases run one after another in a child
process on one torch thread, each model freed before the next; an operation's peak is the rise of the process's peak resident set (VmHWM, reset
through /proc/self/clear_refs before the call) over its resident set just before, with glibc's
malloc told to mmap every block from 64 KiB on (MALLOC_MMAP_THRESHOLD_), so that a freed tensor
leaves the resident set at once and each allocation is counted when it is written. The plan's
figure is `esgrpo.plan.memory.es_tensor_bytes`; "old plan" is the 8 bytes per element the plan
counted before issue 21 (the noise and its perturbed copy); "old code" is what `apply_update` and
engine 0's distance held before the norms went chunked (update 20n: step, noise, then a float64 copy
and its square; distance 24n: two float64 copies and their difference), counted the same way.
The shapes exercise each term: a plain tensor of 8 norm chunks, a fused gate_up (its noise is
assembled from parts), a vocabulary padded as vLLM pads it, and a tensor below one chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

# name, vLLM-layout shape, HF vocabulary rows (padding when smaller than the shape's rows), assembled noise
CASES = {
    "embedding, 8 chunks": ("model.embed_tokens.weight", (32768, 1024), 32768, False),
    "gate_up, fused": ("model.layers.0.mlp.gate_up_proj.weight", (2 * 8192, 1024), 32768, True),
    "embedding, vocab padded": ("model.embed_tokens.weight", (32768, 512), 32758, True),
    "down_proj, one chunk": ("model.layers.0.mlp.down_proj.weight", (512, 1024), 32768, False),
}
OPERATIONS = {"vllm": ("perturb", "update", "distance"), "hf": ("update", "distance")}


def _rss(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def peak_rise(fn) -> int:
    """Bytes the resident set rose to above its level before `fn` (Linux: VmHWM reset by clear_refs)."""
    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    before = _rss("VmRSS")
    fn()
    return _rss("VmHWM") - before


def measure(case: str, backend: str) -> dict[str, int]:
    """In this process: the peak rise of each operation on the case's one-tensor model."""
    import types

    import torch

    from esgrpo.es.ops import member_seeds

    torch.manual_seed(0)
    name, shape, vocab, _ = CASES[case]
    module = torch.nn.Module()
    node = module
    for part in name.split(".")[:-1]:
        node.add_module(part, torch.nn.Module())
        node = getattr(node, part)
    node.register_parameter(name.split(".")[-1], torch.nn.Parameter(torch.randn(shape), requires_grad=False))
    seeds = member_seeds(0, 0, 4, antithetic=True)  # two noise draws, each used with + and -
    weights = [1.0, -0.5, 0.25, -1.0]
    if backend == "vllm":
        from esgrpo.es.vllm_worker import ESWorkerExtension

        config = {"vocab_size": vocab, "num_attention_heads": 8, "num_key_value_heads": 4}
        worker = type("Worker", (ESWorkerExtension,), {})()
        worker.model_runner = types.SimpleNamespace(model=module, model_config=types.SimpleNamespace(hf_config=config))
        worker.es_init(master="weights")

        def perturb():
            worker.es_perturb(int(seeds[0][0]), 1e-3, 1.0)
            worker.es_restore()

        ops = {"perturb": perturb, "update": lambda: worker.es_apply_update(seeds, weights, 1e-3),
               "distance": worker.es_distance_from_init}
    else:
        from esgrpo.es.hf_backend import HFESBackend
        from esgrpo.es.settings import ESConfig

        es = HFESBackend(module, None, None)
        es.start(ESConfig())
        ops = {"update": lambda: es.apply_update(seeds, weights, 1e-3), "distance": es.distance_from_init}
    return {op: peak_rise(fn) for op, fn in ops.items()}


def counted(case: str, backend: str) -> dict[str, int]:
    from esgrpo.plan.memory import es_tensor_bytes

    _, shape, _, assembled = CASES[case]
    n = shape[0] * shape[1]
    return es_tensor_bytes(n, assembled and backend == "vllm", agreement=True)  # both backends measure it


def old_code(case: str, backend: str) -> dict[str, int]:
    """What the operations held before the norms went chunked (see the module docstring)."""
    _, shape, _, assembled = CASES[case]
    n = shape[0] * shape[1]
    noise = 8 * n if assembled and backend == "vllm" else 4 * n
    return {"perturb": 8 * n, "update": 4 * n + max(noise, 16 * n),
            "distance": 24 * n if backend == "vllm" else 4 * n + 16 * n}


def run_all() -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536",
           "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True, capture_output=True,
                         text=True).stdout
    measured = json.loads(out.strip().splitlines()[-1])
    rows = []
    for case, (_, shape, _, _) in CASES.items():
        for backend, operations in OPERATIONS.items():
            plan, old = counted(case, backend), old_code(case, backend)
            for op in operations:
                value = measured[f"{case}|{backend}"][op]
                rows.append({"case": case, "backend": backend, "operation": op, "elements": shape[0] * shape[1],
                             "measured": value, "plan": plan[op], "old_plan": 8 * shape[0] * shape[1],
                             "old_code": old[op], "ratio": value / plan[op]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # every case in this process, one model alive at a time
        print(json.dumps({f"{c}|{b}": measure(c, b) for c in CASES for b in OPERATIONS}))
        return
    rows = run_all()
    mib = 2**20
    print(f"{'case':26} {'backend':7} {'operation':9} {'elements':>11} {'measured MiB':>12} {'plan MiB':>9} "
          f"{'ratio':>6} {'old plan':>9} {'old code':>9}")
    for r in rows:
        print(f"{r['case']:26} {r['backend']:7} {r['operation']:9} {r['elements']:>11,} {r['measured'] / mib:>12.1f} "
              f"{r['plan'] / mib:>9.1f} {r['ratio']:>6.3f} {r['old_plan'] / mib:>9.1f} {r['old_code'] / mib:>9.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
