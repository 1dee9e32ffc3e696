"""The head's training data: the policy's own samples at the rollout temperature, cached to a file, and fixed
batches carrying the frozen backbone's hidden states (logits are never cached: at a real vocabulary they are V/d
times larger)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from bebop.data.batches import pad
from bebop.data.prompts import job_prompt_format, prompt_ids
from bebop.data.tasks import Task, dataset_config
from bebop.data.tasks import get as get_task
from bebop.device import to_device
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig
from bebop.heads.config import TrainMTPConfig
from bebop.models.transformer import Transformer
from bebop.play import complete

DATA_SEED = 2_000_003  # prompts for self-generated data: disjoint from pretraining's and eval's seeds


def fingerprint(model: Transformer) -> str:
    """A short hash of the policy's weights: a data cache is only valid for the policy that sampled it."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ data
def generate_data(model: Transformer, tokenizer, config: TrainMTPConfig, tasks: dict[str, Task] | None = None
                  ) -> dict:
    """Policy samples at the rollout temperature: {"tokens": [[int]], "trainable": [[bool]], "key": {...}}.

    trainable[i][j] is True where token j was written by the policy (not prompt, not tool replies). `tasks`:
    config.tasks as the job got them (`bebop.data.tasks.get`; None: got here)."""
    engine, seqs, trainable = Engine(model), [], []
    fmt = job_prompt_format(config, tokenizer)
    per_task = -(-config.num_sequences // len(config.tasks))
    tasks = tasks if tasks is not None else {n: get_task(n, dataset_config(config)) for n in config.tasks}
    for t, name in enumerate(config.tasks):
        task = tasks[name]
        examples = task.sample(per_task, seed=DATA_SEED + config.seed)
        gen = GenerationConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature, gamma=0,
                               seed=config.seed * 31 + t)
        for start in range(0, len(examples), 64):  # chunks keep the engine's padded batch small
            chunk = examples[start : start + 64]
            completions, _ = complete(engine, tokenizer, task, chunk, gen, prompt_format=fmt)
            for prompt, c in zip(prompt_ids(tokenizer, chunk, fmt), completions):
                seqs.append(prompt + c.tokens)
                trainable.append([False] * len(prompt) + c.policy)
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(config.seed)).tolist()
    order = order[: config.num_sequences]
    key = {**config.data_key(), "policy": fingerprint(model)}
    return {"tokens": [seqs[i] for i in order], "trainable": [trainable[i] for i in order], "key": key}


def load_or_generate(path: Path | None, model: Transformer, tokenizer, config: TrainMTPConfig,
                     tasks: dict[str, Task] | None = None) -> dict:
    if path is not None and path.is_file():
        data = torch.load(path, weights_only=False)
        want = {**config.data_key(), "policy": fingerprint(model)}
        if data.get("key") != want:
            raise ValueError(f"--data {path} was generated with {data.get('key')}, not {want} (settings and "
                             "policy fingerprint): pass another path, or the policy and settings that made it")
        return data
    data = generate_data(model, tokenizer, config, tasks)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(data, tmp)
        tmp.replace(path)
    return data


def anchor_mask(trainable: torch.Tensor, lengths: torch.Tensor, depth: int) -> torch.Tensor:
    """[B, T] bool: anchors t whose chain inputs and targets t+1..t+depth+1 are all policy-written."""
    _, T = trainable.shape
    padded = torch.nn.functional.pad(trainable, (0, depth + 2), value=False)  # [B, T + depth + 2]
    window = padded.unfold(1, depth + 1, 1)[:, 1 : T + 1]  # [B, T, depth+1]: positions t+1..t+depth+1
    inside = torch.arange(T)[None, :] + depth + 1 < lengths[:, None]  # [B, T]
    return window.all(-1) & inside


@torch.no_grad()
def make_batches(model: Transformer, data: dict, config: TrainMTPConfig, use_bf16: bool) -> list[dict]:
    """Fixed batches (sorted by length) with the frozen backbone's hidden states [B, T, d] precomputed."""
    order = sorted(range(len(data["tokens"])), key=lambda i: len(data["tokens"][i]))
    batches, device = [], model.lm_head.weight.device
    for start in range(0, len(order), config.batch_size):
        idx = order[start : start + config.batch_size]
        tokens, lengths = pad([data["tokens"][i] for i in idx], 0)
        trainable, _ = pad([[int(m) for m in data["trainable"][i]] for i in idx], 0)
        mask = anchor_mask(trainable.bool(), lengths, config.depth)
        if not bool(mask.any()):
            continue
        tokens, mask = to_device(tokens, device), to_device(mask, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            _, hidden = model(tokens, compute_logits=False)  # [B, T, d]
        batches.append({"tokens": tokens, "mask": mask, "hidden": hidden})
    return batches


def split_heldout(batches: list[dict], fraction: float) -> tuple[list[dict], list[dict]]:
    """Every k-th batch is held out (batches are sorted by length, so both sides span all lengths)."""
    if len(batches) < 2:
        raise ValueError(f"need at least 2 batches of self-generated data to hold one out, got {len(batches)}")
    every = min(len(batches), max(2, round(1 / fraction)))
    held = [i for i in range(len(batches)) if i % every == every - 1]
    return [b for i, b in enumerate(batches) if i not in held], [batches[i] for i in held]
