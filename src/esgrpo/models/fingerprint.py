"""Fingerprint of a built base model: the numbers that tell a user whether their base matches ours.

The offline default is built deterministically from the config and the seed, but float results
depend on the CPU's kernels (summation order, vector width). So a fingerprint holds two kinds of
numbers: exact ones (the warm-up steps taken, its dev accuracies, a hash of the weights), equal on
the same machine and software; and statistical ones (greedy accuracy and Pass@k per task with a
95% bootstrap CI over prompts), which another CPU reproduces within the CI. `compare_to_reference`
states which of the two holds against docs/base_reference.json (a build on the project's machine).
"""

from __future__ import annotations

import hashlib
import platform
import time
from collections.abc import Iterable
from pathlib import Path

from esgrpo.estimators import bootstrap_ci, pass_at_k


def weights_sha256(model_dir: str | Path) -> str:
    """sha256 over every tensor of the model's safetensors files, in name order: name, dtype,
    shape and raw bytes (file metadata such as the writer's version does not enter)."""
    import torch
    from safetensors import safe_open

    digest = hashlib.sha256()
    tensors = {}
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        handle = safe_open(str(path), framework="pt")
        tensors.update({name: handle for name in handle.keys()})  # noqa: SIM118 (safe_open has no __iter__)
    if not tensors:
        raise FileNotFoundError(f"no safetensors weights in {model_dir}")
    for name in sorted(tensors):
        tensor = tensors[name].get_tensor(name).contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def cpu_model() -> str:
    """The CPU's model string (/proc/cpuinfo "model name" on Linux), else what the platform says."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def matmul_gflops(size: int = 1024, seconds: float = 0.5) -> float:
    """Best fp32 matmul throughput (GFLOP/s) of one size x size product, on the threads torch uses:
    the speed of the machine beside its CPU model string (~1 s with the torch import)."""
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def task_scores(prompt_rows: Iterable[dict], ks: Iterable[int]) -> dict[str, dict]:
    """Per evaluation task: greedy accuracy and Pass@k, each as [mean, lo, hi] (95% bootstrap CI over
    prompts, seed 0), from eval_base's per-prompt rows (`correct` of `n` samples, `greedy_correct`)."""
    by_task: dict[str, list[dict]] = {}
    for row in prompt_rows:
        by_task.setdefault(row["eval_task"], []).append(row)
    scores = {}
    for task, rows in by_task.items():
        metrics = {f"pass@{k}": [pass_at_k(r["n"], r["correct"], k) for r in rows] for k in ks}
        if all("greedy_correct" in r for r in rows):
            metrics = {"greedy": [float(r["greedy_correct"]) for r in rows], **metrics}
        scores[task] = {"n_prompts": len(rows),
                        **{name: [round(v, 6) for v in bootstrap_ci(values)] for name, values in metrics.items()}}
    return scores


def base_fingerprint(model_dir: str | Path, build_info: dict, eval_summary: dict, prompt_rows: list[dict]) -> dict:
    """The fingerprint of a built base: the settings it comes from, warm-up record, weights hash,
    scores per task, machine. `build_info` / `eval_summary`: build.json / eval.json of the base."""
    import torch

    warmup, eval_settings = build_info["warmup"], eval_summary["evaluations"][0]["settings"]
    return {
        "settings": {"build": build_info["provenance"]["config"], "eval": eval_settings},
        "warmup_steps": warmup["steps"],
        "warmup_stopped_because": warmup["stopped_because"],
        "warmup_dev_accuracy": {str(c["step"]): c["dev_accuracy"] for c in warmup["checks"]},
        "weights_sha256": weights_sha256(model_dir),
        "tasks": task_scores(prompt_rows, eval_settings["ks"]),
        "machine": {"cpu": cpu_model(), "torch": torch.__version__, "threads": torch.get_num_threads(),
                    "matmul_gflops": round(matmul_gflops(), 1)},
    }


def compare_to_reference(fingerprint: dict, reference: dict) -> dict:
    """How `fingerprint` stands against `reference`: "identical" (same weights hash), else per task
    and metric whether the reference value lies in our 95% CI ("equivalent" when all do); "not
    comparable" when the two come from other build or evaluation settings."""
    if fingerprint["settings"] != reference["settings"]:
        return {"verdict": "not comparable: other build or evaluation settings", "outside_ci": []}
    if fingerprint["weights_sha256"] == reference["weights_sha256"]:
        return {"verdict": "identical", "outside_ci": []}
    outside = []
    for task, ref_scores in reference["tasks"].items():
        ours = fingerprint["tasks"].get(task)
        if ours is None:
            outside.append(f"{task}: not evaluated")
            continue
        for metric, (ref_mean, _, _) in ((m, v) for m, v in ref_scores.items() if m != "n_prompts"):
            if metric in ours and not ours[metric][1] <= ref_mean <= ours[metric][2]:
                outside.append(f"{task} {metric}: reference {ref_mean:.3f} outside ours "
                               f"[{ours[metric][1]:.3f}, {ours[metric][2]:.3f}]")
    verdict = "statistically equivalent" if not outside else "different"
    return {"verdict": verdict, "outside_ci": outside}
