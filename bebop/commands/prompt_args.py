"""The flags of every job that prompts a policy with a task: how a dataset is read and how prompts are laid out.

    --prompt-key / --answer-key    the columns of a dataset task (jsonl:PATH, parquet:PATH, a save_to_disk directory)
    --chat-template on|off|auto    wrap prompts in the tokenizer's chat template as a user turn (auto: when it has one)
    --system-prompt TEXT           a system message before the user turn (needs the chat template)

    add_prompt_args(parser)                     # in a job's add_arguments
    fields = prompt_fields(args)                # the job config's prompt_key/answer_key/chat_template/system_prompt

The job configs (`RLConfig`, `TrainMTPConfig`, `EvalMTPConfig`) carry the four fields, checked and resolved with a
tokenizer by `bebop.data.prompts`, so a run's config.json records them and a resumed run reads its dataset and lays
out its prompts as before.
"""

from __future__ import annotations

import argparse

from bebop.data.prompts import ANSWER_KEY, CHAT_MODES, PROMPT_KEY


def add_prompt_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompt-key", default=PROMPT_KEY,
                        help="a dataset task's prompt column (default: %(default)s, GSM8K's)")
    parser.add_argument("--answer-key", default=ANSWER_KEY,
                        help="a dataset task's answer column, verified by math-verify (default: %(default)s)")
    parser.add_argument("--chat-template", choices=CHAT_MODES, default="auto",
                        help="wrap prompts in the tokenizer's chat template as a user turn (auto: when the "
                             "tokenizer has one; the shipped character tokenizer has none) (default: %(default)s)")
    parser.add_argument("--system-prompt", default=None, metavar="TEXT",
                        help="a system message before the user turn (needs the chat template) (default: none)")


def prompt_fields(args: argparse.Namespace) -> dict:
    """The job-config fields the flags set."""
    return {"prompt_key": args.prompt_key, "answer_key": args.answer_key, "chat_template": args.chat_template,
            "system_prompt": args.system_prompt}
