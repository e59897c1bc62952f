"""Prompt lengths measured from the prepared data (esgrpo.plan.prompts): the count against the jobs' own
tokenization, a cache that stays light, and a bad row named."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from esgrpo.plan import (
    architecture_for,
)
from tests.conftest import REPO
from tests.plan.helpers import load


def _measured_setup(tmp_path, rows_by_task: dict[str, dict[str, list[dict]]]):
    """A results folder with the default model's tokenizer (ChatML-style template with a system turn) and
    prepared data; the default config pointed at it."""
    from esgrpo.files import write_jsonl
    from esgrpo.models.default import train_tokenizer

    texts = [m["content"] for splits in rows_by_task.values() for rows in splits.values() for r in rows for m in r["prompt"]]
    tokenizer = train_tokenizer(texts + ["system user assistant"], vocab_size=300)
    tokenizer.chat_template = (
        "{%- if messages[0].role == 'system' %}{{- '<|system|>' + messages[0].content + '<|end|>' }}"
        "{%- set rest = messages[1:] %}{%- else %}{%- set rest = messages %}{%- endif %}\n"
        "{%- for m in rest %}\n  {%- if m.role not in ['user', 'assistant'] %}{{ raise_exception('role') }}{% endif %}\n"
        "  {{- '<|' + m.role + '|>' + m.content | trim + '<|end|>' }}\n{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|assistant|>' }}{%- endif %}")
    model_dir = tmp_path / "results" / "tiny" / "base" / "model"
    tokenizer.save_pretrained(model_dir)
    for task, splits in rows_by_task.items():
        for split, rows in splits.items():
            write_jsonl(tmp_path / "results" / "data" / task / f"{split}.jsonl", rows)
    config = load("config.yaml")
    config["plan"] = {"results": str(tmp_path / "results")}
    return config, tokenizer


def _rows(task: str, words: list[int]) -> list[dict]:
    return [{"id": f"{task}-{i}", "prompt": [{"role": "system", "content": "Answer briefly."},
                                            {"role": "user", "content": " ".join(["sum 12 and 30"] * n)}]}
            for i, n in enumerate(words)]


def test_prompt_lengths_are_measured_from_the_prepared_data(tmp_path):
    """Where the data and the model's tokenizer are there at parse time, a job's prompt tokens are its split's
    longest prompt with the chat template, as the jobs tokenize it (prompt_token_ids), in whole 16-token KV
    blocks; elsewhere the stated constant. The old plan took the constant (64 for sum_yesno) whatever the data."""
    from esgrpo.engines.vllm_engine import prompt_token_ids
    from esgrpo.plan import PlanSettings
    from esgrpo.plan.grid import PromptTokens, eval_job, train_job
    from esgrpo.plan.prompts import PROMPT_TOKENS, ChatPrompts, tokenizer_files

    data = {"sum_yesno": {"train": _rows("t", [1, 3, 40]), "test": _rows("s", [2, 7])}, "leg_count": {"train": []}}
    config, tokenizer = _measured_setup(tmp_path, data)
    settings = PlanSettings.from_config(config)
    lengths = PromptTokens(config, settings)
    assert lengths("tiny", "leg_count", "train") == PROMPT_TOKENS["leg_count"]  # an empty split measures nothing
    for split, rows in data["sum_yesno"].items():
        jobs_tokens = [len(ids) for ids in prompt_token_ids(tokenizer, rows)]
        files = tokenizer_files(tmp_path / "results" / "tiny" / "base" / "model")
        assert ChatPrompts(files).lengths(rows) == jobs_tokens  # the light renderer = transformers' template
        assert lengths("tiny", "sum_yesno", split) == -(-max(jobs_tokens) // 16) * 16
    assert lengths("tiny", "sum_yesno", "train") > PROMPT_TOKENS["sum_yesno"]  # the constant would be too short
    assert lengths.sources[("tiny", "sum_yesno", "train")].startswith("measured")
    assert lengths("tiny", "countdown3", "train") == PROMPT_TOKENS["countdown3"]  # no data there
    assert lengths.sources[("tiny", "countdown3", "train")] == "constant (no prepared data)"
    arch = architecture_for(config, "tiny", settings.results)
    run = next(r for t, r in __import__("esgrpo.runs", fromlist=["planned_runs"]).planned_runs(config, "tiny")
               if t == "sum_yesno")
    assert train_job(config, "tiny", "sum_yesno", run, arch, settings, lengths).prompt_tokens == lengths(
        "tiny", "sum_yesno", "train")
    assert eval_job(config, "tiny", "base", "base", arch, settings, lengths).prompt_tokens >= lengths(
        "tiny", "sum_yesno", "test")
    # the measurement is cached beside the data and reread unless a file changed
    cache = json.loads((tmp_path / "results" / "data" / "sum_yesno" / "prompt_tokens.json").read_text())
    assert cache["tiny"]["longest"]["train"] == max(len(i) for i in prompt_token_ids(tokenizer, data["sum_yesno"]["train"]))
    config["plan"]["prompt_tokens"] = {"sum_yesno": 4096}  # an explicit larger setting wins over the measurement
    assert PromptTokens(config, PlanSettings.from_config(config))("tiny", "sum_yesno", "train") == 4096


def test_prompt_measurement_stays_light_and_a_bad_row_is_named(tmp_path):
    """Measuring imports tokenizers and jinja2, never torch or transformers; an unrenderable row names its file
    and row, and the plan then falls back to the constant with a warning."""
    from esgrpo.plan.prompts import ChatPrompts, longest_prompts, tokenizer_files

    bad = _rows("b", [1]) + [{"id": "b-odd", "prompt": [{"role": "tool", "content": "x"}]}]
    _measured_setup(tmp_path, {"sum_yesno": {"train": bad}})
    model = tmp_path / "results" / "tiny" / "base" / "model"
    with pytest.raises(ValueError, match=r"train.jsonl, row 2 \(id 'b-odd'\)"):
        longest_prompts(tmp_path / "results" / "data" / "sum_yesno", tokenizer_files(model), "tiny")
    code = ("import sys; from esgrpo.plan.prompts import ChatPrompts, tokenizer_files; "
            f"print(ChatPrompts(tokenizer_files({str(model)!r})).lengths([{{'prompt': [{{'role': 'user', 'content': 'hi'}}]}}]),"
            " sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip().endswith("[]")
    assert ChatPrompts is not None
