"""Prompt lengths for the plan: measured from the prepared data where it and the model's tokenizer
are there when the workflow is parsed, else a stated conservative constant.

A vLLM engine's max_model_len is the longest prompt plus max_new_tokens, and vLLM refuses a
longer prompt only when the engine starts, after the job has waited for its GPU. The training and
evaluation jobs read `{results_dir}/data/{task}/{train,test}.jsonl`; once `prepare_task` has written
them (docs/cluster.md: prepare the data and download the models on the login node first) and the
model's tokenizer is local (the built default model, a local folder, or the Hugging Face cache),
every later parse measures the longest prompt of each split with the model's chat template.

The measurement stays light, as the DAG parse needs (no torch, no transformers: importing
transformers' chat-template module alone takes ~2.8 s): `tokenizers` reads tokenizer.json and
encodes, jinja2 renders the chat template the way transformers' `apply_chat_template` does
(sandboxed, trim_blocks and lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a
non-escaping `tojson`, the tokenizer's special tokens as variables, add_generation_prompt). The
count is rounded up to whole vLLM KV blocks of 16 tokens, a margin that costs no KV cache when
max_new_tokens is itself a multiple of 16 (vLLM allocates whole blocks anyway).
`tests/plan/test_prompts.py` checks the count against the jobs' own tokenization
(`esgrpo.engines.vllm_engine.prompt_token_ids`) on the tokenizers at hand. A template this
renderer cannot compile (e.g. transformers' `{% generation %}` tag) is reported and falls back to
the constant. Measurements are cached in `{results_dir}/data/{task}/prompt_tokens.json`, keyed by the
data files' and tokenizer files' sizes and modification times, so a parse re-reads nothing that
did not change.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

from esgrpo.plan.memory import VLLM_BLOCK_TOKENS

# Longest prompt, in tokens, chat template and system prompt included, used when the data or the
# tokenizer is not there at parse time. Not measured (the Hub data sets and the paper models'
# tokenizers are not on this machine): guesses from the tasks' sources, erring long. MATH and
# DeepScaleR problems with Asymptote figures and BoolQ's Wikipedia passages run to several hundred
# tokens, so 1,024 (twice the earlier 512); GSM8K questions stay under ~250 tokens with the boxed
# system prompt, and Countdown's generated questions under ~150. `plan.prompt_tokens` overrides any of
# them; a measurement larger than an override wins (a shorter context would fail at engine start).
PROMPT_TOKENS = {"countdown": 256, "math": 1024, "chemistry": 1024, "boolq": 1024, "gsm8k": 512,
                 "deepscaler": 1024, "countdown3": 64, "leg_count": 64, "sum_choice": 64, "sum_yesno": 64}
DEFAULT_PROMPT_TOKENS = 1024
SPLIT_FILES = {"train": "train.jsonl", "test": "test.jsonl"}
CACHE_FILE = "prompt_tokens.json"


def tokenizer_files(folder: str | Path | None) -> dict[str, Path] | None:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja (if any) of a local model folder."""
    if folder is None:
        return None
    folder = Path(folder)
    if not (folder / "tokenizer.json").exists() or not (folder / "tokenizer_config.json").exists():
        return None
    files = {"tokenizer": folder / "tokenizer.json", "config": folder / "tokenizer_config.json"}
    if (folder / "chat_template.jinja").exists():
        files["template"] = folder / "chat_template.jinja"
    return files


def hf_cache_tokenizer(source: str) -> dict[str, Path] | None:
    """The tokenizer files of Hub id `source` in the Hugging Face cache, if downloaded (no network)."""
    if source.count("/") != 1 or ":" in source:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = {key: try_to_load_from_cache(source, name) for key, name in
             (("tokenizer", "tokenizer.json"), ("config", "tokenizer_config.json"), ("template", "chat_template.jinja"))}
    if not isinstance(found["tokenizer"], str) or not isinstance(found["config"], str):
        return None
    return {key: Path(path) for key, path in found.items() if isinstance(path, str)}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json holds it: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatPrompts:
    """Chat-formatted prompt lengths with one model's tokenizer and template (see the module docstring)."""

    def __init__(self, files: dict[str, Path]):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        config = json.loads(files["config"].read_text())
        template = files["template"].read_text() if "template" in files else config.get("chat_template")
        if isinstance(template, list):  # named templates: transformers takes "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str):
            raise ValueError(f"{files['config']}: no chat template")

        def raise_exception(message: str) -> None:
            raise jinja2.exceptions.TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: \
            json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self.template = env.from_string(template)
        except jinja2.exceptions.TemplateError as err:
            raise ValueError(f"{files.get('template', files['config'])}: chat template not rendered here: {err}") from None
        self._errors = jinja2.exceptions.TemplateError
        self.special = {key: text for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                                              "cls_token", "mask_token")
                        if (text := _token_text(config.get(key))) is not None}
        self.tokenizer = Tokenizer.from_file(str(files["tokenizer"]))
        # as transformers calls it (`set_truncation_and_padding` per call): tokenizer.json may keep a
        # padding setting, which would pad every prompt of a batch to the longest
        self.tokenizer.no_padding()
        self.tokenizer.no_truncation()

    def render(self, messages: list[dict]) -> str:
        return self.template.render(messages=messages, add_generation_prompt=True, tools=None, documents=None,
                                    **self.special)

    def lengths(self, rows: Iterable[dict], where: str = "rows") -> list[int]:
        """Tokens of each row's chat-formatted prompt (no special tokens added on top of the template);
        a row the template cannot render is a ValueError naming `where` and the row."""
        texts = []
        for number, row in enumerate(rows, 1):
            try:
                texts.append(self.render(row["prompt"]))
            except (KeyError, TypeError, self._errors) as err:
                raise ValueError(f"{where}, row {number} (id {row.get('id')!r}): prompt not rendered: {err}") from None
        return [len(e.ids) for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]


def _stamp(paths: Iterable[Path]) -> str:
    """A key for files by path, size and modification time (a changed file changes it)."""
    parts = [f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(paths, key=str)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def longest_prompts(data_dir: Path, files: dict[str, Path], model: str) -> dict[str, int]:
    """{split: tokens of its longest prompt} for the splits of `data_dir` that exist, read from the
    cache when neither the data nor the tokenizer changed, else measured (and the cache rewritten).
    ValueError (naming the file) when the template or a row cannot be rendered."""
    from esgrpo.files import read_jsonl, write_json

    present = {split: data_dir / name for split, name in SPLIT_FILES.items() if (data_dir / name).exists()}
    if not present:
        return {}
    key = _stamp([*present.values(), *files.values()])
    cache_path = data_dir / CACHE_FILE
    cache = json.loads(cache_path.read_text()) if cache_path.exists() else {}
    entry = cache.get(model)
    if entry and entry.get("key") == key:
        return {split: int(n) for split, n in entry["longest"].items()}
    prompts = ChatPrompts(files)
    lengths = {split: prompts.lengths(read_jsonl(path), str(path)) for split, path in present.items()}
    longest = {split: max(values) for split, values in lengths.items() if values}  # an empty split says nothing
    cache[model] = {"key": key, "longest": longest, "tokenizer": str(files["tokenizer"])}
    write_json(cache_path, cache)
    return longest


def plan_tokens(measured: int) -> int:
    """The plan's prompt part of max_model_len for a measured longest prompt: whole KV blocks."""
    return math.ceil(measured / VLLM_BLOCK_TOKENS) * VLLM_BLOCK_TOKENS
