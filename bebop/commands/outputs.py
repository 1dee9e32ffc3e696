"""What every job checks before any work, so that nothing a user made is overwritten: a directory the job would
write into is new or empty, unless the user said `--force` (replace what is there) or `--resume` (continue it).
Each refusal is one line naming the flag and the way out (`bebop.cli` prints it, exit status 2)."""

from __future__ import annotations

from pathlib import Path


def _used(path: Path, flag: str) -> bool:
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{flag} {path} exists and is not a directory")
    return path.is_dir() and any(path.iterdir())


def check_out(path: Path | None, flag: str, *, force: bool, holds: str) -> None:
    """`path` (an output such as a trained head or a checkpoint, `holds` naming it) must be new or empty unless
    `force`."""
    if path is not None and _used(path, flag) and not force:
        raise FileExistsError(f"{flag} {path} already holds {holds}: pass --force to replace it, or choose another "
                              "directory")


def check_run_dir(path: Path | None, *, resume: bool, flag: str = "--run-dir") -> None:
    """A run directory must be new or empty, or, with `resume`, an existing run."""
    if resume and (path is None or not path.is_dir()):
        raise FileNotFoundError(f"cannot --resume: {flag} {path} does not exist" if path is not None else
                                f"--resume continues the run in {flag}: pass the run directory of an existing run")
    if path is not None and not resume and _used(path, flag):
        raise FileExistsError(f"{flag} {path} is not empty: pass --resume to continue that run, or choose a new "
                              "directory (an existing run is never overwritten)")


def check_new_run_dirs(paths: list[Path | None], flag: str) -> None:
    """Run directories of a job that cannot resume (several under one root, or one): none may hold anything yet."""
    used = [path for path in paths if path is not None and _used(path, flag)]
    if used:
        held = f"{used[0]} already holds a run" if len(used) == 1 else \
            f"{', '.join(str(p) for p in used)} already hold runs"
        raise FileExistsError(f"{flag} {held}: choose another directory (an existing run is never overwritten)")
