"""The head's corpus: the policy's own answers to task prompts at the rollout temperature, cached on disk per policy.

A head learns the distribution it will draft for, so its data is self-distilled: the frozen policy answers each
task's prompts through bebop's engine (plain sampling, large batches, in the dtype its rollouts sample in; agent
prompts played out against their environment), and every token the policy wrote is a training position. Generating is most of a real model's head
recipe, so each task's answers are cached once, in a file named by what fixes them (the policy's weights, the task,
the sampling dtype, the temperature, the count, the length, the seed and the prompt options), and every head trained
later on the same
settings reads them back: a change of any of these is another file, never a stale reuse.

    CACHE/<task>-<digest>.pt   {"tokens": [[int]], "trainable": [[bool]], "key": {...}}

`trainable[i][j]` is True where token j was written by the policy (not the prompt, not an environment's reply).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from bebop.data.prompts import job_prompt_format, prompt_ids
from bebop.data.tasks import Task, dataset_config
from bebop.data.tasks import get as get_task
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig
from bebop.heads.config import TrainMTPConfig
from bebop.models.transformer import Transformer
from bebop.play import complete

DATA_SEED = 2_000_003  # prompts for self-generated data: disjoint from pretraining's and eval's seeds
# Prompts per engine call: a few dozen rows keep a CPU's step near its best tokens/s, and each call's padded batch
# (rows that finish early idle until the longest does) small.
GENERATION_ROWS = 64


def fingerprint(model: Transformer) -> str:
    """A short hash of the policy's weights: a corpus is only valid for the policy that sampled it."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def task_key(config: TrainMTPConfig, task_name: str, index: int, policy: str, dtype: torch.dtype) -> dict:
    """What fixes one task's share of the corpus: the file is reused only when all of it matches."""
    names = ("temperature", "max_new_tokens", "seed", "prompt_key", "answer_key", "chat_template", "system_prompt")
    return {**{k: getattr(config, k) for k in names}, "task": task_name, "index": index,
            "count": per_task(config), "policy": policy, "dtype": str(dtype).removeprefix("torch.")}


def per_task(config: TrainMTPConfig) -> int:
    return -(-config.num_sequences // len(config.tasks))


def cache_file(cache: Path, key: dict) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", key["task"].rsplit("/", 1)[-1]).strip("-")[:40] or "task"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache / f"{slug}-{digest}.pt"


def generate_task(model: Transformer, tokenizer, config: TrainMTPConfig, task: Task, index: int) -> dict:
    """One task's share of the corpus: `per_task(config)` answers, sampled at the config's temperature."""
    engine, fmt = Engine(model), job_prompt_format(config, tokenizer)
    examples = task.sample(per_task(config), seed=DATA_SEED + config.seed)
    gen = GenerationConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature, gamma=0,
                           seed=config.seed * 31 + index)
    tokens, trainable = [], []
    for start in range(0, len(examples), GENERATION_ROWS):
        chunk = examples[start : start + GENERATION_ROWS]
        completions, _ = complete(engine, tokenizer, task, chunk, gen, prompt_format=fmt)
        for prompt, c in zip(prompt_ids(tokenizer, chunk, fmt), completions):
            tokens.append(prompt + c.tokens)
            trainable.append([False] * len(prompt) + c.policy)
    return {"tokens": tokens, "trainable": trainable}


def load_corpus(cache: Path | None, model: Transformer, tokenizer, config: TrainMTPConfig,
                tasks: dict[str, Task] | None = None, *, dtype: torch.dtype | None = None, log=None) -> dict:
    """The corpus for `config` on `model`: each task's answers read from `cache` when a run made them before, else
    generated (and written there, atomically); then shuffled together and cut to `config.num_sequences`.
    Returns {"tokens", "trainable", "key"}. `dtype`: what the policy samples in (as its rollouts do: bf16 where the
    CPU or GPU has it; None: the model's own); `tasks`: config.tasks as the job got them (`bebop.data.tasks.get`; None: got here);
    `log` (a str callable) hears what is generated and what is read."""
    tasks = tasks if tasks is not None else {n: get_task(n, dataset_config(config)) for n in config.tasks}
    policy, dtype = fingerprint(model), dtype or model.lm_head.weight.dtype
    sampler = None
    tokens, trainable = [], []
    for index, name in enumerate(config.tasks):
        key = task_key(config, name, index, policy, dtype)
        path = None if cache is None else cache_file(cache, key)
        if path is not None and path.is_file():
            part = torch.load(path, weights_only=False)
            if log:
                log(f"{name}: {len(part['tokens'])} answers read from {path}")
        else:
            if log:
                log(f"{name}: generating {per_task(config)} answers of up to {config.max_new_tokens} tokens")
            if sampler is None:  # a copy in the sampling dtype, made once and only when something is generated
                sampler = model if dtype == model.lm_head.weight.dtype else copy.deepcopy(model).to(dtype)
            part = {**generate_task(sampler, tokenizer, config, tasks[name], index), "key": key}
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.tmp")
                torch.save(part, tmp)
                tmp.replace(path)
        tokens += part["tokens"]
        trainable += part["trainable"]
    order = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(config.seed)).tolist()
    order = order[: config.num_sequences]
    return {"tokens": [tokens[i] for i in order], "trainable": [trainable[i] for i in order],
            "key": {**config.data_key(), "policy": policy}}


@dataclass(frozen=True)
class CorpusSource:
    """Where `train_mtp` finds its data: the corpus cache directory `cache` (None: $BEBOP_CACHE/corpus); `tasks`,
    the config's tasks as the job got them (`bebop.data.tasks.get`: each dataset read once, before the policy
    loaded; None: got by `train_mtp`); and, when several runs train on the same corpus (heads with different
    objectives), a dict `batches` they share: the first run keeps the backbone's batches there and a later one with
    the same data and batch settings reads them back instead of running the backbone (and the LM head) over the
    corpus again."""

    cache: Path | None = None
    batches: dict | None = None
    tasks: dict[str, Task] | None = None
