"""RL checkpoints: everything needed to continue a run exactly where it stopped, written atomically.

One file, `{run_dir}/checkpoint.pt`, holding: the last completed step, the policy and head weights, both
optimisers' states, the torch RNG state, the policy version and the config it was made with. It is
written to a temporary file in the same directory, fsynced, then `os.replace`d over the old one, so a
crash (even SIGKILL) leaves either the previous checkpoint or the new one, never half of one.

Resuming (see `bebop.rl.trainer`): the trainer loads the checkpoint *before* touching the run directory,
so a corrupt checkpoint raises a clear error and nothing already written is lost; then the run log is
rewound to the checkpoint's step (rows a killed run logged after its last checkpoint are dropped and
recomputed), and the loop continues at step + 1.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from bebop.runlog.atomic import atomic_open

FILENAME = "checkpoint.pt"
FORMAT = "bebop-rl-checkpoint-v1"
_KEYS = ("format", "step", "policy", "head", "optimizer", "mtp_optimizer", "rng", "policy_version", "config")


def checkpoint_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / FILENAME


def save_checkpoint(run_dir: str | os.PathLike, state: dict[str, Any], *, format: str = FORMAT,
                    keys: tuple[str, ...] = _KEYS) -> Path:
    """Atomically write `state` (the `keys` except "format") to run_dir/checkpoint.pt. Another job's checkpoint
    (bebop.headtrain.checkpoint) passes its own `format` and `keys`."""
    missing = [k for k in keys if k != "format" and k not in state]
    if missing:
        raise ValueError(f"checkpoint state is missing {missing}")
    path = checkpoint_path(run_dir)
    with atomic_open(path) as f:
        torch.save({**state, "format": format}, f)
    return path


def load_checkpoint(run_dir: str | os.PathLike, *, format: str = FORMAT,
                    keys: tuple[str, ...] = _KEYS) -> dict[str, Any] | None:
    """The checkpoint in run_dir, or None when there is none; ValueError naming the file when corrupt."""
    path = checkpoint_path(run_dir)
    if not path.exists():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as err:
        raise ValueError(f"checkpoint {path} is corrupt or unreadable ({type(err).__name__}: {err}); "
                         "the run's logs are untouched: move the file away to restart from step 0") from err
    if not isinstance(state, dict) or state.get("format") != format:
        raise ValueError(f"checkpoint {path} is not a {format} checkpoint")
    missing = [k for k in keys if k not in state]
    if missing:
        raise ValueError(f"checkpoint {path} is incomplete: missing {missing}")
    return state
