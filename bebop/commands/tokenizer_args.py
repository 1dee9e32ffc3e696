"""The prompt-format flags the jobs that prompt a policy share: `--chat-template on|off|auto`, `--system-prompt`.

    add_chat_template_arg(parser)              # in a job's add_arguments
    fmt = resolve(args, tokenizer)             # after the tokenizer is loaded: a bebop.data.prompting.PromptFormat
    complete(..., prompt_format=fmt) / collect(..., prompt_format=fmt) / Trainer(..., prompt_format=fmt)

`resolve` raises ValueError (one line, exit 2 through the CLI) for `on` with a tokenizer without a template, and for a
system prompt without a chat template.
"""

from __future__ import annotations

import argparse

from bebop.data.prompting import CHAT_MODES, PromptFormat, prompt_format
from bebop.data.tokenizer import Tokenizer


def add_chat_template_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--chat-template", choices=CHAT_MODES, default="auto",
                        help="wrap prompts in the tokenizer's chat template as a user turn "
                             "(auto: when the tokenizer has one; the shipped character tokenizer has none)")
    parser.add_argument("--system-prompt", default=None, metavar="TEXT",
                        help="a system message before the user turn (needs the chat template)")


def resolve(args: argparse.Namespace, tokenizer: Tokenizer) -> PromptFormat:
    """The prompt format the parsed flags ask for, with this tokenizer."""
    return prompt_format(args.chat_template, tokenizer, system=args.system_prompt)
