"""`--gamma` on the command line: a draft depth (an int; 0 = plain decoding), "auto" (one depth per step,
bebop.engine.depth) or "rows" (each row its own, bebop.engine.depth.rows)."""

from __future__ import annotations

import argparse


def gamma_arg(text: str) -> int | str:
    """argparse type of --gamma: "auto", "rows" or an int. Text that is none of them is argparse's error (exit status
    2); the range of an int is the job's to check, with its one-line error."""
    if text in ("auto", "rows"):
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int (0 = plain decoding), 'auto' or 'rows', got {text!r}") from None


ADAPTIVE = ("auto", "rows")  # the --gamma values the engine chooses depths for


def static(values) -> list[int]:
    """The int depths among --gamma values, in order, without repeats."""
    return [g for g in dict.fromkeys(values) if g not in ADAPTIVE]
