"""A task played through an engine, the path `complete` (eval, train-mtp) and `collect` (RL) share.

    prompts = prompt_ids(tokenizer, examples, prompt_format)          # raw text, or the chat template's layout
    config  = for_task(config, task, tokenizer, model_vocab)          # + the task's stops, + vocab_limit
    rollout = engine.generate(prompts, config, env=make_env(...), decode=tokenizer.decode)
    texts   = [completion_text(tokenizer, tokens, reason, config)]    # what rewards see

Stops. A task names its stops as text (`task.stop_strings`; "<eos>" is the tokenizer's EOS). Those that are one
token become engine stop ids; the rest are matched on decoded text (`bebop.engine.rollout`), so "</call>" works
whether a tokenizer has it as one token or three. Either way a row's tokens run through the token that completes
the stop. The environment of a multi-turn task reads the completion through the stop string's end
(`transcript_text`); a reward reads it without the stop that ended the row (`completion_text`): "answer: 7" and
not "answer: 7<|im_end|>". Stops the environment answered stay in the text: they are part of the transcript.

Padding ids. A checkpoint may have more embedding rows than its tokenizer has tokens; `for_task` sets the
config's `vocab_limit` to the tokenizer's size so the engine never samples an id that decodes to nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

from bebop.data.prompt_options import CHAT_MODES
from bebop.data.tasks import DatasetConfig, Example, Task
from bebop.data.tokenizer import Tokenizer
from bebop.engine.rollout import Env, GenerationConfig, Rollout, find_stop


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
    ids, strings = tokenizer.stops(task.stop_strings)
    return dataclasses.replace(config, stop_tokens=tuple(dict.fromkeys(config.stop_tokens + ids)),
                               stop_strings=tuple(dict.fromkeys(config.stop_strings + strings)),
                               vocab_limit=vocab_limit(tokenizer, model_vocab))


def _final_stop(tokenizer: Tokenizer, tokens: list[int], config: GenerationConfig) -> tuple[str, tuple[int, int]]:
    """(the decoded tokens, (start, end) of the stop their last token completes, or (len, len) if none)."""
    text = tokenizer.decode(tokens)
    if not tokens:
        return text, (0, 0)
    if tokens[-1] in config.stop_tokens:
        start = len(tokenizer.decode(tokens[:-1]))
        return text, (start, len(text))
    if config.stop_strings:
        match = find_stop(text, config.stop_strings, len(tokenizer.decode(tokens[:-1])))
        if match is not None:
            return text, match
    return text, (len(text), len(text))


def completion_text(tokenizer: Tokenizer, tokens: list[int], finish_reason: str, config: GenerationConfig) -> str:
    """The text a reward sees: the completion decoded, without the stop that ended it (finish_reason "stop")."""
    if finish_reason != "stop":
        return tokenizer.decode(tokens)
    text, (start, _) = _final_stop(tokenizer, tokens, config)
    return text[:start]


def transcript_text(tokenizer: Tokenizer, tokens: list[int], config: GenerationConfig) -> str:
    """The text an environment sees: the completion so far, through the end of the stop it ends with."""
    text, (_, end) = _final_stop(tokenizer, tokens, config)
    return text[:end]


def make_env(task: Task, tokenizer: Tokenizer, examples: Sequence[Example], config: GenerationConfig) -> Env | None:
    """The engine's env callback for a multi-turn task (None for single-turn tasks): row i's transcript so far is
    answered by the task's environment, whose reply continues from the cached prefix."""
    if getattr(task, "env", None) is None:
        return None

    def env(row: int, tokens: list[int]) -> list[int] | None:
        reply = task.env.respond(examples[row], transcript_text(tokenizer, tokens, config))
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
    rollout = engine.generate(prompts, config, env=make_env(task, tokenizer, examples, config),
                              decode=tokenizer.decode)
    texts = [completion_text(tokenizer, t, r, config) for t, r in zip(rollout.tokens, rollout.finish_reason)]
    return TaskRollout(prompts, rollout, texts, config)
