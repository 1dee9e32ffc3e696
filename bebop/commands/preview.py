"""`bebop preview ROOT`: synthetic RL runs to look at in the dashboard before any real job (bebop.rl.synthetic).

    bebop preview runs/preview            # five finished runs of the paper's comparisons
    bebop preview runs/preview --live 1   # ... plus one that grows by a step every second, until Ctrl-C
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("root", type=Path, help="directory to write the runs into (one sub-directory per run)")
    parser.add_argument("--steps", type=int, default=60, help="steps per finished run (default 60)")
    parser.add_argument("--live", type=float, default=None, metavar="SECONDS",
                        help="also write a run 'live' that grows by one step every SECONDS until interrupted")
    parser.add_argument("--live-steps", type=int, default=100_000, help="stop the live run after this many steps")


def run(args: argparse.Namespace) -> int:
    if args.steps < 2 or args.live_steps < 2:
        raise ValueError(f"--steps and --live-steps must be >= 2, got {args.steps} and {args.live_steps}")
    if args.live is not None and not args.live >= 0:
        raise ValueError(f"--live must be a number of seconds >= 0, got {args.live}")
    from bebop.rl.synthetic import SyntheticRun, preview_configs, write_preview_runs

    paths = write_preview_runs(args.root, args.steps)
    print("wrote", ", ".join(str(p) for p in paths))
    if args.live is None:
        return 0
    config = replace(preview_configs(args.live_steps)[3], name="live", seed=7)
    with SyntheticRun(args.root / "live", config) as run:
        print(f"growing {run.path} by one step every {args.live} s (Ctrl-C stops)", flush=True)
        try:
            while run.step < args.live_steps:
                run.advance()
                time.sleep(args.live)
        except KeyboardInterrupt:
            pass
    return 0
