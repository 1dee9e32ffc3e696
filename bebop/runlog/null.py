"""`NullWriter`: what a process that must not write the run directory holds instead of a `RunWriter` (a torchrun rank
other than 0: rank 0 alone writes). Same calls, no effect."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class NullWriter:
    def __init__(self, name: str, path: Path | None = None):
        self.meta = {"name": name}
        self.path = path  # the run directory rank 0 writes (where a checkpoint is read from)
        self.last_step = None

    def log(self, stream: str, record: Any) -> None:
        pass

    def status(self, **fields: Any) -> None:
        pass

    def warn(self, message: str, *, source: str, step: int | None = None) -> None:
        pass  # rank 0 records and prints it once

    def update_meta(self, **fields: Any) -> None:
        pass

    def rewind(self, step: int) -> None:
        pass

    def add_mirror(self, mirror: Any) -> None:
        pass

    def close(self, state: str = "finished", message: str | None = None) -> None:
        pass

    def __enter__(self) -> NullWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        pass
