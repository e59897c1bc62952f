"""The tiny Llama that answers "Is a+b=c?" in the boxed format (model_dir, a fixture every test module may ask
for: tests/conftest.py loads this module as a plugin) and its rows; tests/grpo/test_trainer.py's docstring says how
it is taught."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from esgrpo.tasks.base import make_row


def yesno_rows(n: int = 48) -> list[dict]:
    rows = []
    for i in range(n):
        a, b = i % 7, (3 * i) % 5
        claimed = a + b + (0 if i % 2 else 1)
        rows.append(make_row(f"r{i}", f"Is {a}+{b}={claimed}?", "yes" if claimed == a + b else "no",
                             {"solution": f"{a}+{b}={a + b}"}))
    return rows


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A tiny Llama that answers in the boxed format, right about half the time (see module docstring)."""
    from esgrpo.engines.rollout import prompt_texts
    from esgrpo.models.default import TinyLlamaSpec, build_tiny_llama, train_tokenizer
    from esgrpo.models.loading import save_model

    rows = yesno_rows()
    answers = ["\\boxed{yes}", "\\boxed{no}"]
    tokenizer = train_tokenizer([r["prompt"][0]["content"] for r in rows] + answers, vocab_size=300)
    spec = TinyLlamaSpec(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, max_position_embeddings=64)
    model = build_tiny_llama(tokenizer, spec, seed=0)
    prompts = prompt_texts(tokenizer, rows)
    texts = [p + answers[i % 2] + tokenizer.eos_token for i, p in enumerate(prompts)]
    enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(40):
        loss = model(**enc, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    path = tmp_path_factory.mktemp("tiny") / "model"
    save_model(model, tokenizer, path)
    return path
