"""Completions: a policy answers task prompts through an `Engine`.

`complete` plays the agent protocol when the task has an environment (`make_env`: at `</call>` the engine appends
the environment's `<result>...</result>` and continues from its cached prefix), through `bebop.prompting`, the
path RL's `collect` shares. It returns per-example tokens with a mask of what the policy wrote, plus the engine's
per-token entropy and origin, which `train-mtp` (self-generated data), `eval-mtp` (acceptance) and RL use. Pretraining's demonstrations are `bebop.data.batches`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from bebop.data.tasks import Example, Task
from bebop.data.tokenizer import Tokenizer
from bebop.engine import Engine, GenerationConfig
from bebop.metrics import pool
from bebop.prompting import PromptFormat, make_env, run_task

__all__ = ["Completion", "complete", "make_env"]


@dataclass
class Completion:
    """One example answered by the policy (environment replies included for agent tasks)."""

    tokens: list[int]  # completion tokens after the prompt
    policy: list[bool]  # per token: True where the policy wrote it, False for an environment reply
    text: str  # the completion as a reward reads it: environment replies included, the final stop not
    entropy: list[float]  # target entropy H(p) at each policy token, in order
    origin: list[str]  # engine origin of each policy token ("plain" | "accepted" | "recovered" | "bonus")


def complete(engine: Engine, tokenizer: Tokenizer, task: Task, examples: Sequence[Example],
             config: GenerationConfig, *, prompt_format: PromptFormat | None = None) -> tuple[list[Completion], dict]:
    """Answer every example with the engine (multi-turn through `make_env` for tasks with an environment), prompts
    in `prompt_format` (default: the raw text; `bebop.prompting`).

    Returns the completions and the engine's counters/timings (`spec/*` rates derived from the counters by
    the caller)."""
    played = run_task(engine, task, tokenizer, examples, config, prompt_format=prompt_format)
    rollout, config = played.rollout, played.config
    done = []
    for tokens, mask, text, entropy, origin in zip(rollout.tokens, rollout.policy_mask, played.texts, rollout.entropy,
                                                   rollout.origin):
        done.append(Completion(list(tokens), list(mask), text, [h for h, m in zip(entropy, mask) if m],
                               [o for o, m in zip(origin, mask) if m]))
    totals = {k: rollout.stats[k] for k in ("num_generated_tokens", "wall_time_s")}
    if config.depth > 0:  # a static depth, or gamma="auto" (the engine's counters pool its steps' depths)
        totals.update(pool([rollout.stats]))
    return done, totals
