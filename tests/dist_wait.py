"""Run by tests/test_dist_wait.py under torchrun (2 ranks, gloo): rank 0 works for longer than the process group's
timeout before it broadcasts, as train-mtp's rank 0 generates its data set; the other rank receives the object iff
`broadcast_object` is given a `wait` past that work. argv: "wait" or "no-wait"."""

from __future__ import annotations

import datetime
import sys
import time

import torch.distributed as dist

from bebop import distributed

# The timeout also bounds the ranks' joining in init_process_group: 2 s failed a loaded CI-like run (3 test workers on
# 2 cores) before rank 0's work began, so the test tested nothing of `wait`.
TIMEOUT_S, WORK_S = 5, 12

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=TIMEOUT_S))
wait = datetime.timedelta(seconds=60) if sys.argv[1] == "wait" else None
if distributed.is_main():
    time.sleep(WORK_S)  # rank 0's work, past the group's timeout
got = distributed.broadcast_object("data" if distributed.is_main() else None, wait=wait)
assert got == "data", got
dist.barrier()  # the default group still works, with its own timeout
dist.destroy_process_group()
print(f"received {got}")
