"""RL checkpoints: everything needed to continue a run exactly where it stopped, written atomically.

One file, `{run_dir}/checkpoint.pt`, holding: the last completed step, the policy and head weights, both
optimisers' states, the torch RNG state, the policy version and the config it was made with. It is
written to a temporary file in the same directory, fsynced, then `os.replace`d over the old one, so a
crash (even SIGKILL) leaves either the previous checkpoint or the new one, never half of one.

Resuming (see `bebop.runlog.session`): the run's session loads the checkpoint *before* touching the run directory,
so a corrupt checkpoint raises a clear error and nothing already written is lost; then the run log is
rewound to the checkpoint's step (rows a killed run logged after its last checkpoint are dropped and
recomputed), and the loop continues at step + 1.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from bebop import files
from bebop.runlog.session import Checkpoints

FORMAT = "bebop-rl-checkpoint-v1"
_KEYS = ("format", "step", "policy", "head", "optimizer", "mtp_optimizer", "rng", "policy_version", "config")
CHECKPOINTS = Checkpoints(FORMAT, _KEYS)  # what `bebop.runlog.session` writes and reads for an RL run


def save_checkpoint(run_dir: str | os.PathLike, state: dict[str, Any]) -> Path:
    """Atomically write an RL run's `state` (every key of _KEYS but "format") to run_dir/checkpoint.pt."""
    return files.save_checkpoint(run_dir, state, format=FORMAT, keys=_KEYS)


def load_checkpoint(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The RL checkpoint in run_dir, or None when there is none; ValueError naming the file when corrupt."""
    return files.load_checkpoint(run_dir, format=FORMAT, keys=_KEYS)

