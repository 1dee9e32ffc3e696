"""Run directories: the one contract between a training job and everything that watches it.

A run directory holds three kinds of file (full format: docs/runs.md):

    meta.json       what the run is: name, kind, config (verbatim), versions, entropy bin edges
    status.json     where it is: state ("running" | "finished" | "failed" | "interrupted"), step, heartbeat
    {stream}.jsonl  what happened: one JSON object per line, append-only ("train", "samples", "tokens")

`RunWriter` (from `bebop.runlog.write`, re-exported here) writes one; this module reads them. Readers are
incremental: `StreamTail` remembers a byte offset and parses only the complete lines appended since,
which is what lets a dashboard follow a week-long run without re-reading it every few seconds. A last
line without its newline (a writer mid-write, or one that crashed) is simply not read yet.

Counters are logged, rates are derived when read (pooled over any window: `bebop.metrics.derive`), so
`load_run` adds `spec/accept_length` etc. to every train row that carries speculative counters.

pandas is imported only where a DataFrame is built (`Run.refresh`): every job imports `RunWriter` from
here, and a trainer should not pay for (or depend on) the readers' table library.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bebop.files import read_json
from bebop.runlog.setup import SETUP_KEYS, run_setup
from bebop.runlog.write import KINDS, STATES, WARNINGS, RunWriter, to_jsonable

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["KINDS", "SETUP_KEYS", "STATES", "Run", "RunInfo", "RunWriter", "StreamTail", "list_runs", "load_run",
           "run_setup", "run_state", "to_jsonable"]

STALE_AFTER_S = 120.0  # a "running" run whose heartbeat is older than this is shown as "stale"
_DERIVE_NEEDS = ("spec/gamma", "spec/num_drafts", "spec/num_draft_tokens", "spec/num_accepted_tokens")
# --------------------------------------------------------------------------------------------- reader


class StreamTail:
    """Follows one JSONL stream by byte offset: each `read()` parses only complete lines appended since.

    A last line without its newline is left for the next read. Lines that are not JSON objects are
    counted in `skipped_lines` and skipped. If the file is replaced (another inode) or shrinks (a rewind),
    the tail starts over and `restarted` is set so the caller can drop what it had.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.offset = 0
        self.skipped_lines = 0
        self.restarted = False
        self._inode: tuple[int, int] | None = None

    def read(self) -> list[dict]:
        self.restarted = False
        with open(self.path, "rb") as f:  # FileNotFoundError propagates: the stream (or run) is gone
            st = os.fstat(f.fileno())
            inode = (st.st_dev, st.st_ino)
            if self._inode is not None and (inode != self._inode or st.st_size < self.offset):
                self.offset, self.skipped_lines, self.restarted = 0, 0, True
            self._inode = inode
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        records = []
        for line in data[:end].splitlines():
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                records.append(obj)
            else:
                self.skipped_lines += 1
        return records


def _with_rates(stream: str, records: list[dict]) -> list[dict]:
    """Train rows with speculative counters get their per-step derived rates (pooled helpers: metrics)."""
    if stream != "train" or not any("spec/num_drafts" in r for r in records):
        return records
    from bebop.metrics import derive

    return [{**r, **derive(r)} if all(k in r for k in _DERIVE_NEEDS) else r for r in records]


class Run:
    """A run directory read into memory; `refresh()` appends what was written since (new bytes only)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise FileNotFoundError(f"run directory {self.path} does not exist")
        if not (self.path / "meta.json").is_file():
            raise FileNotFoundError(f"{self.path} is not a run directory (no meta.json)")
        self.meta: dict = {}
        self.status: dict = {}
        self.streams: dict[str, pd.DataFrame] = {}
        self._tails: dict[str, StreamTail] = {}
        self.refresh()

    @property
    def skipped_lines(self) -> int:
        return sum(t.skipped_lines for t in self._tails.values())

    @property
    def name(self) -> str:
        return str(self.meta.get("name") or self.path.name)

    @property
    def state(self) -> str:
        return run_state(self.status)

    def refresh(self) -> dict[str, int]:
        """Re-read meta/status and the new lines of every stream; returns new rows per stream."""
        import pandas as pd  # lazy: writers import this module (see the module docstring)

        self.meta = read_json(self.path / "meta.json")
        status_path = self.path / "status.json"
        self.status = read_json(status_path) if status_path.exists() else {}
        new_rows: dict[str, int] = {}
        for path in sorted(self.path.glob("*.jsonl")):
            tail = self._tails.setdefault(path.stem, StreamTail(path))
            records = _with_rates(path.stem, tail.read())
            if tail.restarted or path.stem not in self.streams:
                self.streams[path.stem] = pd.DataFrame.from_records(records)
            elif records:
                old = self.streams[path.stem]
                self.streams[path.stem] = pd.concat([old, pd.DataFrame.from_records(records)], ignore_index=True)
            new_rows[path.stem] = len(records)
        return new_rows


def load_run(run_dir: str | os.PathLike) -> Run:
    """Read a run directory: `.meta`, `.status`, `.streams` (one DataFrame per stream), `.skipped_lines`."""
    return Run(run_dir)


# ------------------------------------------------------------------------------------------ run lists


def run_state(status: Mapping[str, Any], *, now: float | None = None, stale_after: float = STALE_AFTER_S) -> str:
    """The status' state, or "stale" when it claims "running" but its heartbeat stopped."""
    state = str(status.get("state", "unknown"))
    heartbeat = status.get("heartbeat")
    now = time.time() if now is None else now
    if state == "running" and isinstance(heartbeat, (int, float)) and now - heartbeat > stale_after:
        return "stale"
    return state


@dataclasses.dataclass(frozen=True)
class RunInfo:
    path: Path
    name: str
    kind: str
    state: str  # running | finished | failed | stale | unknown | corrupt
    step: int | None
    created: float | None
    config: dict
    heartbeat: float | None = None
    message: str = ""
    setup: dict = dataclasses.field(default_factory=dict)  # SETUP_KEYS -> value (run_setup)
    meta: dict = dataclasses.field(default_factory=dict)  # meta.json whole (what pairs runs for a speedup)
    warnings: list = dataclasses.field(default_factory=list)  # the records of its `warnings` stream, in order


def _run_info(path: Path, now: float, stale_after: float) -> RunInfo:
    try:
        meta = read_json(path / "meta.json")
    except (OSError, ValueError) as err:
        return RunInfo(path, path.name, "unknown", "corrupt", None, None, {}, message=f"meta.json: {err}")
    try:
        status = read_json(path / "status.json")
    except (OSError, ValueError):
        status = {}
    step = status.get("step")
    config = meta.get("config")
    return RunInfo(
        path=path,
        name=str(meta.get("name") or path.name),
        kind=str(meta.get("kind", "unknown")),
        state=run_state(status, now=now, stale_after=stale_after),
        step=int(step) if isinstance(step, (int, float)) else None,
        created=meta.get("created") if isinstance(meta.get("created"), (int, float)) else None,
        config=config if isinstance(config, dict) else {},
        heartbeat=status.get("heartbeat") if isinstance(status.get("heartbeat"), (int, float)) else None,
        message=str(status.get("message") or ""),
        setup=run_setup(meta),
        meta=meta,
        warnings=_warnings(path),
    )


def _warnings(path: Path) -> list[dict]:
    """The run's `warnings` records (none when it raised none, or the file went while read)."""
    try:
        return StreamTail(path / f"{WARNINGS}.jsonl").read()
    except OSError:
        return []


def list_runs(root: str | os.PathLike, *, max_depth: int = 3, stale_after: float = STALE_AFTER_S) -> list[RunInfo]:
    """Every run (a directory with meta.json) under `root`, newest first; other directories are ignored.

    Directories reached through links that point outside `root` are skipped, so a reader of the list
    never leaves the root. A missing root raises FileNotFoundError.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"runs root {root} does not exist or is not a directory")
    real_root = root.resolve()
    now, found = time.time(), []
    pending = [(root, 0)]
    while pending:
        folder, depth = pending.pop()
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            continue
        for child in children:
            if not child.resolve().is_relative_to(real_root):
                continue
            if (child / "meta.json").exists():
                found.append(_run_info(child, now, stale_after))
            elif depth + 1 < max_depth:
                pending.append((child, depth + 1))
    return sorted(found, key=lambda r: (-(r.created or 0.0), str(r.path)))
