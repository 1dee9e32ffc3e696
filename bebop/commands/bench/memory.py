"""`bebop bench memory`: the peak resident memory of whole bebop jobs, each in a fresh process, one after another.

    bebop bench memory -- eval-mtp --profile real --num-prompts 16
    bebop bench memory --budget-gib 4 -- train-mtp --policy smollm2 --draft-vocab 8192 --steps 20 -- eval-mtp ...

Each job after a `--` is a `bebop` command line, run as `python -m bebop ...` in a child process; its peak is the
kernel's resident-set high-water mark of that child and everything it waited for (getrusage's ru_maxrss over the
children, taken after each one alone: a child's own peak, since no two overlap). A job that fails is a row saying so.
With `--budget-gib` a job above the budget is flagged and the command exits 1, so a script can hold a job to it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

GIB = 2**30


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budget-gib", type=float, default=None,
                        help="flag jobs whose peak passes this many GiB and exit 1 (default: no budget)")
    parser.add_argument("jobs", nargs=argparse.REMAINDER,
                        help="bebop command lines, each after a `--` (e.g. -- eval-mtp --profile real)")


def split_jobs(words: list[str]) -> list[list[str]]:
    """`-- a b -- c d` -> [[a, b], [c, d]]; a ValueError naming what is missing."""
    jobs: list[list[str]] = []
    for word in words:
        if word == "--":
            jobs.append([])
        elif not jobs:
            raise ValueError(f"put each job after `--`, e.g. `bebop bench memory -- eval-mtp ...`; got {word!r} first")
        else:
            jobs[-1].append(word)
    if not jobs or any(not job for job in jobs):
        raise ValueError("give at least one job, each after `--`: `bebop bench memory -- eval-mtp --profile real`")
    return jobs


def measure(job: list[str]) -> dict:
    """Run `bebop JOB` in a child process; returns its exit status, wall seconds and peak RSS in bytes."""
    root = str(Path(__file__).resolve().parents[3])  # the child imports this same bebop, installed or not
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    start = time.perf_counter()
    # ru_maxrss over the children is the largest child's peak so far: spawn a reaper per job so each reads alone.
    reaper = ("import resource, subprocess, sys; code = subprocess.call(sys.argv[1:]); "
              "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", reaper, sys.executable, "-m", "bebop", *job], env=env,
                          stdout=subprocess.PIPE, text=True)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    peak_kib = int(last) if last.isdigit() else 0
    return {"job": shlex.join(job), "returncode": done.returncode, "seconds": time.perf_counter() - start,
            "peak_bytes": peak_kib * 1024, "output": done.stdout.strip().splitlines()[:-1][-3:]}


def run(args: argparse.Namespace) -> int:
    jobs = split_jobs(args.jobs)
    if args.budget_gib is not None and not args.budget_gib > 0:
        raise ValueError(f"--budget-gib must be > 0, got {args.budget_gib}")
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    rows = []
    for job in jobs:
        console.log(f"running `bebop {shlex.join(job)}` (its peak resident memory is measured)")
        rows.append(measure(job))
    table = Table(title="peak resident memory per job (ru_maxrss of a fresh process)")
    for col in ("job", "exit", "wall s", "peak GiB", "budget"):
        table.add_column(col, justify="right" if col != "job" else "left", overflow="fold")
    over = False
    for r in rows:
        fits = "" if args.budget_gib is None else ("ok" if r["peak_bytes"] <= args.budget_gib * GIB else "OVER")
        over |= fits == "OVER"
        table.add_row(r["job"], str(r["returncode"]), f"{r['seconds']:.0f}", f"{r['peak_bytes'] / GIB:.2f}", fits)
    Console(width=160).print(table)
    return 1 if over or any(r["returncode"] != 0 for r in rows) else 0
