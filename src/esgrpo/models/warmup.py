"""Supervised warm-up of the offline default model: a base that is right sometimes, not always.

RL needs a base that already solves some prompts (a random model scores 0, so ES z-scores
and GRPO advantages are all zero). The warm-up trains on worked solutions of the training
splits, loss on the answer tokens only, in the same chat format RL uses. A fixed subset of
questions (by a stable hash) is taught with the answer outside \\boxed{}, so the base is
sometimes right in the wrong format, as instruct models are before RL.

It stops at the first check where every task's greedy accuracy on a dev subset reaches
`min_accuracy`, or any task RL will train reaches `max_accuracy` (RL needs headroom; a held-out
task, warmed up so that forgetting is measurable, may be learnt well), or at `max_steps`: all
decided by the step count and the seed, so a rerun gives the same weights.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

from esgrpo.engines.rollout import HFEngine, prompt_texts
from esgrpo.tasks.offline import worked_solution
from esgrpo.tasks.rewards import reward


@dataclass
class WarmupConfig:
    steps_max: int = 3000
    batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.01
    check_every: int = 100
    dev_size: int = 64
    min_accuracy: float = 0.15
    max_accuracy: float = 0.6
    wrong_format_fraction: float = 0.3
    max_new_tokens: int = 24
    seed: int = 0


def wrong_format(question: str, fraction: float) -> bool:
    return zlib.crc32(("format:" + question).encode()) % 1000 < fraction * 1000


def build_examples(tokenizer, rows: list[dict], fraction: float, rng: random.Random) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) for every row: chat prompt + worked solution + turn end."""
    prompts = prompt_texts(tokenizer, rows)
    examples = []
    for row, prompt in zip(rows, prompts, strict=True):
        question = row["prompt"][-1]["content"]
        target = worked_solution(row, wrong_format(question, fraction), rng) + tokenizer.eos_token
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        target_ids = tokenizer(target, add_special_tokens=False)["input_ids"]
        examples.append((prompt_ids + target_ids, len(prompt_ids)))
    return examples


def _batch(examples: list[tuple[list[int], int]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full_like(input_ids, -100)
    mask = torch.zeros_like(input_ids)
    for i, (ids, prompt_len) in enumerate(examples):
        # Right padding for training: positions then start at 0 for every row.
        input_ids[i, :len(ids)] = torch.tensor(ids)
        labels[i, prompt_len:len(ids)] = torch.tensor(ids[prompt_len:])
        mask[i, :len(ids)] = 1
    return input_ids, mask, labels


def greedy_accuracy(model, tokenizer, rows: list[dict], verifier: str, max_new_tokens: int) -> float:
    engine = HFEngine(model, tokenizer)
    rollouts = engine.generate(rows, n=1, temperature=0.0, max_new_tokens=max_new_tokens)
    scores = [reward(verifier, texts[0], row["answer"], row["meta"]) for texts, row
              in zip(rollouts.texts, rows, strict=True)]
    return sum(scores) / len(scores)


def warm_up(model, tokenizer, train_rows: dict[str, list[dict]], verifiers: dict[str, str],
            cfg: WarmupConfig, log: Callable[[dict], None] = print,
            headroom_tasks: Collection[str] | None = None) -> dict:
    """Train in place; returns the history of checks and why it stopped. `headroom_tasks`: the tasks
    `max_accuracy` applies to (those RL trains; default every task)."""
    headroom = list(train_rows) if headroom_tasks is None else list(headroom_tasks)
    rng = random.Random(cfg.seed)
    dev = {task: rows[:cfg.dev_size] for task, rows in train_rows.items()}
    examples = [ex for rows in train_rows.values()
                for ex in build_examples(tokenizer, rows, cfg.wrong_format_fraction, rng)]
    if len(examples) < cfg.batch_size:  # no batch would ever fill: the loop below would never step
        raise ValueError(f"default_model.warmup.batch_size={cfg.batch_size} is more than the {len(examples)} "
                         f"warm-up examples (the tasks' training rows): lower it or raise train_size")
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    generator = torch.Generator().manual_seed(cfg.seed)
    history, started, reason = [], time.time(), "steps_max"
    step = 0
    while step < cfg.steps_max:
        order = torch.randperm(len(examples), generator=generator).tolist()
        for start in range(0, len(order) - cfg.batch_size + 1, cfg.batch_size):
            model.train()
            input_ids, mask, labels = _batch([examples[i] for i in order[start:start + cfg.batch_size]],
                                             tokenizer.pad_token_id)
            loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
            if step % cfg.check_every == 0 or step == cfg.steps_max:
                model.eval()
                accuracy = {task: greedy_accuracy(model, tokenizer, rows, verifiers[task], cfg.max_new_tokens)
                            for task, rows in dev.items()}
                check = {"step": step, "loss": loss.item(), "seconds": time.time() - started,
                         "dev_accuracy": accuracy}
                history.append(check)
                log(check)
                if min(accuracy.values()) >= cfg.min_accuracy:
                    reason = "every task reached min_accuracy"
                elif max(accuracy[task] for task in headroom) >= cfg.max_accuracy:
                    reason = "a trained task reached max_accuracy"
                else:
                    reason = None
                if reason:
                    model.eval()
                    return {"steps": step, "stopped_because": reason, "checks": history}
            if step >= cfg.steps_max:
                break
    model.eval()
    return {"steps": step, "stopped_because": reason or "steps_max", "checks": history}
