"""The backbone's pass kept on disk (bebop.heads.feature_store): written batch by batch, so the pass is never held
whole; read one batch per use; a pass cut off leaves nothing a later run could read."""

from __future__ import annotations

import gc
import shutil
import weakref

import pytest
import torch

from bebop.heads.feature_store import backbone_batches


def _batches(n: int, alive: list[int], refs: list[weakref.ref]):
    """n batches of one 64 KiB tensor each; before making each, counts how many earlier ones are still alive."""
    for i in range(n):
        gc.collect()
        alive.append(sum(r() is not None for r in refs))
        hidden = torch.full((4, 16, 256), float(i))  # [B, T, d]
        refs.append(weakref.ref(hidden))
        yield {"hidden": hidden, "mask": torch.ones(4, 16, dtype=torch.bool)}


def test_the_pass_is_written_as_made_and_never_held_whole(tmp_path):
    """While the pass makes batch k, at most batch k-1 is still alive (the writer's loop variable): memory holds one
    or two batches whatever the corpus's size, and what is read back equals what was made."""
    alive: list[int] = []
    refs: list[weakref.ref] = []
    stored = backbone_batches(tmp_path, "k", (), lambda: _batches(12, alive, refs), print)
    assert len(stored) == 12 and max(alive) <= 1 and alive[0] == 0
    for i in (0, 5, 11):
        batch = stored[i]
        assert torch.equal(batch["hidden"], torch.full((4, 16, 256), float(i))) and batch["mask"].dtype == torch.bool
    assert [float(t[0, 0, 0]) for t in stored.select([3, 7]).tensors("hidden")] == [3.0, 7.0]
    assert "mask" not in stored.without("mask")[2]


def test_a_pass_cut_off_leaves_nothing_and_the_next_run_makes_it_whole(tmp_path):
    def broken():
        yield from _batches(3, [], [])
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        backbone_batches(tmp_path, "k", (), broken, print)
    assert not list(tmp_path.iterdir())
    said: list[str] = []
    assert len(backbone_batches(tmp_path, "k", (), lambda: _batches(5, [], []), said.append)) == 5
    assert not said  # made afresh, not read from a half-written pass
    assert len(backbone_batches(tmp_path, "k", (), lambda: _batches(0, [], []), said.append)) == 5 and said


def test_the_single_file_an_earlier_bebop_kept_for_the_same_pass_is_removed(tmp_path):
    """Before, the whole pass lay in one features-<hash>.pt (1.7 GB on SmolLM2's broad corpus, fused): the store that
    replaces it removes it, and leaves another key's file alone."""
    stored = backbone_batches(tmp_path, "k", (), lambda: _batches(2, [], []), print)
    old, other = stored.directory.with_name(f"{stored.directory.name}.pt"), tmp_path / "features-0123456789abcdef.pt"
    shutil.rmtree(stored.directory)
    old.write_bytes(b"old"), other.write_bytes(b"other")
    backbone_batches(tmp_path, "k", (), lambda: _batches(2, [], []), print)
    assert not old.exists() and other.exists()
