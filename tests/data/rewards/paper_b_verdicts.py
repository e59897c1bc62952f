"""Grade corpus_gsm8k.jsonl and the maths cases of corpus.jsonl with paper B's own graders; write
paper_b_verdicts.json.

Runs OUTSIDE the project, against paper B's `src/es_reproduction/rewards.py` put on PYTHONPATH (package
`es_reproduction`; nothing of it is copied here). The exact commands are in README.md. Each case gets
the two grades paper B's code gives a completion (github.com/yunpengba7/understanding-es, 240d878):
  train: `score_training_response(completion, gold, format_reward=0.1)` (its train.py, with
         configs/easy_qwen25_1p5b.yaml's format_reward);
  eval:  `is_gsm8k_correct(completion, gold)` (its evaluation.py, greedy and sampled completions alike).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import json
import os
import platform
import sys
from pathlib import Path

HERE = Path(__file__).parent
FORMAT_REWARD = 0.1  # configs/easy_qwen25_1p5b.yaml `format_reward`
CORPORA = ("corpus_gsm8k.jsonl", "corpus.jsonl")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True, help="the understanding-es commit its rewards.py was read at")
    args = parser.parse_args()
    command = f"PYTHONPATH={os.environ.get('PYTHONPATH', '')} {sys.executable} {' '.join(sys.argv)}"

    module = importlib.import_module("es_reproduction.rewards")
    verdicts = {}
    corpus_sha = {}
    for name in CORPORA:
        raw = (HERE / name).read_bytes()
        corpus_sha[name] = hashlib.sha256(raw).hexdigest()
        for line in raw.decode("utf-8").splitlines():
            case = json.loads(line)
            if case["verifier"] != "math":
                continue
            completion, gold = case["completion"], case["answer"]
            verdicts[case["id"]] = {
                "train": float(module.score_training_response(completion, gold, format_reward=FORMAT_REWARD)),
                "eval": bool(module.is_gsm8k_correct(completion, gold)),
            }

    out = {
        "repository": "github.com/yunpengba7/understanding-es",
        "commit": args.commit,
        "command": command,
        "python": platform.python_version(),
        "packages": {p: importlib.metadata.version(p) for p in ("math-verify", "sympy", "latex2sympy2_extended")},
        "files_sha256": {"src/es_reproduction/rewards.py": hashlib.sha256(Path(module.__file__).read_bytes()).hexdigest()},
        "corpus_sha256": corpus_sha,
        "verdicts": verdicts,
    }
    target = HERE / "paper_b_verdicts.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(target)
    print(f"wrote {target}: {len(verdicts)} cases, {sum(v['eval'] for v in verdicts.values())} correct in evaluation, "
          f"{sum(v['train'] == 1.0 for v in verdicts.values())} rewarded 1 in training")
    return 0


if __name__ == "__main__":
    sys.exit(main())
