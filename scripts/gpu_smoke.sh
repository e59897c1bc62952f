#!/usr/bin/env bash
# GPU smoke test of the resource plan (issue 12, item 10), for one GPU with no network.
#
#   scripts/gpu_smoke.sh                      # Qwen2.5-1.5B and -7B shapes, ES and GRPO, on cuda
#   scripts/gpu_smoke.sh --shapes qwen2.5-1.5b --methods grpo
#   scripts/gpu_smoke.sh --device cpu --tiny  # the same logic on a CPU, in about a minute
#
# Needs: a Python with torch and transformers (and tokenizers, numpy, safetensors, which they bring).
# Optional: TRL (then GRPO runs through the project's trainer, esgrpo.grpo.trainer.train_grpo); without it a
# plain torch GRPO step is measured. No vLLM, no network: architectures come from
# src/esgrpo/plan/architectures/, weights are random. Everything it prints and a JSON copy go to
# benchmarks/out/gpu_smoke/ (git-ignored).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTORCH_CUDA_ALLOC_CONF="${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

"$PY" - <<'PYCHECK'
import importlib.util, sys
missing = [m for m in ("torch", "transformers", "tokenizers", "safetensors", "yaml") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"gpu_smoke: missing Python packages {missing}; install torch and transformers (and pyyaml)")
for optional in ("trl", "vllm"):
    print(f"gpu_smoke: {optional} {'found' if importlib.util.find_spec(optional) else 'absent'}")
import torch
print(f"gpu_smoke: torch {torch.__version__}, CUDA available: {torch.cuda.is_available()}"
      + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
PYCHECK

if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv; fi
mkdir -p benchmarks/out/gpu_smoke
stamp="$(date +%Y%m%d-%H%M%S)"
"$PY" benchmarks/gpu_smoke.py --json "benchmarks/out/gpu_smoke/$stamp.json" "$@" 2>&1 \
    | tee "benchmarks/out/gpu_smoke/$stamp.log"
