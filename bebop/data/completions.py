"""Completions: a policy answers task prompts through an `Engine`.

`complete` plays the agent protocol when the task has an environment (`make_env`: at `</call>` the engine appends
the environment's `<result>...</result>` and continues from its cached prefix). It returns per-example tokens with
a mask of what the policy wrote, plus the engine's per-token entropy and origin, which `train-mtp`
(self-generated data), `eval-mtp` (acceptance) and RL use. Pretraining's demonstrations are `bebop.data.batches`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from bebop.data.tasks import Example, Task
from bebop.data.tokenizer import CharTokenizer
from bebop.engine import Engine, GenerationConfig
from bebop.metrics import pool


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
