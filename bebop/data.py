"""Task text as token tensors: teacher demonstrations for pretraining, policy completions for the rest.

Two sources of sequences feed bebop's trainers:

* `demo_batches` streams demonstrations (`task.demonstration`, some deliberately wrong) for
  `bebop pretrain`. A sequence is `prompt + solution + EOS`; only solution tokens the policy itself would
  write carry loss (`loss_mask`): not the prompt, and not agent tool replies (`tool_mask`), which the
  environment writes. Examples are drawn a few batches at a time and sorted by length before being cut
  into batches, so padding stays small without changing what is trained on.
* `complete` lets a policy answer prompts through the `Engine`, playing the agent protocol when the task
  has an environment (`make_env`: at `</call>` the engine appends the environment's `<result>...</result>`
  and continues from its cached prefix). It returns per-example tokens with a mask of what the policy wrote, plus the engine's
  per-token entropy and origin, which `train-mtp` (self-generated data) and `eval-mtp` (acceptance) use.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from bebop.engine import Engine
from bebop.metrics import pool
from bebop.rollout import GenerationConfig
from bebop.tasks import TASKS, Example, Task, tool_mask
from bebop.tasks import get as get_task
from bebop.tokenizer import EOS, RESULT_CLOSE, RESULT_OPEN, CharTokenizer


def parse_tasks(names: Sequence[str]) -> tuple[str, ...]:
    """Validate task names ("math" | "code" | "agent"); ValueError naming the unknown ones."""
    names = tuple(names)
    bad = [n for n in names if n not in TASKS]
    if bad or not names:
        raise ValueError(f"unknown task names {bad or names!r}; valid names: {sorted(TASKS)}")
    return names


def encode_demo(tokenizer: CharTokenizer, example: Example, solution: str, *,
                prompt_loss: bool = False) -> tuple[list[int], list[bool]]:
    """(tokens, loss_mask) for `prompt + solution + EOS`: loss on the tokens the policy writes, and on the
    prompt too with `prompt_loss` (prompts repeat names and numbers, which teaches copying from context)."""
    prompt = tokenizer.encode(example.prompt)
    answer = tokenizer.encode(solution + EOS)
    written = tool_mask(answer, tokenizer.token_id(RESULT_OPEN), tokenizer.token_id(RESULT_CLOSE))
    return prompt + answer, [prompt_loss] * len(prompt) + written


def pad(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token lists -> tokens [B, T] long, lengths [B] long."""
    if not seqs or any(len(s) == 0 for s in seqs):
        raise ValueError("pad needs a non-empty list of non-empty sequences")
    lengths = torch.tensor([len(s) for s in seqs])
    tokens = torch.full((len(seqs), int(lengths.max())), pad_id, dtype=torch.long)
    for i, s in enumerate(seqs):
        tokens[i, : len(s)] = torch.as_tensor(list(s), dtype=torch.long)
    return tokens, lengths


def demo_batches(task_names: Sequence[str], tokenizer: CharTokenizer, *, batch_size: int, error_rate: float,
                 seed: int, bucket: int = 4, prompt_loss: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (tokens [B, T], loss_mask [B, T] bool) batches of demonstrations, tasks mixed evenly.

    Deterministic for a seed: prompts come from `task.sample(.., seed=seed + chunk)` and phrasing from one
    generator seeded with `seed`. Chunks of `bucket` batches are sorted by length to cut padding."""
    tasks = [get_task(n) for n in parse_tasks(task_names)]
    generator = torch.Generator().manual_seed(seed)
    chunk = 0
    while True:
        n = batch_size * bucket
        picks = torch.randint(len(tasks), (n,), generator=generator).tolist()
        per_task = [iter(task.sample(picks.count(i), seed=seed * 1000 + chunk)) for i, task in enumerate(tasks)]
        seqs = []
        for t in picks:
            example = next(per_task[t])
            solution = tasks[t].demonstration(example, generator, error_rate=error_rate)
            seqs.append(encode_demo(tokenizer, example, solution, prompt_loss=prompt_loss))
        seqs.sort(key=lambda s: len(s[0]))
        order = torch.randperm(bucket, generator=generator).tolist()
        for b in order:
            part = seqs[b * batch_size : (b + 1) * batch_size]
            tokens, lengths = pad([s for s, _ in part], tokenizer.pad_id)
            mask, _ = pad([[int(m) for m in ms] for _, ms in part], 0)
            yield tokens, mask.bool()
        chunk += 1


@dataclass
class Completion:
    """One example answered by the policy (environment replies included for agent tasks)."""

    tokens: list[int]  # completion tokens after the prompt
    policy: list[bool]  # per token: True where the policy wrote it, False for an environment reply
    entropy: list[float]  # target entropy H(p) at each policy token, in order
    origin: list[str]  # engine origin of each policy token ("plain" | "accepted" | "recovered" | "bonus")


def make_env(task: Task, tokenizer: CharTokenizer, examples: Sequence[Example]):
    """The engine's env callback for a multi-turn task (None for single-turn tasks): row i's completion so
    far is decoded and answered by the task's environment, whose reply continues from the cached prefix."""
    if getattr(task, "env", None) is None:
        return None

    def env(row: int, tokens: list[int]) -> list[int] | None:
        reply = task.env.respond(examples[row], tokenizer.decode(tokens))
        return None if reply is None else tokenizer.encode(reply)

    return env


def complete(engine: Engine, tokenizer: CharTokenizer, task: Task, examples: Sequence[Example],
             config: GenerationConfig) -> tuple[list[Completion], dict]:
    """Answer every example with the engine (multi-turn through `make_env` for tasks with an environment).

    Returns the completions and the engine's counters/timings (`spec/*` rates derived from the counters by
    the caller)."""
    stops = tokenizer.stop_ids(task.stop_strings)
    config = dataclasses.replace(config, stop_tokens=tuple(dict.fromkeys(config.stop_tokens + stops)))
    prompts = [tokenizer.encode(e.prompt) for e in examples]
    rollout = engine.generate(prompts, config, env=make_env(task, tokenizer, examples))
    done = []
    for tokens, mask, entropy, origin in zip(rollout.tokens, rollout.policy_mask, rollout.entropy, rollout.origin):
        done.append(Completion(list(tokens), list(mask), [h for h, m in zip(entropy, mask) if m],
                               [o for o, m in zip(origin, mask) if m]))
    totals = {k: rollout.stats[k] for k in ("num_generated_tokens", "wall_time_s")}
    if config.gamma > 0:
        totals.update(pool([rollout.stats]))
    return done, totals
