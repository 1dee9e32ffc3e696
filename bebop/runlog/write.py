"""Writing a run directory (format: docs/runs.md; reading it: `bebop.runlog`).

Two rules make a run directory safe to read while it is written, and after a crash:

- meta.json and status.json are small and replaced atomically (a temp file, fsync, `os.replace`), so a
  reader sees the old or the new version, never half of one;
- a stream `{name}.jsonl` is only ever appended to, each record as one whole line in one `write` call
  on an O_APPEND descriptor. A writer that dies mid-line leaves a torn tail; the next writer to open
  that stream truncates it back to the last newline before appending, so no record is ever glued onto
  half of another. (Readers stop at the last newline, so to them a torn tail is "not written yet".)

Every RL record carries "step", and the train stream holds one record per step. A resumed writer
knows the last step logged and refuses to log it again, which is how a killed-and-resumed run ends
up with every step exactly once.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import re
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bebop.files import atomic_open, read_json
from bebop.runlog.mirror import Mirror

KINDS = ("rl", "eval-mtp", "train-mtp", "pretrain", "bench", "demo", "task-sweep")
WARNINGS = "warnings"  # the stream of the warnings a run raises (`RunWriter.warn`)
STATES = ("running", "finished", "failed", "interrupted")  # interrupted: Ctrl-C or SIGTERM, resumable
HEARTBEAT_EVERY_S = 1.0  # log() refreshes status.json at most this often
_STREAM_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# ----------------------------------------------------------------------------------------------- JSON


def to_jsonable(value: Any, where: str = "value") -> Any:
    """Configs and records as plain JSON types: dataclasses become dicts, tuples lists, scalars numbers."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if hasattr(value, "tolist") and hasattr(value, "ndim"):  # numpy / torch scalars and arrays
        return to_jsonable(value.tolist(), where)
    raise ValueError(f"{where} has type {type(value).__name__}, which cannot be written as JSON")


def _dumps(obj: Any) -> str:
    # NaN/inf are kept (Python's json reads them back); a loss that blew up should show as NaN, not vanish.
    return json.dumps(obj, separators=(",", ":"), allow_nan=True)


def _write_atomic(path: Path, obj: Any) -> None:
    with atomic_open(path, "w") as f:
        f.write(json.dumps(obj, indent=2, allow_nan=True))


def _repair_tail(path: Path) -> int:
    """Truncate a torn last line (a crash mid-write) back to the last newline; returns bytes dropped."""
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        block, end = 1 << 16, size
        while end > 0:  # scan backwards for the last newline
            start = max(0, end - block)
            f.seek(start)
            cut = f.read(end - start).rfind(b"\n")
            if cut >= 0:
                f.truncate(start + cut + 1)
                return size - (start + cut + 1)
            end = start
        f.truncate(0)
        return size


def _versions() -> dict[str, str]:
    import torch

    from bebop import __version__

    return {"python": platform.python_version(), "torch": torch.__version__, "bebop": __version__}


def _default_bin_edges() -> list[float]:
    from bebop.metrics import ENTROPY_BIN_EDGES  # lazy, like torch above: readers of run lists need neither

    return list(ENTROPY_BIN_EDGES)


# ------------------------------------------------------------------------------------------ the rule


def check_run_dir(path: str | os.PathLike, *, resume: bool = False, flag: str = "run_dir",
                  resumable: bool = True) -> bool:
    """The one rule for a run directory, every job's and `RunWriter`'s: new or empty, or with `resume` a run that
    exists; an existing run is never overwritten. A refusal is one line naming `flag` (a job's `--out` or
    `--run-dir`; the argument `run_dir` for a library caller) and the way out (`--resume` / `resume=True`; none
    for a job that cannot resume, `resumable` False). Returns True when `path` holds a run to continue."""
    path, again = Path(path), "--resume" if flag.startswith("--") else "resume=True"
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{flag} {path} exists and is not a directory")
    if resume and not path.is_dir():
        raise FileNotFoundError(f"cannot resume: {flag} {path} does not exist")
    used = path.is_dir() and any(path.iterdir())
    if used and not resume:
        raise FileExistsError(f"{flag} {path} is not empty: pass {again} to continue that run, or choose a new "
                              "directory (an existing run is never overwritten)" if resumable else
                              f"{flag} {path} already holds a run: choose another directory (an existing run is "
                              "never overwritten)")
    if used and not (path / "meta.json").is_file():
        raise FileExistsError(f"{flag} {path} has files but no meta.json: not a bebop run")
    return used


def finished_step(run_dir: str | os.PathLike, steps: int) -> int | None:
    """The last step of the run in `run_dir` when it finished all of `steps` (None if it has more to do): resuming it
    would load a model only to log nothing. A larger `steps` continues it."""
    status = Path(run_dir) / "status.json"
    state = read_json(status) if status.is_file() else {}
    step = state.get("step")
    done = state.get("state") == "finished" and isinstance(step, int) and step + 1 >= steps
    return step if done else None


# --------------------------------------------------------------------------------------------- writer


class RunWriter:
    """Writes one run directory. Use as a context manager: an exception marks the run failed.

    `resume=True` continues an existing run: streams are repaired, `last_step` holds the last step in
    the train stream, and logging a step at or below it raises, so a resumed run never repeats a step.
    If the caller's checkpoint is older than `last_step`, `rewind(checkpoint_step)` drops the later rows
    first. Without `resume`, a non-empty directory is refused: an existing run is never clobbered.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        config: Any = None,
        *,
        kind: str = "rl",
        name: str | None = None,
        resume: bool = False,
        meta_extra: Mapping[str, Any] | None = None,
        entropy_bin_edges: Iterable[float] | None = None,
        mirrors: Iterable[Mirror] = (),
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.path = Path(run_dir)
        self.kind = kind
        self._fds: dict[str, int] = {}
        self._last_step: dict[str, float | None] = {}
        self._closed = False
        self._last_heartbeat = 0.0
        self._mirrors: list[Mirror] = []
        config_json = to_jsonable(config if config is not None else {}, "config")
        existing = self._prepare_dir(resume)
        meta = read_json(self.path / "meta.json") if existing else {}
        edges = _default_bin_edges() if entropy_bin_edges is None else list(entropy_bin_edges)
        now = time.time()
        meta.update(
            name=name or meta.get("name") or self.path.resolve().name,
            kind=kind,
            created=meta.get("created", now),
            config=config_json,
            versions=_versions(),
            entropy_bin_edges=[float(e) for e in edges],
        )
        if existing:
            meta.setdefault("resumes", []).append({"time": now, "last_step": self.last_step})
        meta.update(to_jsonable(dict(meta_extra or {}), "meta_extra"))
        self.meta = meta
        _write_atomic(self.path / "meta.json", meta)
        self._status = read_json(self.path / "status.json") if (self.path / "status.json").exists() else {}
        self.status(state="running", message="", step=self.last_step)
        for mirror in mirrors:
            self.add_mirror(mirror)

    def add_mirror(self, mirror: Mirror) -> None:
        """Copy every record logged from now on to `mirror` as well (`bebop.runlog.mirror`: TensorBoard, W&B)."""
        self._check_open()
        mirror.open(self.path, self.meta)
        self._mirrors.append(mirror)

    def _prepare_dir(self, resume: bool) -> bool:
        """Create or check the run dir (`check_run_dir`); returns True when an existing run is being resumed."""
        existing = check_run_dir(self.path, resume=resume)
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".write-probe"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as err:
            raise PermissionError(f"cannot write run_dir {self.path}: {err.strerror or err}") from err
        for stream_file in self.path.glob("*.jsonl") if existing else ():
            _repair_tail(stream_file)
            self._last_step[stream_file.stem] = _last_step_in(stream_file)
        return existing

    @property
    def last_step(self) -> int | None:
        """The last step in the train stream (None before any): a resumed loop continues at last_step + 1."""
        step = self._last_step.get("train")
        return None if step is None else int(step)

    def log(self, stream: str, record: Mapping[str, Any]) -> None:
        """Append one record to `{stream}.jsonl` as one whole line, written and flushed in one call."""
        self._check_open()
        if not isinstance(stream, str) or not _STREAM_NAME.match(stream):
            raise ValueError(f"stream must be a simple name like 'train' (letters, digits, _ . -), got {stream!r}")
        if not isinstance(record, Mapping):
            raise ValueError(f"record must be a mapping, got {type(record).__name__}")
        record = to_jsonable(record, f"{stream} record")
        step = record.get("step")
        if self.kind == "rl" and step is None:
            raise ValueError(f"every RL stream record carries 'step'; the {stream!r} record has none")
        if step is not None:
            self._check_step(stream, step)
        data = (_dumps(record) + "\n").encode()
        fd = self._fds.get(stream)
        if fd is None:
            fd = self._open_stream(stream)
        while data:  # a regular-file write is whole in practice; loop only for the pathological short write
            data = data[os.write(fd, data) :]
        if step is not None:
            self._last_step[stream] = step
        for mirror in self._mirrors:
            mirror.log(stream, record)
        now = time.time()
        if now - self._last_heartbeat >= HEARTBEAT_EVERY_S:
            self.status(**({"step": self.last_step} if self.last_step is not None else {}))

    def warn(self, message: str, *, source: str, step: int | None = None) -> None:
        """Record a warning the run raises about itself (the `warnings` stream, docs/runs.md: the dashboard shows it
        beside the run) and print it once on stderr, through tqdm so that a progress bar is redrawn below the line
        rather than torn by it. `source` names what raised it ("no_signal", "draft_health", ...)."""
        from tqdm import tqdm  # lazy, like torch: readers of run lists need neither

        record = {"source": source, "message": message, "time": time.time()}
        self.log(WARNINGS, record if step is None else {"step": step, **record})
        where = self.meta["name"] + ("" if step is None else f", step {step}")
        tqdm.write(f"bebop: warning ({where}): {message}", file=sys.stderr)

    def update_meta(self, **fields: Any) -> None:
        """Merge `fields` into meta.json (replaced atomically): what a job learns about its run after it started (the
        head train-mtp makes, once its draft vocabulary is chosen)."""
        self._check_open()
        self.meta.update(to_jsonable(fields, "meta"))
        _write_atomic(self.path / "meta.json", self.meta)

    def _check_step(self, stream: str, step: Any) -> None:
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
            raise ValueError(f"'step' must be a finite number, got {step!r} in stream {stream!r}")
        last = self._last_step.get(stream)
        # train has one row per step: strictly increasing. Other streams may hold many rows per step.
        if last is not None and (step <= last if stream == "train" else step < last):
            raise ValueError(
                f"step {step} in stream {stream!r} is not after the last logged step {last}: "
                "a resumed run continues at RunWriter.last_step + 1 (or call rewind(step) first)"
            )

    def _open_stream(self, stream: str) -> int:
        path = self.path / f"{stream}.jsonl"
        if path.exists():
            _repair_tail(path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._fds[stream] = fd
        return fd

    def rewind(self, step: int) -> None:
        """Drop every record with step > `step` from all streams (resume from an older checkpoint)."""
        self._check_open()
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        for path in sorted(self.path.glob("*.jsonl")):
            kept = [line for line in path.read_bytes().splitlines(keepends=True) if _step_of(line) <= step]
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(b"".join(kept))
            os.replace(tmp, path)
            self._last_step[path.stem] = _last_step_in(path)
        self.status(step=self.last_step)

    def status(self, **fields: Any) -> None:
        """Merge `fields` into status.json and refresh the heartbeat."""
        state = fields.get("state")
        if state is not None and state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        self._status.update(to_jsonable(fields, "status"))
        self._last_heartbeat = self._status["heartbeat"] = time.time()
        _write_atomic(self.path / "status.json", self._status)

    def close(self, state: str = "finished", message: str | None = None) -> None:
        if self._closed:
            return
        if state not in STATES:
            raise ValueError(f"state must be one of {STATES}, got {state!r}")
        fields: dict[str, Any] = {"state": state}
        if message is not None:
            fields["message"] = message
        if self.last_step is not None:
            fields["step"] = self.last_step
        for fd in self._fds.values():
            os.fsync(fd)
            os.close(fd)
        self._fds.clear()
        self.status(**fields)
        self._closed = True
        for mirror in self._mirrors:
            mirror.close(state)

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"RunWriter for {self.path} is closed")

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close("finished")
        else:
            self.close(*ended_by(exc))


def ended_by(error: BaseException) -> tuple[str, str]:
    """(state, message) of a run an exception ended: "interrupted" by Ctrl-C or SIGTERM (`KeyboardInterrupt`), else
    "failed" with the error's line. The writer does not know whether its job resumes (eval-mtp does not): the CLI
    prints the command that continues one that does."""
    if isinstance(error, KeyboardInterrupt):
        return "interrupted", "stopped by Ctrl-C or SIGTERM (a job that takes --resume continues it)"
    return "failed", f"{type(error).__name__}: {error}"


def _step_of(line: bytes) -> float:
    try:
        step = json.loads(line).get("step")
    except (ValueError, AttributeError):
        return -math.inf  # corrupt or step-less lines never block a rewind
    return step if isinstance(step, (int, float)) else -math.inf


def _last_step_in(path: Path) -> float | None:
    steps = [s for s in map(_step_of, path.read_bytes().splitlines()) if s != -math.inf]
    return max(steps) if steps else None
