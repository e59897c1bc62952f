"""bf16 autocast's weight cache, measured: what a forward of an fp32 model under autocast holds.

    python benchmarks/autocast_memory.py [--json OUT]

torch's autocast caches the bf16 cast of every fp32 leaf tensor that requires grad until the
autocast region ends (aten/src/ATen/autocast_mode.cpp, `cached_cast`), whatever the grad mode, and
accelerate wraps a prepared model's whole forward in one region under bf16 mixed precision. So a
no-grad forward of the fp32 policy (TRL's importance-sampling forward) ends holding a bf16 copy of
weight a matmul reads: the plan's `memory.autocast_weight_copies`. This runs a no-grad
forward of a Llama built by transformers (random fp32 weights, ~29M parameters, 4 sequences of 16
tokens) under CPU autocast, whose casts take the same code path, in a child process, and reads the
rise of its peak resident set as `es_update_memory.py` does: with the weights requiring grad (as the
policy's do), without (then only one layer's casts live at a time), and without autocast.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def measure() -> dict[str, float]:
    import torch
    from es_update_memory import peak_rise
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
                         num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 4096, (4, 16))
    parameters = sum(p.numel() for p in model.parameters())

    def forward(autocast: bool):
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            model(input_ids=ids, logits_to_keep=1)

    forward(True)  # warm-up: one-time allocations of the first call
    from esgrpo.plan.architecture import from_config_dict
    from esgrpo.plan.memory import autocast_weight_copies

    arch = from_config_dict(config.to_dict(), "autocast probe")
    assert arch.parameters == parameters
    out = {"parameters": parameters, "plan_bytes": sum(autocast_weight_copies(arch, "none").values())}
    for grad in (True, False):
        model.requires_grad_(grad)
        out[f"autocast, requires_grad={grad}"] = peak_rise(lambda: forward(True))
    out["no autocast"] = peak_rise(lambda: forward(False))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure()))
        return
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run([sys.executable, __file__, "--child"], env=env, check=True, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    mib = 2**20
    print(f"{result['parameters']:,} fp32 parameters; the plan counts {result['plan_bytes'] / mib:.1f} MiB of bf16 copies")
    for key in ("autocast, requires_grad=True", "autocast, requires_grad=False", "no autocast"):
        print(f"  no-grad forward, {key:30} peak rise {result[key] / mib:7.1f} MiB  "
              f"({result[key] / result['plan_bytes']:.2f} of the plan's term)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
