"""`scripts/gpu-check --smoke`: the GPU check's whole pipeline on the CPU, so the script cannot rot without a GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu-check"


def test_smoke_runs_every_stage_and_writes_one_table(tmp_path):
    assert os.access(SCRIPT, os.X_OK)
    done = subprocess.run([sys.executable, str(SCRIPT), "--smoke"], env={**os.environ, "OUT": str(tmp_path)},
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (tmp_path / "gpu-check.md").read_text()
    assert text in done.stdout  # printed and written alike
    head, table = text.split("\n\n", 1)
    assert f"torch {torch.__version__}" in head and "GPU:" in head and "UTC" in head
    lines = table.strip().splitlines()
    assert lines[0].startswith("| check |") and all(line.startswith("|") for line in lines)  # one markdown table
    body = lines[2:]
    assert any(line.startswith("| pytest -m cuda |") for line in body)
    for variant in ("bebop plain", "bebop rs γ=3", "bebop to γ=3", "hf plain", "hf assisted γ=3"):
        assert any(f"| {variant} |" in line for line in body if line.startswith("| bench engine |")), variant
    for stage in ("bench rl (rl) | default policy", "bench rl (rl-large) | self-draft deep"):
        assert sum(line.startswith(f"| {stage}") for line in body) == 2, stage  # plain and RS rollouts
    assert "failed" not in table and "timed out" not in table
