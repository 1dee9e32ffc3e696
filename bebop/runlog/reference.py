"""The reference runs bebop ships: real RL runs (SmolLM2, docs/real-model-rl.md) packed without their checkpoints into
the package's `assets/runs/`, one run directory each, so the dashboard and notebooks 01 to 04 open them without
running anything.

A reference run is a run directory as its job wrote it (meta.json, status.json, its streams: `load_run` and
`bebop.rl.shadow_points` read it like any run) plus `provenance.json`, how it was made: the exact command, the git
commit, when, on what machine and for how long (`bebop.runlog.pack` writes it; `scripts/pack-reference-run`).

    import bebop
    runs = bebop.reference_runs()                    # {name: run directory}; empty when none is shipped
    provenance(runs["smollm2-learn"])                # {"command", "commit", "created", "wall_s", "machine", ...}
    provenance_line(runs["smollm2-learn"])           # the same in one line
    print(regenerate(runs["smollm2-learn"]))         # the shell lines that make it again

$BEBOP_REFERENCE_RUNS names another folder to read them from (tests, or runs you packed for yourself).
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path

from bebop.files import read_json

REFERENCE_DIR = Path(__file__).resolve().parents[1] / "assets" / "runs"  # package data (pyproject: assets/**/*)
ENV = "BEBOP_REFERENCE_RUNS"
PROVENANCE = "provenance.json"


def reference_root() -> Path:
    """Where the reference runs are read from: $BEBOP_REFERENCE_RUNS, else the package's assets/runs/."""
    return Path(os.environ.get(ENV) or REFERENCE_DIR)


def is_reference_run(path: str | os.PathLike) -> bool:
    """A packed reference run: a run directory with its provenance beside it (no job of bebop writes that file)."""
    path = Path(path)
    return (path / "meta.json").is_file() and (path / PROVENANCE).is_file()


def reference_runs(root: str | os.PathLike | None = None) -> dict[str, Path]:
    """{name: run directory} of the reference runs under `root` (default `reference_root()`), by name; empty when
    the folder is missing or holds none."""
    root = Path(root) if root is not None else reference_root()
    if not root.is_dir():
        return {}
    return {path.name: path for path in sorted(root.iterdir()) if path.is_dir() and is_reference_run(path)}


def provenance(run_dir: str | os.PathLike) -> dict:
    """How the reference run in `run_dir` was made (its provenance.json; the keys: `bebop.runlog.pack`)."""
    return read_json(Path(run_dir) / PROVENANCE)


def provenance_line(run_dir: str | os.PathLike) -> str:
    """How the reference run in `run_dir` was made, in one line: its command, commit, start, wall time and machine."""
    made = provenance(run_dir)
    machine = made.get("machine") or {}
    took = f", {_duration(made['wall_s'])}" if isinstance(made.get("wall_s"), (int, float)) else ""
    started = made.get("created") or "at an unknown time"
    return (f"`{made['command']}` at commit {made['commit'][:12]}, started {started}{took} on "
            f"{machine.get('cpu', 'an unrecorded CPU')} ({machine.get('cores', '?')} cores, device "
            f"{machine.get('device') or '?'})")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


def regenerate(run_dir: str | os.PathLike) -> str:
    """The shell lines that make the reference run in `run_dir` again, from the repository root: its commit checked
    out, its command, back to where you were (the commit may predate the pack script), and the pack into the same
    name."""
    made = provenance(run_dir)
    command, commit = made["command"], made["commit"]
    words = shlex.split(command)
    out = words[words.index("--out") + 1] if "--out" in words[:-1] else "RUN_DIR"  # where the command writes
    pack = ["scripts/pack-reference-run", out, Path(run_dir).name, "--command", command, "--commit", commit, "--force"]
    return "\n".join([f"git checkout {commit}", command, "git checkout -", shlex.join(pack)])


def copy_reference_runs(runs: Mapping[str, Path], into: str | os.PathLike) -> list[Path]:
    """Copy each reference run to `into`/NAME (the folder made; each target must not exist) and return the copies:
    what `bebop preview` puts beside its synthetic runs, so the dashboard opens them like any run."""
    into = Path(into)
    into.mkdir(parents=True, exist_ok=True)
    return [Path(shutil.copytree(path, into / name)) for name, path in runs.items()]
