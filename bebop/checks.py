"""The checks every config's `__post_init__` makes, one place for all: each refusal a one-line ValueError naming the
field and the value (`bebop COMMAND` prints it as one line on stderr, exit status 2).

    check_ints(self, ("steps", "prompts_per_step"), low=1)        # ints (not bools) >= low
    check_ints(self, ("gamma",), low=1, also=("auto",))           # or one of the values `also` names (None, "auto")
    check_number(self, "clip_eps", low=0, high=1, open_low=True, open_high=True)   # a real number in (0, 1)
    check_choice(self, "mode", MODES)                              # one of the names; "unknown mode 'x'; valid names: ..."
    check_flags(args, ("--steps", "--prompts"), low=1)             # a job's numeric flags, before any work
    flag_of("prompts_per_step")                                    # "--prompts": a config field's flag

A message names the field as `Owner.field` (the config's class) so a traceback-free line still says which config, and
a flag as the user typed it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PRECISIONS = ("auto", "fp32", "bf16")  # a config's compute dtype (autocast, rollouts): auto = bf16 where it is fast
METHODS = ("rs", "to", "greedy")  # how drafts are verified (bebop.verify): names a config checks without torch
OBJECTIVES = ("ce", "kl", "rkl", "tv", "e2e_tv")  # the draft heads' losses (bebop.losses)
# Config fields whose flag has another name (the rest are spelled alike: batch_size is --batch-size).
FIELD_FLAGS = {"init_head": "init", "prompts_per_step": "prompts", "group_size": "group", "method": "rollout",
               "mode": "sync"}


def _field(obj: Any, name: str) -> str:
    return f"{type(obj).__name__}.{name}"


def check_ints(obj: Any, names: Sequence[str], *, low: int = 0, also: Sequence = ()) -> None:
    """Each of `names` of `obj` an int >= `low` (a bool is no int here), or one of the values `also` names."""
    for name in names:
        value = getattr(obj, name)
        if any(value is a or (isinstance(a, str) and value == a) for a in also):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            kind = {0: "a non-negative int", 1: "a positive int"}.get(low, f"an int >= {low}")
            raise ValueError(f"{_field(obj, name)} must be {kind}{''.join(f' or {a!r}' for a in also)}, got {value!r}")


def check_number(obj: Any, name: str, *, low: float | None = None, high: float | None = None, open_low: bool = False,
                 open_high: bool = False) -> None:
    """`obj.name` a real number (not a bool) within the bounds given; NaN is within none."""
    value = getattr(obj, name)
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and value == value
    if ok and low is not None:
        ok = value > low if open_low else value >= low
    if ok and high is not None:
        ok = value < high if open_high else value <= high
    if not ok:
        if low is not None and high is not None:
            span = f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"
        elif low is not None:
            span = f"{'>' if open_low else '>='} {low}"
        else:
            span = f"{'<' if open_high else '<='} {high}"
        raise ValueError(f"{_field(obj, name)} must be {span}, got {value!r}")


def check_choice(obj: Any, name: str, options: Sequence, *, label: str | None = None) -> None:
    """`obj.name` one of `options` ("unknown {label} ...": `label` is the name a user knows it by, default `name`)."""
    value = getattr(obj, name)
    if value not in options:
        raise ValueError(f"unknown {label or name} {value!r}; valid names: {list(options)}")


def flag_of(field: str) -> str:
    """The flag that sets config field `field` on the command line (`--batch-size` for batch_size)."""
    return "--" + FIELD_FLAGS.get(field, field).replace("_", "-")


def check_flags(args: Any, flags: Sequence[str], *, low: int = 1) -> None:
    """Each `--flag` of parsed `args` (a number, a list of them, or None for a flag left at no value) >= `low`."""
    for flag in flags:
        value = getattr(args, flag[2:].replace("-", "_"))
        if any(v < low for v in (value if isinstance(value, list) else [] if value is None else [value])):
            raise ValueError(f"{flag} must be >= {low}, got {value}")
