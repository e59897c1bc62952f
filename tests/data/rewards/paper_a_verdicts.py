"""Grade corpus.jsonl with paper A's own reward functions; write paper_a_verdicts.json.

Runs OUTSIDE the project, against a checkout of github.com/Bhoy1/ESvsGRPO put on PYTHONPATH (its
package `es_vs_grpo`; nothing of it is copied here). The exact commands are in README.md. Each case
is graded as paper A's training and evaluation loops call it: `task.compute_reward('', response,
data_item)` with the completion alone as `response` (its train/es.py, train/grpo.py and
evaluation/worker.py all pass `output.outputs[0].text` and an empty prompt), and the data item built
the way its `load_data` builds one:
  countdown: {"numbers": [...], "target": int}; math: {"answer": gold string};
  sciknoweval_chemistry: {"answer": gold letter}; boolq: {"answer": bool}.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import platform
import sys
from pathlib import Path

HERE = Path(__file__).parent
TASK_TYPES = {"countdown": "countdown", "math": "math", "chemistry": "sciknoweval_chemistry", "boolq": "boolq"}


def data_item(case: dict) -> dict:
    """Paper A's data item for one corpus case (see the module docstring)."""
    task = case["task"]
    if task == "countdown":
        return {"numbers": list(case["meta"]["numbers"]), "target": int(case["meta"]["target"])}
    if task == "boolq":
        return {"answer": case["answer"] == "yes"}
    return {"answer": case["answer"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", required=True, help="the ESvsGRPO commit checked out on PYTHONPATH")
    args = parser.parse_args()
    # The command as run (from the repository root), recorded with the verdicts it produced.
    command = f"PYTHONPATH={os.environ.get('PYTHONPATH', '')} {sys.executable} {' '.join(sys.argv)}"

    tasks_pkg = importlib.import_module("es_vs_grpo.tasks")
    src_dir = Path(tasks_pkg.__file__).parent
    tasks = {name: tasks_pkg.create_task({"type": kind, "name": name}) for name, kind in TASK_TYPES.items()}

    corpus_path = HERE / "corpus.jsonl"
    raw = corpus_path.read_bytes()
    verdicts = {}
    for line in raw.decode("utf-8").splitlines():
        case = json.loads(line)
        result = tasks[case["task"]].compute_reward("", case["completion"], data_item(case))
        verdicts[case["id"]] = float(result["reward"])

    out = {
        "repository": "github.com/Bhoy1/ESvsGRPO",
        "commit": args.commit,
        "command": command,
        "python": platform.python_version(),
        "files_sha256": {f"src/es_vs_grpo/tasks/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()
                         for p in sorted(src_dir.glob("*.py"))},
        "corpus_sha256": hashlib.sha256(raw).hexdigest(),
        "verdicts": verdicts,
    }
    target = HERE / "paper_a_verdicts.json"
    tmp = target.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(target)
    print(f"wrote {target}: {len(verdicts)} verdicts, {sum(v > 0 for v in verdicts.values())} rewarded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
