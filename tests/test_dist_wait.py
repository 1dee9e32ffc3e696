"""`distributed.broadcast_object(wait=...)`: the other ranks wait for rank 0's long work (train-mtp generating its data
set) past the process group's timeout, which still bounds every other collective. Two gloo ranks under torchrun."""

from __future__ import annotations

from test_distributed import TESTS, torchrun


def test_a_broadcast_with_wait_outlasts_the_group_timeout():
    out = torchrun(str(TESTS / "dist_wait.py"), "wait", timeout=120)
    assert out.count("received data") == 2


def test_without_wait_the_group_timeout_ends_the_broadcast():
    proc = torchrun(str(TESTS / "dist_wait.py"), "no-wait", wait=False)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "received data" not in out
    assert "Timed out" in out  # gloo: the group's timeout (dist_wait.TIMEOUT_S) ended it, not another error
