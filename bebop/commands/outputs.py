"""What every job checks before any work, so that nothing a user made is overwritten: a directory the job would
write into is new or empty, unless the user said `--force` (replace what is there) or `--resume` (continue it).
Each refusal is one line naming the flag and the way out (`bebop.cli` prints it, exit status 2). A run directory is
held to the one rule every run is opened by (`bebop.runlog.write.check_run_dir`)."""

from __future__ import annotations

from pathlib import Path

from bebop.runlog.write import check_run_dir as run_rule


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


def check_run_dir(path: Path | None, *, resume: bool, flag: str = "--run-dir", resumable: bool = True) -> None:
    """A run directory must be new or empty, or, with `resume`, an existing run: the one rule
    (`bebop.runlog.write.check_run_dir`), named by the job's flag (`resumable`: whether the job has --resume)."""
    if resume and path is None:
        raise FileNotFoundError(f"--resume continues the run in {flag}: pass the run directory of an existing run")
    if path is not None:
        run_rule(path, resume=resume, flag=flag, resumable=resumable)


def check_new_run_dirs(paths: list[Path | None], flag: str) -> None:
    """Run directories of a job that cannot resume (several under one root, or one): none may hold anything yet."""
    for path in paths:
        check_run_dir(path, resume=False, flag=flag, resumable=False)
