"""Time prepare vs generate, first call vs repeats, fresh seeds vs same seeds; page faults per stage.

    python benchmarks/population_call_faults.py N B [kept]   # a third argument: kept member memory
"""
import gc
import resource
import sys
import time

import torch

sys.path.insert(0, "benchmarks")
from es_throughput import SHAPES, build, prompts

from esgrpo.engines.population import _generate, prepare_population
from esgrpo.noise import Noise, Population

torch.set_num_threads(1)
KW = {}
if len(sys.argv) > 3:
    from esgrpo.engines.population_weights import MemberBuffers
    KW = {'buffers': MemberBuffers()}
n, b = int(sys.argv[1]), int(sys.argv[2])
model = build(SHAPES["smollm2"], "cpu")
theta = {k: p.detach().clone() for k, p in model.named_parameters()}
ids, mask = prompts(b, 40, 49152, "cpu")
def flt(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
plan = [("fresh", 1000), ("fresh", 2000), ("fresh", 3000), ("same", 3000)]
for label, base in plan:
    gc.collect()
    seeds = [(base + i, 1.0) for i in range(n)]
    f0, t0, c0 = flt(), time.perf_counter(), time.process_time()
    pw = prepare_population(model, Population(theta, seeds, 0.01, Noise()), None, rows=b, **KW)
    f1, t1, c1 = flt(), time.perf_counter(), time.process_time()
    out = _generate(model, pw, ids, mask, 32, None, 0, 0.0, 1.0, None)
    f2, t2, c2 = flt(), time.perf_counter(), time.process_time()
    del pw, out
    print(f"{label} seeds {base}: prepare {t1-t0:.2f} s wall {c1-c0:.2f} cpu ({(f1-f0)*4096/1e6:.0f} MB faulted)  "
          f"generate {t2-t1:.2f} s wall {c2-c1:.2f} cpu ({(f2-f1)*4096/1e6:.0f} MB faulted)  maxrss {rss():.2f} GB", flush=True)
# noise alone
t = time.perf_counter()
for p in theta.values():
    torch.randn(p.shape, generator=torch.Generator().manual_seed(1))
print(f"noise of one member: {time.perf_counter()-t:.2f} s")
