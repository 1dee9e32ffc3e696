"""Atomic file replacement: readers see the old file or the new one, never a half-written one.

Run metadata, status, checkpoints and RL training state are all replaced this way, so a crash mid-write (or a
dashboard reading mid-write) never sees a torn file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


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
