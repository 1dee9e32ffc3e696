"""The backbone's pass over a head's corpus (`bebop.heads.data.make_batches`), kept on disk one batch per file and
read back one batch at a time.

A train-mtp run reads a batch per step and the held-out batches at each evaluation; kept in memory, the pass was the
largest thing the run held (on SmolLM2's broad corpus 0.9 GB of top hidden states, and as much again of a fused
head's taps: the 4.75 GiB peak of docs/real-model.md). Written batch by batch as the pass makes them and read per
use, a run holds one batch at a time whatever the corpus's size, and the operating system's page cache, which the
run's resident memory does not count, keeps the files' bytes near.

The store lies beside the corpus (`features-<hash of key>/`: one safetensors file per batch and `index.json`, written
last) so that a later run on the same corpus and batch settings reads it instead of running the backbone again; on a
real model that pass is most of a short run."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from bebop.device import to_device

INDEX = "index.json"


@dataclass(frozen=True)
class StoredBatches(Sequence):
    """The batches of a kept pass (`names`: their files in `directory`), each read from its file when indexed (a dict
    of tensors on `device`) and dropped by the caller after use; `drop` names keys left unread (a top-layer run
    reading a fused pass leaves its "taps")."""

    directory: Path
    names: tuple[str, ...]
    device: torch.device | str = "cpu"
    drop: frozenset[str] = frozenset()

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, i: int) -> dict:
        if not isinstance(i, int):
            raise TypeError(f"StoredBatches takes one batch's index, got {type(i).__name__}: use select()")
        with safe_open(self.directory / self.names[i], framework="pt") as f:
            return {k: to_device(f.get_tensor(k), self.device) for k in f.keys() if k not in self.drop}

    def select(self, indices: Iterable[int]) -> StoredBatches:
        """The batches at `indices`, still on disk."""
        return replace(self, names=tuple(self.names[i] for i in indices))

    def without(self, *keys: str) -> StoredBatches:
        """The same batches, read without `keys`."""
        return replace(self, drop=self.drop | set(keys))

    def tensors(self, key: str) -> Iterable[torch.Tensor]:
        """One key of each batch, read alone (the others stay on disk)."""
        for name in self.names:
            with safe_open(self.directory / name, framework="pt") as f:
                yield f.get_tensor(key)


def backbone_batches(cache: Path, key: str, taps: tuple[int, ...], make: Callable[[], Iterable[dict]], say,
                     device: torch.device | str = "cpu") -> StoredBatches:
    """The pass `make()` yields batch by batch (`make_batches` with `taps`), kept in `cache`/features-<hash of key>/
    (`key`: all that fixes the batches but the taps) and read back from there: a later run with the same key reads
    the kept pass instead of calling `make`. A pass kept with a fused head's taps serves a top-layer run too (its
    taps left unread); a run that needs taps the kept pass lacks makes it again with its own. `say` hears which it
    was."""
    path = cache / f"features-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    kept = _read_index(path)
    if kept is not None and kept["key"] == key and (tuple(kept["taps"]) == taps or not taps):
        say(f"the backbone's pass over the corpus, read from {path}")
    else:
        kept = _write(path, key, taps, make())
        path.with_name(f"{path.name}.pt").unlink(missing_ok=True)  # the same pass as bebop kept it before, one file
    drop = frozenset() if taps else frozenset({"taps"})
    return StoredBatches(path, tuple(kept["names"]), device, drop)


def _read_index(path: Path) -> dict | None:
    try:
        return json.loads((path / INDEX).read_text())
    except (OSError, ValueError):
        return None  # no pass kept there, or one cut off before its index was written


def _write(path: Path, key: str, taps: tuple[int, ...], batches: Iterable[dict]) -> dict:
    """Each batch to its own file as it comes (so the pass is never held whole), the index last, all in a folder of
    this process's own that then takes `path`'s place: a reader sees a whole pass or none."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    names = []
    try:
        for i, batch in enumerate(batches):
            names.append(f"batch-{i:05d}.safetensors")
            save_file({k: v.detach().contiguous().cpu() for k, v in batch.items()}, tmp / names[-1])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # a pass cut off leaves nothing behind
        raise
    index = {"key": key, "taps": list(taps), "names": names}
    (tmp / INDEX).write_text(json.dumps(index))
    kept = _read_index(path)
    if kept is None or (kept["key"], kept["taps"]) != (key, list(taps)):
        shutil.rmtree(path, ignore_errors=True)  # a kept pass with other taps (or a broken one): this one replaces it
    try:
        tmp.rename(path)
    except OSError:
        shutil.rmtree(tmp)  # another process (a rank of the same run) kept the same pass first
    return index
