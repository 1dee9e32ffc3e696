"""What every CLI-misuse test asserts: stderr holds exactly one line, in the CLI's error format; no work started
before the arguments were checked; nothing already written changed."""

from pathlib import Path


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("bebop: error: ")
    return lines[0]


def no_load(*args, **kwargs):
    """Patched over a model loader or a job's heavy work: a misuse must be refused before it."""
    raise AssertionError("a model was loaded (or a job's work started) before the arguments were checked")


def snapshot(path: Path) -> dict:
    """Every file under `path` with its bytes and modification time: equal snapshots mean nothing was rewritten."""
    return {p.relative_to(path): (p.read_bytes(), p.stat().st_mtime_ns) for p in path.rglob("*") if p.is_file()}
