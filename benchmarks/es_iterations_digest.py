"""A few ES iterations of the HF backend at SmolLM2's shape (random weights): fitness, update norms, theta hash.

Run it with PYTHONPATH naming two checkouts' src/ in turn to compare them bit for bit (docs/smollm2.md):
    PYTHONPATH=src python benchmarks/es_iterations_digest.py [full|lowrank]
Each call of the backend's evaluate, apply_update and distance_from_init is timed on stderr with the page faults
it took (minor faults: memory touched for the first time since it was mapped).
"""
import functools
import hashlib
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from esgrpo.es.hf_backend import HFESBackend, make_population_evaluator
from esgrpo.es.loop import train_es
from esgrpo.es.settings import ESConfig
from esgrpo.models.default import train_tokenizer

torch.set_num_threads(1)
noise = sys.argv[1] if len(sys.argv) > 1 else "full"
words = ["alpha", "beta", "gamma", "delta", "sum", "of", "is", "what", "the", "answer", "yes", "no"]
g = torch.Generator().manual_seed(3)
texts = [" ".join(words[int(i)] for i in torch.randint(0, len(words), (20,), generator=g)) for _ in range(32)]
tok = train_tokenizer(texts, vocab_size=384)
config = LlamaConfig(vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                     num_key_value_heads=3, intermediate_size=1536, tie_word_embeddings=True,
                     max_position_embeddings=512, bos_token_id=None, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id)
torch.manual_seed(0)
model = LlamaForCausalLM(config).eval()
with torch.no_grad():
    for p in model.parameters():
        if p.dim() > 1:
            p.normal_(0.0, 0.1)
rows = [{"id": str(i), "prompt": t, "answer": "x"} for i, t in enumerate(texts)]
cfg = ESConfig(population_size=4, sigma=1e-3, alpha=1e-3, iterations=3, prompts_per_iteration=8,
               max_new_tokens=32, checkpoint_every=0, **({"noise": "lowrank", "rank": 4} if noise == "lowrank" else {}))
evaluate = make_population_evaluator(model, tok, lambda text, row: float(len(text) % 3 == 0))
backend = HFESBackend(model, tok, evaluate)


def timed(name):
    call = getattr(backend, name)

    @functools.wraps(call)
    def run(*args, **kwargs):
        faults, began = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        out = call(*args, **kwargs)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        print(f"{name}: {time.perf_counter() - began:.2f} s, {faults} page faults ({faults * resource.getpagesize() / 1e9:.2f} GB)",
              file=sys.stderr, flush=True)
        return out
    setattr(backend, name, run)


for name in ("evaluate", "apply_update", "distance_from_init"):
    timed(name)
with tempfile.TemporaryDirectory() as tmp:
    train_es(backend, rows, cfg, f"{tmp}/o", f"{tmp}/p", log=lambda s: None)
    metrics = [json.loads(line) for line in Path(f"{tmp}/o/metrics.jsonl").read_text().splitlines()]
h = hashlib.sha256()
for v in backend.theta.values():
    h.update(v.numpy().tobytes())
print(json.dumps({"fitness": [m["fitness_mean"] for m in metrics], "update_norm": [repr(m["update_norm"]) for m in metrics],
                  "distance": [repr(m["distance_from_init"]) for m in metrics], "tokens": [m["generated_tokens"] for m in metrics],
                  "seconds": [m["seconds"] for m in metrics], "theta_sha256": h.hexdigest()}))
