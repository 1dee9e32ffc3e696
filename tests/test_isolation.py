"""Tests see none of the machine's state: not the checkout's `runs/` (which `make demo` writes), not a previous
test's leftovers (tests/conftest.py gives each its own working directory)."""

from __future__ import annotations

import ast
import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SEEN: list[Path] = []


@pytest.mark.parametrize("leave", ["runs", "artifacts"])
def test_each_test_starts_in_an_empty_directory_of_its_own(leave: str):
    cwd = Path.cwd()
    assert REPO not in (cwd, *cwd.parents), f"a test runs inside the checkout ({cwd})"
    assert not any(cwd.iterdir()), f"{cwd} is not empty: {sorted(os.listdir(cwd))}"
    assert cwd not in SEEN
    SEEN.append(cwd)
    (cwd / leave).mkdir()  # what the next test must not see


def module_nodes():
    """(file name, AST node) of every node in the test modules."""
    for path in sorted((REPO / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            yield path.name, node


def test_no_subprocess_runs_in_the_checkout():
    # A job started in the checkout reads its runs/ and caches: the state these tests must not depend on.
    offenders = [f"{name}:{node.value.lineno}" for name, node in module_nodes()
                 if isinstance(node, ast.keyword) and node.arg == "cwd" and isinstance(node.value, ast.Name)
                 and node.value.id in {"REPO", "ROOT"}]
    assert not offenders, offenders


def test_the_model_caches_are_the_sessions_own():
    import huggingface_hub.constants as hub

    home = Path.home().resolve()
    for name in ("HF_HOME", "BEBOP_CACHE"):
        path = Path(os.environ[name]).resolve()
        assert path.is_relative_to(Path(tempfile.gettempdir()).resolve()) and home not in (path, *path.parents)
    assert Path(hub.HF_HOME).resolve() == Path(os.environ["HF_HOME"]).resolve()  # set before the hub was imported


def test_what_a_test_process_keeps_outside_tmp_path_lies_under_its_scratch_root():
    # tests/conftest.py removes that root when the process ends; a folder made elsewhere outlives the run, and a day
    # of runs left 10 GB in /tmp (the disk of the machine CI runs on filled up).
    root = Path(os.environ["BEBOP_TEST_SCRATCH"]).resolve()
    for name in ("HF_HOME", "BEBOP_CACHE", "BEBOP_REFERENCE_RUNS"):
        assert Path(os.environ[name]).resolve().is_relative_to(root), name
    offenders = [f"{name}:{node.lineno}" for name, node in module_nodes()
                 if isinstance(node, ast.Attribute) and node.attr in {"mkdtemp", "mkstemp"}
                 and name not in {"scratch.py", "conftest.py"}]  # the two that make the root and its folders
    assert not offenders, f"made outside the scratch root (use tests/scratch.py): {offenders}"
