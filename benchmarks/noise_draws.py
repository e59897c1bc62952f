"""One ES member's noise at SmolLM2-135M's shape, drawn by torch.randn and by esgrpo.randn, into kept
buffers as the population engine draws it; and a long check that the two give the same bits.

    python benchmarks/noise_draws.py [--repeats 3] [--verify-values 4294967296]

Prints the machine's fp32 matmul (GFLOP/s, one thread) beside the draws' speeds. --verify-values: how many
values to compare in all (in draws of 2^26 from different seeds); 2^32 meets each of the 2^24 possible
uniforms of the radii and of the angles about 128 times.
"""
import argparse
import time

import torch

from esgrpo import randn
from esgrpo.noise import tensor_seed

torch.set_num_threads(1)
parser = argparse.ArgumentParser()
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--verify-values", type=int, default=0)
args = parser.parse_args()

hidden, inter, layers, vocab, kv = 576, 1536, 30, 49152, 192
shapes = {"embed": (vocab, hidden)}
for i in range(layers):
    shapes |= {f"l{i}.q": (hidden, hidden), f"l{i}.k": (kv, hidden), f"l{i}.v": (kv, hidden),
               f"l{i}.o": (hidden, hidden), f"l{i}.gate": (inter, hidden), f"l{i}.up": (inter, hidden),
               f"l{i}.down": (hidden, inter), f"l{i}.n1": (hidden,), f"l{i}.n2": (hidden,)}
buffers = {name: torch.empty(s) for name, s in shapes.items()}
values = sum(b.numel() for b in buffers.values())


def matmul_gflops() -> float:
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    a @ b
    t = time.perf_counter()
    for _ in range(3):
        a @ b
    return 3 * 2 * 2048**3 / (time.perf_counter() - t) / 1e9


def torch_draw(seed: int, name: str, out: torch.Tensor) -> None:
    torch.randn(out.shape, generator=torch.Generator().manual_seed(tensor_seed(seed, name)), out=out)


def kernel_draw(seed: int, name: str, out: torch.Tensor) -> None:
    randn.randn(tensor_seed(seed, name), out.shape, out)


print(f"matmul {matmul_gflops():.1f} GFLOP/s; {randn.kernel_name()}; one member: {values / 1e6:.1f} M values")
for member in range(args.repeats):
    times = {}
    for label, draw in (("torch.randn", torch_draw), ("esgrpo.randn", kernel_draw)):
        t = time.perf_counter()
        for name, out in buffers.items():
            draw(1000 + member, name, out)
        times[label] = time.perf_counter() - t
    a, b = times["torch.randn"], times["esgrpo.randn"]
    print(f"member {member}: torch.randn {a:.3f} s ({a / values * 1e9:.2f} ns a value), esgrpo.randn {b:.3f} s "
          f"({b / values * 1e9:.2f} ns): {a / b:.2f}x")

if args.verify_values:
    chunk, checked, t = 2**26, 0, time.perf_counter()
    out = torch.empty(chunk + 7)
    while checked < args.verify_values:
        seed = 7919 * checked + 1
        theirs = torch.randn(chunk + 7, generator=torch.Generator().manual_seed(seed))
        randn.randn(seed, (chunk + 7,), out)
        if not torch.equal(out.view(torch.int32), theirs.view(torch.int32)):
            raise SystemExit(f"seed {seed}: {int((out.view(torch.int32) != theirs.view(torch.int32)).sum())} differ")
        checked += chunk + 7
    print(f"verified: {checked:,} values identical to torch.randn ({time.perf_counter() - t:.0f} s)")
