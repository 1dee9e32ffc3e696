"""Files every job writes and reads: atomic replacement, JSON objects, format-checked checkpoints.

Atomic: readers see the old file or the new one, never a half-written one. Run metadata, status, configs, head and
model files, and RL / train-mtp checkpoints are all replaced this way, so a crash mid-write (even SIGKILL) or a
dashboard reading mid-write never sees a torn file.
"""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

CHECKPOINT = "checkpoint.pt"  # a job's checkpoint inside its run directory


def cache_root() -> Path:
    """Where converted models and corpora live: $BEBOP_CACHE, else ~/.cache/bebop."""
    return Path(os.environ.get("BEBOP_CACHE") or Path.home() / ".cache" / "bebop").expanduser()


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Write to a temp file beside `path`; on success fsync it and os.replace it onto `path`.

    The temp file gets mode 0644 (mkstemp's 0600 would hide runs and checkpoints from other users, e.g. a
    dashboard served by another account). On error the temp file is removed and `path` is untouched."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: str | os.PathLike) -> dict:
    """The JSON object in `path`; ValueError when it holds anything else."""
    with open(path) as f:
        obj = json.load(f)
    if not isinstance(obj, dict):
        raise ValueError(f"{path} does not hold a JSON object")
    return obj


def checkpoint_path(run_dir: str | os.PathLike) -> Path:
    return Path(run_dir) / CHECKPOINT


def save_checkpoint(run_dir: str | os.PathLike, state: dict[str, Any], *, format: str,
                    keys: tuple[str, ...]) -> Path:
    """Atomically write `state` (the `keys` except "format") to run_dir/checkpoint.pt, tagged with `format` (each job
    its own: bebop.rl.resume, bebop.heads.checkpoint)."""
    missing = [k for k in keys if k != "format" and k not in state]
    if missing:
        raise ValueError(f"checkpoint state is missing {missing}")
    import torch  # here, not at the top: run logs and the dashboard read JSON through this module without torch

    path = checkpoint_path(run_dir)
    with atomic_open(path) as f:
        torch.save({**state, "format": format}, f)
    return path


def load_checkpoint(run_dir: str | os.PathLike, *, format: str,
                    keys: tuple[str, ...]) -> dict[str, Any] | None:
    """The checkpoint in run_dir, or None when there is none; ValueError naming the file when corrupt."""
    path = checkpoint_path(run_dir)
    if not path.exists():
        return None
    import torch

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
