"""Opening a run: the one way every job starts, continues and checkpoints one (nanochat's `compute_init` and its
checkpoint manager, in the room that owns run directories).

    session = open_session(run_dir, config, kind="train-mtp", resume=resume, checkpoints=CHECKPOINTS, mirrors=mirrors)
    model = model.to(session.device)                       # threads, device and dtype are set
    with session.begin({...}):                             # the writer (rank 0) or its null twin, rewound
        for step in range(session.start, config.steps):   # session.checkpoint: what to restore, or None
            session.writer.log("train", {"step": step, ...})
            if session.due(step):
                session.save(step, {...})                  # rank 0 writes, every rank waits

`open_session` touches nothing: it checks the directory by the one rule (`check_run_dir`), sets the torch threads,
resolves the device and the compute dtype, and with `resume` reads the checkpoint and holds its config against the
run's (`config_changes`: only the fields the config's class lists as `RESUMABLE` may change). `begin` writes: the
writer on rank 0, a `NullWriter` elsewhere, the changes a resume made recorded in meta.json's `resumes`, the streams
rewound to the checkpoint. Leaving the block closes the run "finished", "failed", or "interrupted" (Ctrl-C, SIGTERM).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from bebop import distributed, files
from bebop.device import resolve_device, resolve_dtype
from bebop.runlog.mirror import Mirror
from bebop.runlog.null import NullWriter
from bebop.runlog.write import RunWriter, check_run_dir, to_jsonable


@dataclass(frozen=True)
class Checkpoints:
    """A job's checkpoint: its format's name and the keys every checkpoint of it holds (`bebop.files`)."""

    format: str
    keys: tuple[str, ...]


def default_run_dir(kind: str, *parts: str, root: str | os.PathLike = "runs") -> Path:
    """`root`/KIND-PARTS-TIME, the directory of a run its user did not name; every rank gets rank 0's."""
    name = "-".join([kind, *parts, time.strftime("%Y%m%d-%H%M%S")])
    return distributed.broadcast_object(Path(root) / name)


def config_changes(saved: Mapping[str, Any], now: Any, resumable: Iterable[str] = ()) -> tuple[dict, dict]:
    """How the dataclass config `now` differs from `saved` (a config as its run recorded it: earlier field names read
    as today's through the class's `RENAMED`, a field it predates as its default), as two dicts field -> (saved,
    now): the changes in `resumable` fields, and the rest. Values compare as JSON (a tuple equals the list it was
    saved as)."""
    renamed = getattr(type(now), "RENAMED", {})
    saved = {renamed.get(k, k): v for k, v in saved.items()}
    allowed, refused = {}, {}
    for field in fields(now):
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default
        before = saved.get(field.name, default)
        if to_jsonable(before) != to_jsonable(getattr(now, field.name)):
            (allowed if field.name in resumable else refused)[field.name] = (before, getattr(now, field.name))
    return allowed, refused


def open_session(run_dir: str | os.PathLike, config: Any, *, kind: str, resume: bool = False,
                 checkpoints: Checkpoints | None = None, mirrors: Iterable[Mirror] = (), name: str | None = None,
                 progress: bool = True) -> RunSession:
    """A run of `config` (a job's dataclass config with `threads`, `device` and `dtype`; `steps` and
    `checkpoint_every` where it checkpoints) opened in `run_dir`, nothing written yet (module docstring). `resume`
    continues the run there from its checkpoint (`checkpoints`: a job that has none cannot resume). The writer `begin`
    makes is named `name` (default: the directory's) and copies its records to `mirrors` (`bebop.runlog.mirror`).
    `progress`: a progress bar, on rank 0 only."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir, resume=resume, resumable=checkpoints is not None)
    if resume and checkpoints is None:
        raise ValueError(f"a {kind} run cannot be resumed: it keeps no checkpoint")
    # None: half the cores per process (an async RL run computes two phases at once; oversubscribed OpenMP teams
    # spin against each other on a busy CPU)
    torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // 2 // distributed.local_world()))
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    state, saved = None, None
    if resume and (run_dir / "meta.json").is_file():  # the checkpoint's config; before it, the one meta.json recorded
        state = files.load_checkpoint(run_dir, format=checkpoints.format, keys=checkpoints.keys)
        saved = state["config"] if state is not None else files.read_json(run_dir / "meta.json").get("config")
    changes, refused = config_changes(saved, config, getattr(type(config), "RESUMABLE", ())) if saved else ({}, {})
    if refused:
        raise ValueError(f"cannot resume with a different config (checkpoint, now): {refused}")
    return RunSession(run_dir, config, kind, device, dtype, resume, checkpoints, state, changes, tuple(mirrors), name,
                      progress and distributed.is_main())


@dataclass
class RunSession:
    """An opened run (`open_session`): where it is, what it computes on, the checkpoint it continues from (None: a
    fresh run, or one that died before its first checkpoint), and after `begin` its writer."""

    run_dir: Path
    config: Any
    kind: str
    device: Any  # torch.device
    dtype: Any  # torch.dtype: the compute dtype (autocast, rollouts)
    resume: bool
    checkpoints: Checkpoints | None
    checkpoint: dict | None
    changes: dict  # resumable fields the resume changed: field -> (recorded, now)
    mirrors: tuple[Mirror, ...] = ()
    name: str | None = None
    progress: bool = True
    writer: RunWriter | NullWriter | None = None

    @property
    def start(self) -> int:
        """The first step this session runs: the checkpoint's next, else 0."""
        return 0 if self.checkpoint is None else int(self.checkpoint["step"]) + 1

    def begin(self, meta: Mapping[str, Any] | None = None) -> RunSession:
        """Write: the run's writer (rank 0; a `NullWriter` elsewhere) with `meta` beside its config and the compute's
        device and world size, refused first when meta's `policy` is not the one the run started from; a resume's
        changes recorded, and the streams rewound to the checkpoint (rows logged after it are recomputed)."""
        meta = {"device": str(self.device), "world_size": distributed.world(), **(meta or {})}
        if self.resume:
            check_same_policy(self.run_dir, meta.get("policy"))
        if not distributed.is_main():
            self.writer = NullWriter(self.name or self.run_dir.name, self.run_dir)
            return self
        self.writer = RunWriter(self.run_dir, self.config, kind=self.kind, resume=self.resume, name=self.name,
                                meta_extra=meta, mirrors=self.mirrors)
        if self.changes:
            self.writer.meta["resumes"][-1]["changed"] = {k: list(v) for k, v in self.changes.items()}
            self.writer.update_meta()
        if self.writer.last_step is not None and self.writer.last_step >= self.start:
            self.writer.rewind(self.start - 1)
        return self

    def due(self, step: int) -> bool:
        """Whether `step` ends with a checkpoint: every `checkpoint_every` steps (0: none but the last) and the last."""
        every = self.config.checkpoint_every
        return bool(every and (step + 1) % every == 0) or step + 1 == self.config.steps

    def save(self, step: int, state: Mapping[str, Any]) -> None:
        """The checkpoint after `step`: `state` (every rank computes it: gathering a sharded model is a collective)
        with the step and the config, written atomically by rank 0, Ctrl-C and SIGTERM held until it is whole."""
        if distributed.is_main():
            with uninterrupted():
                files.save_checkpoint(self.run_dir, {**state, "step": step, "config": dataclasses.asdict(self.config)},
                                      format=self.checkpoints.format, keys=self.checkpoints.keys)
        distributed.barrier()  # no rank runs ahead of a checkpoint that is not on disk yet

    def __enter__(self) -> RunSession:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.writer.__exit__(exc_type, exc, tb)


def check_same_policy(run_dir: Path, policy: Mapping | None) -> None:
    """A run resumes from the policy it started from (meta.json's `policy` hash, where it and `policy` have one): the
    checkpoint restores what it trained, and meta.json would otherwise name a policy the run never ran."""
    meta = files.read_json(run_dir / "meta.json") if (run_dir / "meta.json").is_file() else {}
    started = meta.get("policy") if isinstance(meta.get("policy"), dict) else {}
    now = policy if isinstance(policy, Mapping) else {}
    if started.get("hash") and now.get("hash") and started["hash"] != now["hash"]:
        raise ValueError(f"cannot resume {run_dir}: it started from policy {started.get('name')} (weights "
                         f"{started['hash'][:8]}), not {now.get('name')} (weights {now['hash'][:8]}); "
                         "resume it with the --policy it started from")


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C and SIGTERM held while the block writes, then raised: a checkpoint is written whole or not begun. In
    the main thread only (where signals arrive); elsewhere the block runs as is. A signal the process ignores stays
    ignored (a job started in the background by a script, or under nohup, ignores Ctrl-C: it must not stop it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    before = {sig: signal.signal(sig, lambda number, _frame: held.append(number))
              for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if held:
            raise KeyboardInterrupt
