"""Flags and the config fields behind them, and what `--resume` does with them (no torch: all of it answers before
anything loads).

    given(args)                        # the flags the user typed (`bebop.cli` records them), not argparse's defaults
    changes, note = resumed(...)       # `--resume`: the run's recorded config, with the flags given held against it

A resumed run continues as it was recorded: a flag left out keeps the recorded value (`--steps` included), a flag that
differs from the record is applied where the config lets a resume change it (its class's `RESUMABLE`), and said in
one line, and otherwise refused, naming the flag. The record (meta.json's config) is rewritten only by what a resume
applied, and meta.json's `resumes` lists those changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bebop.checks import FIELD_FLAGS, flag_of

__all__ = ["FIELD_FLAGS", "flag_of", "from_record", "given", "preset_or_record", "recorded_config", "resumed"]

def given(args: argparse.Namespace) -> set[str]:
    """The flags (by destination) the user gave: what `bebop.cli` recorded, else (a job's parser used directly)
    every flag set to anything but None."""
    recorded = getattr(args, "_given", None)
    return set(recorded) if recorded is not None else {k for k, v in vars(args).items() if v is not None}


def recorded_config(run_dir: Path | None) -> dict | None:
    """The config the run in `run_dir` recorded (meta.json's), None where there is none to read."""
    meta = None if run_dir is None else run_dir / "meta.json"
    if meta is None or not meta.is_file():
        return None
    try:
        config = json.loads(meta.read_text()).get("config")
    except (OSError, ValueError, AttributeError):
        return None  # an unreadable meta.json is reported where the run is opened
    return config if isinstance(config, dict) else None


def from_record(cls: type, recorded: Mapping[str, Any]) -> Any:
    """The dataclass config `cls` a run recorded (JSON: its earlier field names through `cls.RENAMED`, lists where
    the config holds tuples, keys it no longer has left out)."""
    renamed = getattr(cls, "RENAMED", {})
    names = {f.name: f for f in dataclasses.fields(cls)}
    values = {renamed.get(k, k): v for k, v in recorded.items()}
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items() if k in names})


def resumed(recorded: Any, wanted: Mapping[str, Any], resumable: tuple[str, ...], where: str,
            source: Callable[[str], str] = flag_of) -> tuple[dict[str, Any], str | None]:
    """The changes a resume makes to `recorded` (the run's config, as a config object) and the line that says so
    (None when it makes none), from `wanted` (field -> value of every flag given). A change of a field outside
    `resumable` is a ValueError naming its flag (`source(field)`: the flag, or the preset that set it); `where`
    names the run ("--out runs/x")."""
    changes = {k: v for k, v in wanted.items() if _json(getattr(recorded, k)) != _json(v)}
    refused = [k for k in changes if k not in resumable]
    if refused:
        said = ", ".join(_said(k, changes[k], source) for k in refused)
        was = ", ".join(_said(k, getattr(recorded, k)) for k in refused)
        raise ValueError(f"cannot resume {where} with {said}: it was recorded with {was}; leave the flag out (a "
                         "resumed run continues as recorded), or start a new run")
    if not changes:
        return {}, None
    applied = ", ".join(f"{_said(k, v, source)} (recorded: {_shown(getattr(recorded, k))})" for k, v in changes.items())
    return changes, f"resuming {where} with {applied}"


def preset_or_record(base: Any, fields: Mapping[str, Any], args: argparse.Namespace) -> tuple[Any, str | None]:
    """The config of a job with a `--tiny` preset and `--run-dir` (train-mtp, pretrain) and the line a resume says:
    `base` (the preset) with `fields` (field -> value of every flag that sets one) over it; with --resume, the run's
    recorded config with the flags given, and the preset's values, held against it (`resumed`)."""
    cls = type(base)
    recorded = recorded_config(args.run_dir) if args.resume else None
    if recorded is None:
        return dataclasses.replace(base, **fields), None
    run, typed = from_record(cls, recorded), given(args)
    wanted = {k: v for k, v in fields.items() if FIELD_FLAGS.get(k, k) in typed}
    tiny = {k: v for k, v in dataclasses.asdict(base).items() if v != getattr(cls(), k)} if args.tiny else {}
    changes, note = resumed(run, {**tiny, **wanted}, cls.RESUMABLE, f"--run-dir {args.run_dir}",
                            lambda k: flag_of(k) if k in wanted else f"--tiny ({flag_of(k)})")
    return dataclasses.replace(run, **changes), note


def _said(field: str, value: Any, source: Callable[[str], str] = flag_of) -> str:
    """A field's value as flags say it: "--steps 20"; the mode as its switch ("--sync", or "no --sync")."""
    if field == "mode":
        return "--sync" if value == "sync" else "no --sync"
    return f"{source(field)} {_shown(value)}"


def _json(value: Any) -> Any:
    """`value` as its record holds it: a tuple compares equal to the list it was recorded as, a dataclass (a
    pretraining config's model) to its dict."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return json.loads(json.dumps(value, default=str))


def _shown(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
