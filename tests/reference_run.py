"""A stand-in for the SmolLM2 reference runs, made once per test process: a real `bebop rl` on the embedded default
with the reference runs' kinds of shadow heads (frozen and online), and the same run packed by `bebop.runlog.pack`
into a folder of its own. Tests point $BEBOP_REFERENCE_RUNS at that folder: none reads bebop/assets/runs.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

from scratch import scratch

REPO = Path(__file__).resolve().parents[1]
NAME = "standin"
COMMIT = "0123456789abcdef0123456789abcdef01234567"  # what the tests say made it: no test reads the checkout's git
COMMAND = ["rl", "--steps", "4", "--prompts", "2", "--group", "2", "--max-new-tokens", "16", "--threads", "1",
           "--shadow-heads", "ce", "online-tv:e2e_tv", "online-ce:e2e_tv", "--no-progress"]


@functools.cache
def finished_run() -> Path:
    """The run directory `bebop rl` wrote, checkpoint and all (about 10 s of CPU, once)."""
    run = scratch("reference-") / "runs" / "smollm2-like"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "bebop", *COMMAND, "--out", str(run)], cwd=run.parent.parent,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise AssertionError(f"bebop {' '.join(COMMAND)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return run


def command() -> str:
    """The command that made `finished_run()`, as a user would have typed it."""
    return " ".join(["bebop", *COMMAND, "--out", str(finished_run())])


@functools.cache
def packed_root() -> Path:
    """A folder holding the stand-in packed as NAME: what $BEBOP_REFERENCE_RUNS points at."""
    from bebop.runlog.pack import pack_run

    root = scratch("reference-runs-")
    pack_run(finished_run(), NAME, command=command(), commit=COMMIT, root=root)
    return root
