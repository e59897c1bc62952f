"""GPU smoke test of the resource plan (issue 12, item 10): paper-model shapes, random weights, one GPU.

    python benchmarks/gpu_smoke.py [--shapes qwen2.5-1.5b,qwen2.5-7b] [--es-iterations 2] [--grpo-steps 2]
    python benchmarks/gpu_smoke.py --device cpu --tiny          # the logic, on a CPU, in a minute

Needs torch and transformers only: no vLLM, no network (architectures from the files shipped in
src/esgrpo/plan/architectures/, a tokenizer trained here on an offline task, weights drawn at
random: memory and speed do not depend on their values). TRL is used when it imports.

For each shape it plans a job with `esgrpo.plan.plan_job`, runs it, and prints the plan's GPU
memory and time next to the measured ones:
- ES on the transformers backend (`esgrpo.es.hf_backend.HFESBackend` + `esgrpo.es.loop.train_es`): a few
  iterations, the population stacked when the plan says it fits, else one member at a time;
- GRPO steps at the plan's micro-batch and gradient accumulation, bf16 mixed precision:
  through the project's trainer (`esgrpo.grpo.trainer.train_grpo`, TRL) when TRL imports, else a plain
  torch step that does what the plan assumes (generate with transformers under bf16 autocast,
  activation checkpointing per layer, the log-probs through a chunked head, fused AdamW).
A shape whose job the plan says cannot fit one GPU (GRPO at 7B: 16 bytes a parameter) runs at
the largest depth that fits, with its hidden size, heads and vocabulary, and says so.

Measured: torch.cuda.max_memory_allocated (tensors) and max_memory_reserved (the caching
allocator's hold) against the plan's tensors (its total less CUDA context and fragmentation)
and its total; the last iteration's / step's seconds (from the run's metrics.jsonl; the first
pays warm-up) against the plan's. `--dry-run` prints only the plans (no GPU needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import resource
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from esgrpo.plan import Architecture, JobSpec, PlanError, plan_job, shipped  # noqa: E402
from esgrpo.plan.memory import ALLOCATOR_SLACK, CUDA_PROCESS_BYTES, GIB  # noqa: E402

SHAPES = {"qwen2.5-1.5b": "Qwen/Qwen2.5-1.5B-Instruct", "qwen2.5-7b": "Qwen/Qwen2.5-7B-Instruct"}
TASK, VERIFIER = "sum_yesno", "yesno"
# --tiny: a Qwen2-shaped model small enough for a CPU, with settings to match.
TINY = Architecture("tiny-qwen2", "qwen2", hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1024,
                    max_position_embeddings=512, dtype="float32", tie_word_embeddings=True, qkv_bias=True)


# --------------------------------------------------------------------------- model, tokenizer, rows


def rows_and_tokenizer(count: int = 128):
    from esgrpo.models.default import train_tokenizer
    from esgrpo.tasks.offline import load_sum_yesno

    rows = load_sum_yesno("train", count, seed=0)
    tokenizer = train_tokenizer([r["prompt"][-1]["content"] for r in rows] + ["\\boxed{yes}", "\\boxed{no}"], 384)
    return rows, tokenizer


def build_model(arch: Architecture, tokenizer, device: str, dtype: str):
    """Random weights in `arch`'s shapes, initialised on `device` (a 7B initialises in seconds on a GPU)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = dict(vocab_size=arch.vocab_size, hidden_size=arch.hidden_size,
                  intermediate_size=arch.intermediate_size, num_hidden_layers=arch.num_hidden_layers,
                  num_attention_heads=arch.num_attention_heads, num_key_value_heads=arch.num_key_value_heads,
                  max_position_embeddings=arch.max_position_embeddings, tie_word_embeddings=arch.tie_word_embeddings,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    if arch.model_type != "qwen2":
        fields["head_dim"] = arch.head_dim
    config = AutoConfig.for_model(arch.model_type, **fields)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def prompt_tokens(tokenizer, rows) -> int:
    from esgrpo.engines.rollout import prompt_texts

    return max(len(ids) for ids in tokenizer(prompt_texts(tokenizer, rows), add_special_tokens=False)["input_ids"])


# --------------------------------------------------------------------------- planning


def fitting(make_job, arch: Architecture, disk_bytes=None, free_disk: int = 0):
    """(plan, arch, note): the job at full depth, else at the largest depth that the plan fits on one
    GPU (and whose files, `disk_bytes(arch)`, fit the free disk)."""
    reasons = []
    for layers in range(arch.num_hidden_layers, 0, -1):
        candidate = arch if layers == arch.num_hidden_layers else arch.with_layers(layers)
        if disk_bytes is not None and 1.2 * disk_bytes(candidate) > free_disk:
            reasons.append(f"{layers} layers need {disk_bytes(candidate) / GIB:.0f} GiB of disk")
            continue
        try:
            plan = plan_job(make_job(candidate))
        except PlanError as err:
            reasons.append(str(err))
            continue
        note = "" if candidate is arch else f"full depth does not fit ({reasons[0]}); ran {layers} layers"
        return plan, candidate, note
    raise PlanError(f"{arch.name}: no depth fits: {reasons[0]}; {reasons[-1]}")


def free_disk(args, work: Path) -> int:
    """Bytes the smoke may write: `--disk-gib` where given (a dry run plans for the GPU machine, whose disk
    is not this one's), else the work folder's free space."""
    return int(args.disk_gib * GIB) if args.disk_gib is not None else shutil.disk_usage(work).free


class Peak:
    """Peak GPU memory (allocated, reserved) and wall time of a block, on CUDA; wall time elsewhere."""

    def __init__(self, device: str):
        self.device = device

    def __enter__(self):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        self.began = time.perf_counter()
        return self

    def __exit__(self, *exc):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.allocated, self.reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        else:
            self.allocated = self.reserved = 0
        self.seconds = time.perf_counter() - self.began
        return False


def plan_columns(plan, iterations: int) -> dict:
    """The plan's GPU figures: its tensors (total less the CUDA process and fragmentation), its total."""
    memory = plan.gpu_memory
    total = memory.total if memory else 0
    tensors = (total - CUDA_PROCESS_BYTES) / (1 + ALLOCATOR_SLACK) if memory else 0
    return {"plan_gpu_tensors_gib": tensors / GIB, "plan_gpu_total_gib": total / GIB,
            "plan_host_gib": plan.host_memory.total / GIB, "plan_seconds_per_step": plan.runtime_s / iterations,
            "plan_terms": (memory or plan.host_memory).describe(5)}


# --------------------------------------------------------------------------- ES


def es_case(arch: Architecture, args, rows, tokenizer, work: Path) -> dict:
    """A few ES iterations on the transformers backend (population engine), planned then measured."""
    import torch

    from esgrpo.es.hf_backend import HFESBackend, make_population_evaluator
    from esgrpo.es.loop import train_es
    from esgrpo.es.settings import ESConfig
    from esgrpo.tasks.rewards import reward

    prompt = prompt_tokens(tokenizer, rows)

    def job(a: Architecture, population: str = "stacked") -> JobSpec:
        return JobSpec("train_run", a.name, TASK, "es-smoke", "es", a, device=args.device, gpu_type=args.gpu_type,
                       gpus=1, backend="hf", weight_dtype=args.es_dtype, iterations=args.es_iterations,
                       population=args.members, prompts=args.prompts, prompt_tokens=prompt,
                       new_tokens=args.new_tokens, es_population=population)

    def disk(a: Architecture) -> int:  # train_es writes theta0 and the last theta (fp32), then the model
        return 8 * a.parameters + a.parameters * 4

    free = free_disk(args, work)
    try:
        population = "stacked"
        plan, run_arch, note = fitting(lambda a: job(a, population), arch, disk, free)
        if run_arch is not arch:
            raise PlanError("the stacked population fits only at a reduced depth")
    except PlanError:
        population = "sequential"
        plan, run_arch, note = fitting(lambda a: job(a, population), arch, disk, free)
    label = f"{run_arch.name} es ({population}, N={args.members})"
    if args.dry_run:
        return {"case": label, "note": note, "dry_run": True, **plan_columns(plan, args.es_iterations)}
    model = build_model(run_arch, tokenizer, args.device, args.es_dtype)
    cfg = ESConfig.from_dict({"population_size": args.members, "iterations": args.es_iterations,
                              "prompts_per_iteration": args.prompts, "max_new_tokens": args.new_tokens,
                              "checkpoint_every": 0, "sigma": 1e-3, "alpha": 5e-4})

    def reward_fn(text: str, row: dict) -> float:
        return reward(VERIFIER, text, row["answer"], row["meta"])

    backend = HFESBackend(model, tokenizer, make_population_evaluator(model, tokenizer, reward_fn),
                          population=population)
    out = work / f"{run_arch.name}-es".replace(" ", "_")
    with Peak(args.device) as peak:
        train_es(backend, rows, cfg, out / "run", out / "progress")
    seconds = [r["seconds"] for r in _metrics(out / "run")]  # cumulative: the last iteration is the steady one
    step = seconds[-1] - seconds[-2] if len(seconds) > 1 else seconds[-1]
    del backend, model
    if args.device == "cuda":
        torch.cuda.empty_cache()
    shutil.rmtree(out, ignore_errors=True)
    return {"case": label, "note": note,
            "measured_gpu_allocated_gib": peak.allocated / GIB, "measured_gpu_reserved_gib": peak.reserved / GIB,
            "measured_seconds_per_step": step, **plan_columns(plan, args.es_iterations)}


# --------------------------------------------------------------------------- GRPO


def _trl_available() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


def grpo_case(arch: Architecture, args, rows, tokenizer, work: Path) -> dict:
    """GRPO steps at the plan's micro-batch: the project's TRL trainer, or the plain torch step."""
    use_trl = args.grpo_impl == "trl" or (args.grpo_impl == "auto" and _trl_available())
    checkpointing = _trainer_checkpoints() if use_trl else True
    prompt = prompt_tokens(tokenizer, rows)

    def job(a: Architecture) -> JobSpec:
        return JobSpec("train_run", a.name, TASK, "grpo-smoke", "grpo", a, device=args.device,
                       gpu_type=args.gpu_type, gpus=1, backend="hf", weight_dtype="bfloat16",
                       iterations=args.grpo_steps, prompts=args.grpo_prompts, samples=args.group,
                       prompt_tokens=prompt, new_tokens=args.new_tokens, checkpointing=checkpointing)

    # The TRL path writes the start model (bf16) and the trained one (fp32) to disk.
    plan, run_arch, note = fitting(job, arch, lambda a: 6 * a.parameters if use_trl else 0, free_disk(args, work))
    completions = args.grpo_prompts * args.group
    micro = plan.micro_batch or completions
    label = (f"{run_arch.name} grpo ({'TRL' if use_trl else 'plain torch'}, micro-batch {micro}, "
             f"checkpointing {'on' if checkpointing else 'off'})")
    if args.dry_run:
        return {"case": label, "note": note, "dry_run": True, **plan_columns(plan, args.grpo_steps)}
    # TRL's trainer loads the model itself (fp32); bf16 on disk halves what a 7B shape writes.
    model = build_model(run_arch, tokenizer, args.device, "bfloat16" if use_trl else "float32")
    out = work / f"{run_arch.name}-grpo".replace(" ", "_")
    with Peak(args.device) as peak:
        if use_trl:
            model.save_pretrained(out / "init")
            tokenizer.save_pretrained(out / "init")
            del model
            _grpo_with_trl(out, rows, args, completions // micro, checkpointing)
            step = _metrics(out / "run")[-1]["seconds_step"]
        else:
            step = _grpo_plain_torch(model, tokenizer, rows, args, micro)
    shutil.rmtree(out, ignore_errors=True)
    return {"case": label, "note": note,
            "measured_gpu_allocated_gib": peak.allocated / GIB, "measured_gpu_reserved_gib": peak.reserved / GIB,
            "measured_seconds_per_step": step, **plan_columns(plan, args.grpo_steps)}


def _trainer_checkpoints() -> bool:
    """Whether the project's GRPO trainer checkpoints activations (a setting once issue 12's item 3 lands)."""
    from esgrpo.grpo.settings import GRPOSettings

    return any(f.name in ("activation_checkpointing", "gradient_checkpointing") for f in dataclasses.fields(GRPOSettings))


def _grpo_with_trl(out: Path, rows, args, accumulation: int, checkpointing: bool) -> None:
    from esgrpo.grpo.settings import GRPOSettings
    from esgrpo.grpo.trainer import train_grpo

    settings = {"num_generations": args.group, "prompts_per_step": args.grpo_prompts, "steps": args.grpo_steps,
                "max_new_tokens": args.new_tokens, "learning_rate": 1e-6, "save_every": 0,
                "gradient_accumulation_steps": accumulation, "bf16": args.device == "cuda", "use_vllm": False}
    names = {f.name for f in dataclasses.fields(GRPOSettings)}
    for name in ("activation_checkpointing", "gradient_checkpointing"):
        if name in names:
            settings[name] = checkpointing
    train_grpo(str(out / "init"), rows, VERIFIER, settings, out / "run", out / "progress")


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _grpo_plain_torch(model, tokenizer, rows, args, micro: int) -> float:
    """What the plan assumes of a GRPO step, in plain torch (no TRL): see the module docstring.
    Returns the seconds of the last step (the first pays one-off warm-up)."""
    import torch

    from esgrpo.engines.rollout import prompt_texts

    device, cuda = args.device, args.device == "cuda"
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()  # transformers 5 renamed gradient checkpointing to activation checkpointing
    model.config.use_cache = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=cuda or None)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=cuda)
    tokenizer.padding_side = "left"
    for step in range(args.grpo_steps):
        began = time.perf_counter()
        batch = rows[step * args.grpo_prompts:(step + 1) * args.grpo_prompts]
        enc = tokenizer([p for p in prompt_texts(tokenizer, batch) for _ in range(args.group)], return_tensors="pt",
                        padding=True, add_special_tokens=False).to(device)
        model.eval()
        with torch.no_grad(), autocast:
            sequences = model.generate(**enc, do_sample=True, max_new_tokens=args.new_tokens,
                                       min_new_tokens=args.new_tokens, use_cache=True)
        model.train()
        advantages = torch.randn(sequences.shape[0], device=device)  # rewards do not change memory or time
        mask = torch.cat([enc["attention_mask"], torch.ones_like(sequences[:, enc["input_ids"].shape[1]:])], 1)
        for start in range(0, sequences.shape[0], micro):
            rows_slice = slice(start, start + micro)
            with autocast:
                hidden = model.model(input_ids=sequences[rows_slice], attention_mask=mask[rows_slice]).last_hidden_state
            logp = _chunked_logprobs(hidden[:, :-1], model.lm_head.weight, sequences[rows_slice, 1:])
            completion = logp[:, -args.new_tokens:]
            loss = -(advantages[rows_slice, None] * completion).mean() * micro / sequences.shape[0]
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - began
    return seconds


def _chunked_logprobs(hidden, weight, targets, tokens: int = 4096):
    """Per-token log-probs through the LM head in checkpointed chunks of `tokens` positions: the
    [positions, vocab] logits of one chunk exist at a time, as in TRL's fused head."""
    import torch
    from torch.utils.checkpoint import checkpoint

    def piece(h, t):
        logits = (h @ weight.to(h.dtype).t()).float()
        return logits.log_softmax(-1).gather(-1, t.unsqueeze(-1)).squeeze(-1)

    flat_h, flat_t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    parts = [checkpoint(piece, flat_h[i:i + tokens], flat_t[i:i + tokens], use_reentrant=False)
             for i in range(0, flat_h.shape[0], tokens)]
    return torch.cat(parts).view(targets.shape)


# --------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--tiny", action="store_true", help="a tiny Qwen2-shaped model and small settings")
    parser.add_argument("--shapes", default="qwen2.5-1.5b,qwen2.5-7b", help=f"among {sorted(SHAPES)}")
    parser.add_argument("--gpu-type", default="h200")
    parser.add_argument("--methods", default="es,grpo")
    parser.add_argument("--es-iterations", type=int, default=2)
    parser.add_argument("--es-dtype", default="bfloat16")
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=32, help="ES prompts per iteration")
    parser.add_argument("--grpo-steps", type=int, default=2)
    parser.add_argument("--grpo-prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--grpo-impl", default="auto", choices=["auto", "trl", "torch"])
    parser.add_argument("--work", default=str(REPO / "benchmarks" / "out" / "gpu_smoke"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--dry-run", action="store_true", help="print the plans only (no GPU needed)")
    parser.add_argument("--disk-gib", type=float, default=None,
                        help="disk the runs may fill (default: the work folder's free space); give the GPU "
                             "machine's with --dry-run, since the depth that fits depends on it")
    args = parser.parse_args()
    if args.tiny:
        args.members, args.prompts, args.grpo_prompts, args.group, args.new_tokens = 4, 4, 2, 4, 8
        args.es_dtype = "float32"
    import torch

    if args.device == "cuda" and not torch.cuda.is_available() and not args.dry_run:
        sys.exit("no CUDA device: run with --device cpu --tiny to check the logic on a CPU")
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows, tokenizer = rows_and_tokenizer()
    shapes = [TINY] if args.tiny else [shipped(SHAPES[s]) for s in args.shapes.split(",")]
    results = []
    for arch in shapes:
        for method in args.methods.split(","):
            case = es_case if method == "es" else grpo_case
            try:
                results.append(case(arch, args, rows, tokenizer, work))
            except PlanError as err:  # one shape that fits nowhere must not cost the others their numbers
                results.append({"case": f"{arch.name} {method}", "skipped": str(err)})
            _print(results[-1])
    host_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB
    device = torch.cuda.get_device_name(0) if args.device == "cuda" and torch.cuda.is_available() else args.device
    print(f"peak host RSS of this process: {host_gib:.1f} GiB; device {device}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


def _print(r: dict) -> None:
    if "skipped" in r:
        print(f"{r['case']}: skipped, {r['skipped']}", flush=True)
        return
    if r.get("dry_run"):
        print(f"{r['case']}" + (f"\n  note: {r['note']}" if r.get("note") else ""))
        print(f"  plan: GPU {r['plan_gpu_tensors_gib']:.2f} GiB tensors, {r['plan_gpu_total_gib']:.2f} GiB total; "
              f"{r['plan_seconds_per_step']:.2f} s per step; host {r['plan_host_gib']:.1f} GiB\n  terms: {r['plan_terms']}")
        return
    print(f"{r['case']}" + (f"\n  note: {r['note']}" if r.get("note") else ""))
    print(f"  GPU memory  plan {r['plan_gpu_tensors_gib']:7.2f} GiB tensors, {r['plan_gpu_total_gib']:7.2f} GiB total"
          f" | measured {r['measured_gpu_allocated_gib']:7.2f} GiB allocated, {r['measured_gpu_reserved_gib']:7.2f} reserved")
    ratio = r["measured_seconds_per_step"] / r["plan_seconds_per_step"] if r["plan_seconds_per_step"] else math.nan
    print(f"  seconds per step  plan {r['plan_seconds_per_step']:8.2f} | measured {r['measured_seconds_per_step']:8.2f}"
          f" (x{ratio:.2f}); plan host {r['plan_host_gib']:.1f} GiB")
    print(f"  plan terms: {r['plan_terms']}", flush=True)


if __name__ == "__main__":
    main()
