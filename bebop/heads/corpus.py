"""The head's corpus: the policy's own answers to task prompts at the rollout temperature, cached on disk per policy.

A head learns the distribution it will draft for, so its data is self-distilled: the frozen policy answers each
task's prompts through bebop's engine (batches of `corpus_rows` prompts, in the dtype its rollouts sample in; agent
prompts played out against their environment), and every token the policy wrote is a training position. The engine
samples plainly, or drafts with a head it is handed (`CorpusSource.drafter`, named by `corpus_head`) and verifies by
rejection sampling at depth `corpus_gamma`: RS is exact, so the answers are the policy's own distribution either way,
and only the speed differs (`bebop bench corpus` measures it).

Generating is most of a real model's head recipe, so each task's answers are cached once, in a file named by what
fixes them (the policy's weights, the task, the sampling dtype, the temperature, the count, the length, the seed, the
prompt options and, where set, the drafter and the rows per call: the same distribution, other samples), and every
head trained later on the same settings reads them back: a change of any of these is another file, never a stale
reuse. A task's generation writes what it has after every call (`.<file>.partial`), so an interrupted run resumes
there; it reports its progress and an estimate of the time left to `log`.

    CACHE/<task>-<digest>.pt   {"tokens": [[int]], "trainable": [[bool]], "key": {...}}
    CACHE/features-<digest>.pt the backbone's pass over a corpus in train-mtp's batches (bebop.heads.data)

`trainable[i][j]` is True where token j was written by the policy (not the prompt, not an environment's reply).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bebop.data.prompts import job_prompt_format, prompt_ids
from bebop.data.tasks import Task, dataset_config
from bebop.data.tasks import get as get_task
from bebop.engine import Engine
from bebop.engine.lookup import PromptLookup
from bebop.engine.rollout import GenerationConfig
from bebop.heads.config import GENERATION_ROWS, TrainMTPConfig
from bebop.files import cache_root
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.play import complete

DATA_SEED = 2_000_003  # prompts for self-generated data: disjoint from pretraining's and eval's seeds
CALL_SEED = 7_919  # the sampling seed's stride per answer of a task (a call's first), past any task's index


def fingerprint(model: torch.nn.Module) -> str:
    """A short hash of a module's weights (a policy's, a drafting head's with its draft vocabulary): a corpus is only
    valid for the policy that sampled it."""
    digest = hashlib.sha256()
    tensors = dict(model.state_dict())
    if getattr(model, "draft_ids", None) is not None:
        tensors["draft_ids"] = model.draft_ids
    for name, tensor in sorted(tensors.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def task_key(config: TrainMTPConfig, task_name: str, index: int, policy: str, dtype: torch.dtype,
             drafter: MTPHead | PromptLookup | None = None) -> dict:
    """What fixes one task's share of the corpus: the file is reused only when all of it matches. The drafter and the
    rows per call change which samples are drawn, not their distribution; they enter the key only where set, so a
    plainly sampled corpus keeps the name it always had."""
    names = ("temperature", "max_new_tokens", "seed", "prompt_key", "answer_key", "chat_template", "system_prompt")
    key = {**{k: getattr(config, k) for k in names}, "task": task_name, "index": index,
           "count": per_task(config), "policy": policy, "dtype": str(dtype).removeprefix("torch.")}
    if drafter is not None:
        head = "lookup" if isinstance(drafter, PromptLookup) else fingerprint(drafter)
        key["draft"] = {"head": head, "gamma": config.corpus_gamma, "method": "rs"}
    if config.corpus_rows != GENERATION_ROWS:
        key["rows"] = config.corpus_rows
    return key


def per_task(config: TrainMTPConfig) -> int:
    return -(-config.num_sequences // len(config.tasks))


def cache_file(cache: Path, key: dict) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", key["task"].rsplit("/", 1)[-1]).strip("-")[:40] or "task"
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return cache / f"{slug}-{digest}.pt"


def generate_task(model: Transformer, tokenizer, config: TrainMTPConfig, task: Task, index: int, *,
                  drafter: MTPHead | PromptLookup | None = None, done: dict | None = None, on_call=None) -> dict:
    """One task's share of the corpus: `per_task(config)` answers, sampled at the config's temperature,
    `config.corpus_rows` prompts per engine call, drafted by `drafter` and verified by RS when one is given.
    `done`: the answers of an interrupted run ({"tokens", "trainable"}, whole calls), continued from; `on_call`
    hears the answers so far after every call."""
    engine, fmt = Engine(model, drafter), job_prompt_format(config, tokenizer)
    examples = task.sample(per_task(config), seed=DATA_SEED + config.seed)
    gen = GenerationConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                           gamma=0 if drafter is None else config.corpus_gamma, method="rs")
    part = {"tokens": list((done or {}).get("tokens", [])), "trainable": list((done or {}).get("trainable", []))}
    rows = config.corpus_rows
    for start in range(len(part["tokens"]), len(examples), rows):
        chunk = examples[start : start + rows]
        # each call its own seed: the engine's random streams are per row of a call, so calls sharing one would
        # answer a prompt that recurs at the same row (a small split cycled through) with the same draws
        call = dataclasses.replace(gen, seed=config.seed * 31 + index + CALL_SEED * start)
        completions, _ = complete(engine, tokenizer, task, chunk, call, prompt_format=fmt)
        for prompt, c in zip(prompt_ids(tokenizer, chunk, fmt), completions):
            part["tokens"].append(prompt + c.tokens)
            part["trainable"].append([False] * len(prompt) + c.policy)
        if on_call is not None:
            on_call(part)
    return part


class Progress:
    """How far a corpus's generation is, and when it will end: answers and tokens per minute since it began (what
    this run generated, not what an interrupted one had), told to `log` after every engine call."""

    def __init__(self, total: int, log):
        self.total, self.log, self.start, self.made, self.tokens = total, log, time.perf_counter(), 0, 0

    def told(self, name: str, part: dict, count: int, new_answers: int, new_tokens: int) -> None:
        self.made += new_answers
        self.tokens += new_tokens
        minutes = (time.perf_counter() - self.start) / 60
        rate = self.made / max(minutes, 1e-9)
        left = (self.total - self.made) / max(rate, 1e-9)
        if self.log:
            self.log(f"{name}: {len(part['tokens'])}/{count} answers; {rate:.1f} answers/min, "
                     f"{self.tokens / max(minutes * 60, 1e-9):.0f} tokens/s; about {left:.0f} min left")


def load_corpus(cache: Path | None, model: Transformer, tokenizer, config: TrainMTPConfig,
                tasks: dict[str, Task] | None = None, *, dtype: torch.dtype | None = None, log=None,
                drafter: MTPHead | PromptLookup | None = None) -> dict:
    """The corpus for `config` on `model`: each task's answers read from `cache` when a run made them before, else
    generated (and written there, atomically; an interrupted generation resumes from its partial file); then
    shuffled together and cut to `config.num_sequences`. Returns {"tokens", "trainable", "key"}. `dtype`: what the
    policy samples in (as its rollouts do: bf16 where the CPU or GPU has it; None: the model's own); `tasks`:
    config.tasks as the job got them (`bebop.data.tasks.get`; None: got here); `drafter`: the head `config.corpus_head`
    names (it must be given exactly when that is set); `log` (a str callable) hears what is generated and read."""
    if (drafter is None) != (config.corpus_head is None):
        raise ValueError(f"corpus_head is {config.corpus_head!r} but a drafting head was "
                         f"{'not ' if drafter is None else ''}handed in: name it in both or in neither")
    tasks = tasks if tasks is not None else {n: get_task(n, dataset_config(config)) for n in config.tasks}
    policy, dtype = fingerprint(model), dtype or model.lm_head.weight.dtype
    keys = {name: task_key(config, name, index, policy, dtype, drafter) for index, name in enumerate(config.tasks)}
    paths = {name: None if cache is None else cache_file(cache, key) for name, key in keys.items()}
    missing = [name for name, path in paths.items() if path is None or not path.is_file()]
    progress = Progress(per_task(config) * len(missing), log)
    sampler = None
    tokens, trainable = [], []
    for index, name in enumerate(config.tasks):
        path = paths[name]
        if name not in missing:
            part = torch.load(path, weights_only=False)
            if log:
                log(f"{name}: {len(part['tokens'])} answers read from {path}")
        else:
            if sampler is None:  # copies in the sampling dtype, made once and only when something is generated
                sampler = model if dtype == model.lm_head.weight.dtype else copy.deepcopy(model).to(dtype)
                drafter = drafter if drafter is None or isinstance(drafter, PromptLookup) else \
                    copy.deepcopy(drafter).to(device=model.lm_head.weight.device, dtype=dtype).eval()
            part = _generate(sampler, tokenizer, config, tasks[name], index, drafter, path, progress)
            part["key"] = keys[name]
            if path is not None:
                _save(part, path)
                path.with_name(f".{path.name}.partial").unlink(missing_ok=True)
        tokens += part["tokens"]
        trainable += part["trainable"]
    order = torch.randperm(len(tokens), generator=torch.Generator().manual_seed(config.seed)).tolist()
    order = order[: config.num_sequences]
    return {"tokens": [tokens[i] for i in order], "trainable": [trainable[i] for i in order],
            "key": {**config.data_key(), "policy": policy}}


def _generate(sampler, tokenizer, config: TrainMTPConfig, task: Task, index: int, drafter, path: Path | None,
              progress: Progress) -> dict:
    """One task's answers, resumed from its partial file where an interrupted run left one, saved after every call."""
    partial = None if path is None else path.with_name(f".{path.name}.partial")
    done = torch.load(partial, weights_only=False) if partial is not None and partial.is_file() else None
    count, seen = per_task(config), {"answers": 0 if done is None else len(done["tokens"])}
    if log := progress.log:
        how = "plain sampling" if drafter is None else f"drafted by {config.corpus_head}, RS at γ = {config.corpus_gamma}"
        log(f"{task.name}: generating {count} answers of up to {config.max_new_tokens} tokens ({how})"
            + (f", {seen['answers']} from an interrupted run" if done else ""))
    progress.total -= seen["answers"]

    def on_call(part: dict) -> None:
        new = part["tokens"][seen["answers"]:]
        written = sum(sum(t) for t in part["trainable"][seen["answers"]:])
        seen["answers"] = len(part["tokens"])
        if partial is not None:
            _save(part, partial)
        progress.told(task.name, part, count, len(new), written)

    return generate_task(sampler, tokenizer, config, task, index, drafter=drafter, done=done, on_call=on_call)


def _save(part: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(part, tmp)
    tmp.replace(path)


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
    # the head that drafts while the policy writes the corpus (TrainMTPConfig.corpus_head names it; the job loads it)
    drafter: MTPHead | PromptLookup | None = None

    @property
    def directory(self) -> Path:
        """The cache directory: `cache`, else $BEBOP_CACHE/corpus."""
        return self.cache if self.cache is not None else cache_root() / "corpus"
