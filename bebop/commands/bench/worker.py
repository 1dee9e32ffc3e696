"""Fresh-process measurement for the memory benchmarks (`bench losses`, `bench train-mtp`).

Each variant runs in its own Python process, so one cannot inherit the other's memory. Peak memory is taken
above a baseline set once the variant's inputs exist: on CUDA with torch.cuda.max_memory_allocated, on CPU as the
kernel's resident-set high-water mark (VmHWM in /proc/self/status, reset to the current RSS through
/proc/self/clear_refs; like getrusage's ru_maxrss, but resettable after setup). The RSS also holds what the C
allocator keeps resident after a free, so on CPU it bounds the live tensors from above.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch


def check_peak_supported(device: str) -> None:
    """Raise ValueError when peak memory cannot be measured on `device` here."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: CUDA is not available here")
    if device == "cpu" and not Path("/proc/self/clear_refs").exists():
        raise ValueError("--device cpu measures peak RSS through /proc/self/clear_refs (Linux only)")


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak(device: str) -> int:
    """Start a fresh peak window; returns the baseline in bytes."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)  # the variant's device, named: it need not be the current one
        torch.cuda.reset_peak_memory_stats(device)
        return torch.cuda.memory_allocated(device)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    return _rss_kib("VmRSS") * 1024


def peak(device: str) -> int:
    """The high-water mark in bytes since `reset_peak` (subtract its baseline)."""
    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated(device)
    return _rss_kib("VmHWM") * 1024


def spawn(module: str, spec: dict) -> dict:
    """Run `python -m module JSON_SPEC` in a fresh process; returns the JSON its last stdout line holds."""
    cmd = [sys.executable, "-m", module, json.dumps(spec)]
    # The worker must import this same bebop, installed or not.
    root = str(Path(__file__).resolve().parents[3])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{module} worker {spec.get('variant')} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
