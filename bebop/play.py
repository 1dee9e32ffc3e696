"""A task played through an engine: the one path of eval-mtp and train-mtp (`complete`), pretraining's evaluation and
RL (`bebop.rl.batch.collect`).

    prompts = prompt_ids(tokenizer, examples, prompt_format)          # raw text, or the chat template's layout
    config  = for_task(config, task, tokenizer, model_vocab)          # + the task's stops, + vocab_limit
    rollout = engine.generate(prompts, config, env=make_env(...), decode=tokenizer.decode)
    texts   = [text_before(tokenizer.decode, tokens, stop)]           # what rewards see

`play` returns all of it as one `Played`; `Played.completions()` is each example's view of it (what the policy wrote,
with its entropies and origins), which `complete` returns with the engine's counters.

Stops. A task names its stops as text (`task.stop_strings`; "<eos>" is the tokenizer's EOS); `for_task` hands them
to the engine, which decides each stop once (`bebop.engine.stops`), so "</call>" works whether a tokenizer has it as
one token or three. The environment of a multi-turn task (`make_env`: at `</call>` the engine appends the
environment's `<result>...</result>` and continues from its cached prefix) reads the completion through the stop's
end; a reward reads it without the stop that ended the row. Stops the environment answered stay in the text: they are
part of the transcript.

Padding ids. A checkpoint may have more embedding rows than its tokenizer has tokens; `for_task` sets the
config's `vocab_limit` to the tokenizer's size so the engine never samples an id that decodes to nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Sequence

from bebop.data.prompts import PromptFormat, prompt_ids, vocab_limit
from bebop.data.tasks import Example, Task
from bebop.data.tokenizer import Tokenizer
from bebop.engine.backend import RolloutBackend
from bebop.engine.rollout import Env, GenerationConfig, Rollout
from bebop.engine.stops import Stop, split_stops, text_before, text_through
from bebop.metrics import pool


def for_task(config: GenerationConfig, task: Task, tokenizer: Tokenizer, model_vocab: int) -> GenerationConfig:
    """`config` plus the task's stops (ids and multi-token strings) and the tokenizer's vocab_limit."""
    ids, strings = split_stops(task.stop_strings, tokenizer.encode, tokenizer.eos_id)
    return dataclasses.replace(config, stop_tokens=tuple(dict.fromkeys(config.stop_tokens + ids)),
                               stop_strings=tuple(dict.fromkeys(config.stop_strings + strings)),
                               vocab_limit=vocab_limit(tokenizer, model_vocab))


def stop_ids(tokenizer: Tokenizer, tasks: Iterable[Task]) -> tuple[int, ...]:
    """Every token id that ends a turn of `tasks`: the tokenizer's end of sequence and the tasks' one-token stops (a
    draft vocabulary must hold them, or a draft could never end a turn)."""
    ids = [tokenizer.eos_id]
    for task in tasks:
        ids += split_stops(task.stop_strings, tokenizer.encode, tokenizer.eos_id)[0]
    return tuple(dict.fromkeys(ids))


def make_env(task: Task, tokenizer: Tokenizer, examples: Sequence[Example]) -> Env | None:
    """The engine's env callback for a multi-turn task (None for single-turn tasks): row i's transcript so far is
    answered by the task's environment, whose reply continues from the cached prefix."""
    if getattr(task, "env", None) is None:
        return None

    def env(row: int, tokens: list[int], stop: Stop) -> list[int] | None:
        reply = task.env.respond(examples[row], text_through(tokenizer.decode, tokens, stop))
        return None if reply is None else tokenizer.encode(reply)

    return env


@dataclass
class Completion:
    """One example answered by the policy (environment replies included for agent tasks)."""

    tokens: list[int]  # completion tokens after the prompt
    policy: list[bool]  # per token: True where the policy wrote it, False for an environment reply
    text: str  # the completion as a reward reads it: environment replies included, the final stop not
    entropy: list[float]  # target entropy H(p) at each policy token, in order
    origin: list[str]  # engine origin of each policy token ("plain" | "accepted" | "recovered" | "bonus")


@dataclass
class Played:
    """Examples played through an engine."""

    prompts: list[list[int]]  # [N] prompt ids
    rollout: Rollout
    texts: list[str]  # [N] completions as rewards see them (environment replies included, final stop not)
    config: GenerationConfig  # the config the engine ran (the task's stops and vocab_limit added)

    def completions(self) -> list[Completion]:
        """Each example's completion, its entropies and origins at the policy's own tokens."""
        r = self.rollout
        return [Completion(list(tokens), list(mask), text, [h for h, m in zip(entropy, mask) if m],
                           [o for o, m in zip(origin, mask) if m])
                for tokens, mask, text, entropy, origin in zip(r.tokens, r.policy_mask, self.texts, r.entropy,
                                                               r.origin)]

    def counters(self) -> dict:
        """The engine's counters and timings: tokens, wall time and, where it drafted (a static depth, or
        gamma="auto" pooling its steps' depths), the `spec/*` counters (rates are derived by the reader)."""
        totals = {k: self.rollout.stats[k] for k in ("num_generated_tokens", "wall_time_s")}
        if self.config.depth > 0:
            totals.update(pool([self.rollout.stats]))
        return totals


def play(engine: RolloutBackend, tokenizer: Tokenizer, task: Task, examples: Sequence[Example],
         config: GenerationConfig, *, prompt_format: PromptFormat | None = None) -> Played:
    """Prompt (in `prompt_format`; default: the raw text), generate (multi-turn for tasks with an environment) and
    decode every example."""
    prompts = prompt_ids(tokenizer, examples, prompt_format)
    config = for_task(config, task, tokenizer, engine.config.vocab_size)
    rollout = engine.generate(prompts, config, env=make_env(task, tokenizer, examples), decode=tokenizer.decode)
    texts = [text_before(tokenizer.decode, t, stop) for t, stop in zip(rollout.tokens, rollout.stops)]
    return Played(prompts, rollout, texts, config)


def complete(engine: RolloutBackend, tokenizer: Tokenizer, task: Task, examples: Sequence[Example],
             config: GenerationConfig, *, prompt_format: PromptFormat | None = None) -> tuple[list[Completion], dict]:
    """Answer every example (`play`): each one's `Completion` and the engine's counters (`Played.counters`)."""
    played = play(engine, tokenizer, task, examples, config, prompt_format=prompt_format)
    return played.completions(), played.counters()
