"""`scripts/gpu-check --smoke`: the GPU check's whole pipeline on the CPU, so the script cannot rot without a GPU; and
its test selection as the lent machine's image will meet it (without the packages that image lacks)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check"


def _pytest_stages(stages: dict) -> dict:
    return {name: args for name, (_, args) in stages.items() if args[:2] == ["-m", "pytest"]}


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
    for stage in ("tests", "tests-graphs"):
        assert any(line.startswith(f"| pytest -m cuda ({stage}) |") and "skipped" in line for line in body), stage
    assert any(line.startswith("| engine-graphs |") and "not in --smoke" in line for line in body)
    for variant in ("bebop plain", "bebop rs γ=3", "bebop to γ=3", "hf plain", "hf assisted γ=3"):
        assert any(f"| {variant} |" in line for line in body if line.startswith("| bench engine |")), variant
    for stage in ("bench rl (rl) | default policy", "bench rl (rl-large) | self-draft deep"):
        assert sum(line.startswith(f"| {stage}") for line in body) == 2, stage  # plain and RS rollouts
    assert "failed" not in table and "timed out" not in table


def test_the_smoke_runs_the_gpu_test_selection_and_every_other_stage_but_one_named():
    gpu_check = load_script("gpu-check")
    assert sum(budget for budget, _ in gpu_check.GPU.values()) <= 8 * 60  # the GPU stages fit 8 minutes
    assert _pytest_stages(gpu_check.SMOKE) == _pytest_stages(gpu_check.GPU) != {}
    assert set(gpu_check.SMOKE).isdisjoint(gpu_check.SMOKE_LEAVES_OUT)
    assert set(gpu_check.SMOKE) | set(gpu_check.SMOKE_LEAVES_OUT) == set(gpu_check.GPU)


def _uses_the_cuda_mark(source: str) -> bool:
    """Whether the code (not a string in it) names `pytest.mark.cuda`."""
    return any(isinstance(node, ast.Attribute) and node.attr == "cuda" and isinstance(node.value, ast.Attribute)
               and node.value.attr == "mark" for node in ast.walk(ast.parse(source)))


def test_every_file_of_cuda_marked_tests_is_in_the_selection():
    gpu_check = load_script("gpu-check")
    marked = {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_*.py") if _uses_the_cuda_mark(p.read_text())}
    assert marked == set(gpu_check.CUDA_TESTS) | set(gpu_check.GRAPH_TESTS)


def _collected(args: list[str], pythonpath: list[str]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, str(ROOT)])}
    # the checkout's test files by absolute path, from an empty directory: no state of the checkout is read
    args = [str(ROOT / a) if a.startswith("tests/") else a for a in args]
    done = subprocess.run([sys.executable, *args, "--collect-only"], env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return sorted(line for line in done.stdout.splitlines() if "::" in line)


@pytest.mark.slow
def test_the_selection_collects_without_the_packages_the_lent_image_lacks(tmp_path):
    """The pytest stages' selection (one collection of all their files), collected with the packages the lent image
    lacks blocked, is the same tests as in this venv, without an error: a test module that imports one of them (through
    bebop.plots, say) fails here."""
    gpu_check = load_script("gpu-check")
    stages = list(_pytest_stages(gpu_check.GPU).values())
    assert all(args[:len(gpu_check.PYTEST)] == gpu_check.PYTEST for args in stages)
    selection = [*gpu_check.PYTEST, *(a for args in stages for a in args[len(gpu_check.PYTEST):])]
    blocked = str(gpu_check.blocker(tmp_path / "blocker"))
    here = _collected(selection, [])
    assert {test.split("::")[0] for test in here} == set(gpu_check.CUDA_TESTS) | set(gpu_check.GRAPH_TESTS)
    assert _collected(selection, [blocked]) == here
    script = tmp_path / "imports.py"  # each import of the missing packages, in a child process: the blocker blocks
    script.write_text("".join(f"try:\n    import {m}\nexcept ModuleNotFoundError as e:\n    print(e)\n"
                              for m in gpu_check.IMAGE_LACKS))
    done = subprocess.run([sys.executable, str(script)], env={**os.environ, "PYTHONPATH": blocked},
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.count("lent image lacks it") == len(gpu_check.IMAGE_LACKS), done.stdout + done.stderr
