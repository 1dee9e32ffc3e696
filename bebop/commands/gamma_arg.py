"""`--gamma` on the command line: a draft depth (an int; 0 = plain decoding) or "auto" (bebop.engine.depth)."""

from __future__ import annotations

import argparse


def gamma_arg(text: str) -> int | str:
    """argparse type of --gamma: "auto" or an int. Text that is neither is argparse's error (exit status 2); the
    range of an int is the job's to check, with its one-line error."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int (0 = plain decoding) or 'auto', got {text!r}") from None
