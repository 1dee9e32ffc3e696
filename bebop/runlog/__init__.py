"""Run directories: what a job writes and the dashboard reads.

`write` (RunWriter: append-only streams, atomic meta/status; no pandas, so every job can log), `read` (load_run,
list_runs: pandas DataFrames, imported on first use). Atomic files and JSON: `bebop.files`; preview runs:
`bebop.rl.synthetic`.
"""

from __future__ import annotations

import importlib

from bebop.runlog.write import RunWriter

_READ = ("Run", "RunInfo", "StreamTail", "list_runs", "load_run", "run_state", "STALE_AFTER_S")

__all__ = ["RunWriter", *_READ]


def __getattr__(name: str):
    if name in _READ:  # the reader, and pandas with it, only when asked for
        return getattr(importlib.import_module("bebop.runlog.read"), name)
    raise AttributeError(f"module 'bebop.runlog' has no attribute {name!r}")
