"""How a task's examples become the policy's prompts, in one place: the options every job config carries, and the
format they resolve to with a tokenizer.

    PromptOptions      prompt_key, answer_key (a dataset task's columns: `bebop.data.tasks.dataset_config`),
                       chat_template "on" | "off" | "auto" (auto: when the tokenizer has one), system_prompt
    job_prompt_format(config, tokenizer) -> PromptFormat        # raw text, or the chat template's layout
    prompt_ids(tokenizer, examples, fmt)                         # the token ids of each example's prompt
    vocab_limit(tokenizer, model_vocab)                          # ids past the tokenizer's size are padding

One rule binds the options: a system prompt needs the chat template (`check_system`, which the options and the
format both apply). Torch-free, so the job configs (and the CLIs' help) import it without a model's dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from bebop.data.tasks.base import Example
    from bebop.data.tokenizer import Tokenizer

CHAT_MODES = ("on", "off", "auto")  # --chat-template: auto is on when the tokenizer has a template
PROMPT_KEY, ANSWER_KEY = "question", "answer"  # GSM8K's column names


def check_system(system: str | None, chat: bool) -> None:
    """A system prompt is a non-empty string, and only a chat conversation has a place for it."""
    if system is not None and (not isinstance(system, str) or not system):
        raise ValueError(f"system_prompt must be a non-empty string or None, got {system!r}")
    if system is not None and not chat:
        raise ValueError("a system prompt (--system-prompt) needs the chat template (--chat-template on, or auto "
                         "with a tokenizer that has one)")


@dataclass(frozen=True)
class PromptOptions:
    """The four fields, flat in each job config (`RLConfig`, `TrainMTPConfig`, `EvalMTPConfig`), so its config.json
    and a resumed run's config keep them. A subclass's `__post_init__` calls `check_prompt_fields(self)`."""

    prompt_key: str = PROMPT_KEY
    answer_key: str = ANSWER_KEY
    chat_template: str = "auto"
    system_prompt: str | None = None


def check_prompt_fields(config: PromptOptions) -> None:
    """Validate `config`'s prompt_key, answer_key, chat_template and system_prompt (one-line ValueErrors)."""
    for name in ("prompt_key", "answer_key"):
        if not isinstance(getattr(config, name), str) or not getattr(config, name):
            raise ValueError(f"{name} must be a non-empty column name, got {getattr(config, name)!r}")
    if config.chat_template not in CHAT_MODES:
        raise ValueError(f"chat_template must be one of {CHAT_MODES}, got {config.chat_template!r}")
    check_system(config.system_prompt, chat=config.chat_template != "off")


@dataclass(frozen=True)
class PromptFormat:
    """How an example's prompt becomes the policy's input: the raw text, or a chat conversation
    ([system (optional), user: prompt] with the assistant's generation prompt) through the tokenizer's template."""

    chat_template: bool = False
    system: str | None = None  # the system message; only with the chat template

    def __post_init__(self) -> None:
        check_system(self.system, chat=self.chat_template)


def prompt_format(mode: str, tokenizer: Tokenizer, system: str | None = None) -> PromptFormat:
    """The format for --chat-template `mode` ("on" | "off" | "auto") with this tokenizer."""
    if mode not in CHAT_MODES:
        raise ValueError(f"--chat-template must be one of {CHAT_MODES}, got {mode!r}")
    if mode == "on" and not tokenizer.has_chat_template:
        raise ValueError("--chat-template on: the tokenizer has no chat template (use off, or auto)")
    return PromptFormat(chat_template=mode == "on" or (mode == "auto" and tokenizer.has_chat_template), system=system)


def job_prompt_format(config: PromptOptions, tokenizer: Tokenizer) -> PromptFormat:
    """The prompt format a job config's chat_template / system_prompt ask for, with this tokenizer."""
    return prompt_format(config.chat_template, tokenizer, system=config.system_prompt)


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
