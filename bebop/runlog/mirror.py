"""Mirrors: a run's streams also written to TensorBoard or Weights & Biases, for readers who live there.

The run directory stays the record (docs/runs.md); a mirror is a copy a `RunWriter` hands each record to as it is
logged. What is copied, under which name:

- the numbers of every stream but `samples`, `tokens` and `warnings` (text and per-token records, which the
  dashboard shows) and `shadow` (one record per head and rule each step, under the same names);
  strings and booleans are skipped;
- each under its name in docs/runs.md (`critic/score/mean`, `spec/num_accepted_tokens`, `mtp/eval/d_tv_mean`);
  a name without a `/` from a stream other than `train` is prefixed with its stream (`eval/loss`), so the train
  and eval losses of `bebop pretrain` stay apart;
- for a train record with speculative counters, the rates `bebop.metrics.derive` gives (`spec/accept_length`,
  `spec/acceptance_rate`, ...): the run directory keeps only counters, but a TensorBoard or W&B chart is read one
  step at a time, where the step's own rate is what one wants to see;
- at the record's `step` (records without one: a per-stream count).

Both packages are optional: asking for a mirror whose package is missing raises `MirrorUnavailable` (a
`ValueError`, so `bebop rl --tensorboard` without tensorboard is one line on stderr and exit status 2) before any
work. W&B runs offline without an account under `WANDB_MODE=offline` (then `wandb sync` uploads them later).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

# Text and per-token records (a warning's only number is its time); and `shadow` (RL shadow heads), whose several
# records a step, one per head and rule, share their names: a mirror keyed by (name, step) would keep only the last
# (the run directory keeps them all).
SKIPPED_STREAMS = ("samples", "tokens", "warnings", "shadow")
TENSORBOARD_DIR = "tensorboard"  # inside the run directory: `tensorboard --logdir runs` finds every run's


class MirrorUnavailable(ValueError):
    """A mirror was asked for whose package is not installed."""


class Mirror(Protocol):
    def open(self, run_dir: Path, meta: Mapping[str, Any]) -> None: ...

    def log(self, stream: str, record: Mapping[str, Any]) -> None: ...

    def close(self, state: str) -> None: ...


def _require(package: str, flag: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise MirrorUnavailable(f"{flag} needs the {package} package, which is not installed: pip install {package}")


def scalars(stream: str, record: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one record under their mirrored names (module docstring); {} for a skipped stream."""
    if stream in SKIPPED_STREAMS:
        return {}
    out = {}
    for key, value in record.items():
        if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[key if stream == "train" or "/" in key else f"{stream}/{key}"] = float(value)
    if stream == "train" and "spec/num_drafts" in record and "spec/gamma" in record:
        from bebop.metrics import derive

        out.update(derive(record))
    return {k: v for k, v in out.items() if math.isfinite(v)}


class _Steps:
    """The step of each record: its own, or a count of the stream's records when it has none."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, stream: str, record: Mapping[str, Any]) -> int:
        count = self.counts[stream] = self.counts.get(stream, -1) + 1
        step = record.get("step")
        return int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) else count


class TensorBoardMirror:
    """Event files in `{run_dir}/tensorboard/`, written by torch's `SummaryWriter`."""

    def __init__(self) -> None:
        _require("tensorboard", "--tensorboard")
        self.writer = None
        self.steps = _Steps()

    def open(self, run_dir: Path, meta: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(Path(run_dir) / TENSORBOARD_DIR))

    def log(self, stream: str, record: Mapping[str, Any]) -> None:
        values = scalars(stream, record)
        step = self.steps(stream, record)
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, global_step=step)

    def close(self, state: str) -> None:
        if self.writer is not None:
            self.writer.close()


class WandbMirror:
    """A W&B run with the run's name and config, its files under `{run_dir}/wandb/`. The mode (online, offline)
    is wandb's own: `WANDB_MODE`, or `wandb login` for online."""

    def __init__(self, project: str = "bebop") -> None:
        _require("wandb", "--wandb")
        self.project = project
        self.run = None
        self.steps = _Steps()

    def open(self, run_dir: Path, meta: Mapping[str, Any]) -> None:
        import wandb

        self.run = wandb.init(project=self.project, name=meta.get("name"), job_type=meta.get("kind"),
                              config=dict(meta.get("config") or {}), dir=str(run_dir), reinit="create_new")

    def log(self, stream: str, record: Mapping[str, Any]) -> None:
        values = scalars(stream, record)
        if values:
            # W&B's step only goes forward; an eval record at the train step just logged joins that step.
            self.run.log(values, step=self.steps(stream, record))

    def close(self, state: str) -> None:
        if self.run is not None:
            self.run.finish(exit_code=0 if state == "finished" else 1)


def make_mirrors(tensorboard: bool = False, wandb: bool = False, wandb_project: str = "bebop") -> list[Mirror]:
    """The mirrors a job's `--tensorboard` / `--wandb` flags ask for; raises MirrorUnavailable at once."""
    mirrors: list[Mirror] = []
    if tensorboard:
        mirrors.append(TensorBoardMirror())
    if wandb:
        mirrors.append(WandbMirror(wandb_project))
    return mirrors


def add_mirror_arguments(parser: argparse.ArgumentParser) -> None:
    """`--tensorboard` and `--wandb [PROJECT]`, for every job that writes a run directory."""
    parser.add_argument("--tensorboard", action="store_true",
                        help=f"also write TensorBoard event files to RUN/{TENSORBOARD_DIR}/ (tensorboard --logdir)")
    parser.add_argument("--wandb", nargs="?", const="bebop", default=None, metavar="PROJECT",
                        help="also log to a W&B run in PROJECT (default bebop); WANDB_MODE=offline needs no account")


def mirrors_from_args(args: argparse.Namespace) -> list[Mirror]:
    return make_mirrors(tensorboard=args.tensorboard, wandb=args.wandb is not None, wandb_project=args.wandb or "bebop")
