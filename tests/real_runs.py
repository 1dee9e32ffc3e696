"""Runs made by the real CLI (`bebop rl`, `train-mtp`, `eval-mtp`), once per test process, for the dashboard tests.

Each command costs seconds of CPU, so `real_runs_root()` makes them the first time it is called and returns the
same root after that (test_app.py and test_browser.py share it through their session fixtures).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

from scratch import scratch

REPO = Path(__file__).resolve().parents[1]
# name -> the CLI arguments after `python -m bebop`; `--out` / `--run-dir` is added below
COMMANDS = {
    "rl-rs": ["rl", "--preset", "quick", "--steps", "1", "--gamma", "3", "--no-progress"],  # every step drafts
    "rl-plain": ["rl", "--preset", "quick", "--steps", "1", "--rollout", "none", "--no-progress"],
    "train-mtp": ["train-mtp", "--tiny"],
    "eval-mtp": ["eval-mtp", "--heads", "ce", "e2e_tv", "--methods", "to", "rs", "--temperatures", "0.7", "1.3",
                 "--num-prompts", "2", "--max-new-tokens", "16", "--gamma", "2"],
}


@functools.cache
def real_runs_root() -> Path:
    root = scratch("real-runs-") / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name, args in COMMANDS.items():
        out = ["--out" if args[0] == "rl" else "--run-dir", str(root / name)]
        done = subprocess.run([sys.executable, "-m", "bebop", *args, *out], cwd=root.parent, env=env, capture_output=True,
                              text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise AssertionError(f"bebop {' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return root


# The demo's two regimes at its default rows per step (32 and 4), shortened: `bebop demo`'s own four runs.
DEMO = ["demo", "--steps", "4", "--max-new-tokens", "24", "--threads", "1"]


@functools.cache
def demo_runs() -> tuple[Path, str]:
    """(the folder holding the four runs of one `bebop demo`, what it printed), made once per test process."""
    root = scratch("demo-runs-") / "runs"
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}  # rich wraps at the terminal's width
    done = subprocess.run([sys.executable, "-m", "bebop", *DEMO, "--out", str(root)], cwd=root.parent, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    if done.returncode != 0:
        raise AssertionError(f"bebop {' '.join(DEMO)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return next(root.iterdir()), done.stdout
