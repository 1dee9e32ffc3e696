"""`PromptOptions`: the prompt options every job config inherits (`RLConfig`, `TrainMTPConfig`, `EvalMTPConfig`).

    prompt_key, answer_key     the columns a dataset task is read with (`bebop.data.tasks.DatasetConfig`)
    chat_template              "on" | "off" | "auto": prompts as a chat user turn (auto: when the tokenizer has one)
    system_prompt              a system message before the user turn, or None

Torch-free, so the configs (and the CLIs' help) import it without loading a model's dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass

CHAT_MODES = ("on", "off", "auto")  # --chat-template: auto is on when the tokenizer has a template
PROMPT_KEY, ANSWER_KEY = "question", "answer"  # GSM8K's column names


@dataclass(frozen=True)
class PromptOptions:
    """The four fields, flat in each job config (so its config.json and a resumed run's config keep them). A
    subclass's `__post_init__` calls `check_prompt_fields(self)`."""

    prompt_key: str = PROMPT_KEY
    answer_key: str = ANSWER_KEY
    chat_template: str = "auto"
    system_prompt: str | None = None


def check_prompt_fields(config) -> None:
    """Validate `config`'s prompt_key, answer_key, chat_template and system_prompt (one-line ValueErrors)."""
    for name in ("prompt_key", "answer_key"):
        if not isinstance(getattr(config, name), str) or not getattr(config, name):
            raise ValueError(f"{name} must be a non-empty column name, got {getattr(config, name)!r}")
    if config.chat_template not in CHAT_MODES:
        raise ValueError(f"chat_template must be one of {CHAT_MODES}, got {config.chat_template!r}")
    if config.system_prompt is not None and (not isinstance(config.system_prompt, str) or not config.system_prompt):
        raise ValueError(f"system_prompt must be a non-empty string or None, got {config.system_prompt!r}")
    if config.system_prompt is not None and config.chat_template == "off":
        raise ValueError("a system prompt needs the chat template (--chat-template on|auto)")
