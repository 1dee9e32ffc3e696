"""A task played through an engine, the path `complete` (eval, train-mtp) and `collect` (RL) share.

    prompts = prompt_ids(tokenizer, examples, prompt_format)          # raw text, or the chat template's layout
    config  = for_task(config, task, tokenizer, model_vocab)          # + the task's stops, + vocab_limit
    rollout = engine.generate(prompts, config, env=make_env(...), decode=tokenizer.decode)
    texts   = [text_before(tokenizer.decode, tokens, stop)]           # what rewards see

Stops. A task names its stops as text (`task.stop_strings`; "<eos>" is the tokenizer's EOS); `for_task` hands them
to the engine, which decides each stop once (`bebop.engine.stops`), so "</call>" works whether a tokenizer has it as
one token or three. The environment of a multi-turn task reads the completion through the stop's end; a reward
reads it without the stop that ended the row. Stops the environment answered stay in the text: they are part of
the transcript.

Padding ids. A checkpoint may have more embedding rows than its tokenizer has tokens; `for_task` sets the
config's `vocab_limit` to the tokenizer's size so the engine never samples an id that decodes to nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Sequence

from bebop.data.prompt_options import CHAT_MODES
from bebop.data.tasks import DatasetConfig, Example, Task
from bebop.data.tokenizer import Tokenizer
from bebop.engine.rollout import Env, GenerationConfig, Rollout
from bebop.engine.stops import Stop, split_stops, text_before, text_through


@dataclass(frozen=True)
class PromptFormat:
    """How an example's prompt becomes the policy's input: the raw text, or a chat conversation
    ([system (optional), user: prompt] with the assistant's generation prompt) through the tokenizer's template."""

    chat_template: bool = False
    system: str | None = None  # the system message; only with the chat template

    def __post_init__(self) -> None:
        if self.system is not None and (not isinstance(self.system, str) or not self.system):
            raise ValueError(f"system must be a non-empty string or None, got {self.system!r}")
        if self.system is not None and not self.chat_template:
            raise ValueError("a system prompt needs the chat template (--chat-template on|auto)")


def dataset_config(config) -> DatasetConfig:
    """The columns a job config reads its dataset tasks with."""
    return DatasetConfig(prompt_key=config.prompt_key, answer_key=config.answer_key)


def job_prompt_format(config, tokenizer: Tokenizer) -> PromptFormat:
    """The prompt format a job config's chat_template / system_prompt ask for, with this tokenizer."""
    return prompt_format(config.chat_template, tokenizer, system=config.system_prompt)


def prompt_format(mode: str, tokenizer: Tokenizer, system: str | None = None) -> PromptFormat:
    """The format for --chat-template `mode` ("on" | "off" | "auto") with this tokenizer."""
    if mode not in CHAT_MODES:
        raise ValueError(f"--chat-template must be one of {CHAT_MODES}, got {mode!r}")
    if mode == "on" and not tokenizer.has_chat_template:
        raise ValueError("--chat-template on: the tokenizer has no chat template (use off, or auto)")
    chat = mode == "on" or (mode == "auto" and tokenizer.has_chat_template)
    if system is not None and not chat:
        raise ValueError("--system-prompt needs a chat template, and this run has none")
    return PromptFormat(chat_template=chat, system=system)


def prompt_ids(tokenizer: Tokenizer, examples: Sequence[Example], fmt: PromptFormat | None = None) -> list[list[int]]:
    """The token ids of each example's prompt in format `fmt` (default: the raw text)."""
    fmt = fmt or PromptFormat()
    if not fmt.chat_template:
        return [tokenizer.encode(e.prompt) for e in examples]
    system = [] if fmt.system is None else [{"role": "system", "content": fmt.system}]
    return [tokenizer.encode(tokenizer.chat_prompt(system + [{"role": "user", "content": e.prompt}]))
            for e in examples]


def vocab_limit(tokenizer: Tokenizer, model_vocab: int) -> int | None:
    """The tokenizer's size when the model has more ids than it (padding rows), else None (nothing to mask)."""
    return tokenizer.vocab_size if tokenizer.vocab_size < model_vocab else None


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
class TaskRollout:
    prompts: list[list[int]]  # [N] prompt ids
    rollout: Rollout
    texts: list[str]  # [N] completions as rewards see them (environment replies included, final stop not)
    config: GenerationConfig  # the config the engine ran (the task's stops and vocab_limit added)


def run_task(engine, task: Task, tokenizer: Tokenizer, examples: Sequence[Example], config: GenerationConfig, *,
             prompt_format: PromptFormat | None = None) -> TaskRollout:
    """Prompt, generate (multi-turn for tasks with an environment) and decode every example."""
    prompts = prompt_ids(tokenizer, examples, prompt_format)
    config = for_task(config, task, tokenizer, engine.config.vocab_size)
    rollout = engine.generate(prompts, config, env=make_env(task, tokenizer, examples),
                              decode=tokenizer.decode)
    texts = [text_before(tokenizer.decode, t, stop) for t, stop in zip(rollout.tokens, rollout.stops)]
    return TaskRollout(prompts, rollout, texts, config)
