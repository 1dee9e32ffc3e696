"""What every test starts from: its own working directory and the same global generator state.

Working directory: a test that reads `runs/`, `artifacts/` or a cache relative to where pytest was started tests that
machine's state, not the code (`make demo` writes `runs/` into the checkout, and a relative "runs/" then exists). So
the session starts in an empty directory of its own (module and session fixtures see it) and each test in its own
`tmp_path`; the model caches point into empty temporary directories. Paths a test means in the checkout
are spelled from `__file__`. The reference runs bebop ships are read from an empty folder too ($BEBOP_REFERENCE_RUNS):
what `bebop preview` writes then does not hang on which runs are shipped; a test about them points it at its own.

Generator: nn.Module initialisation draws from torch's global generator, so without the reseeding a test's weights
(and any margin it checks) would hang on which tests ran before it and in what order. The module-scoped seed covers
module fixtures, which pytest sets up before any function-scoped one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import Counter

import pytest
import torch
from scratch import ROOT, scratch

CACHES = ("HF_HOME", "BEBOP_CACHE")  # Hugging Face's hub cache; bebop's converted models (`bebop get-model`)


def pytest_configure(config: pytest.Config):
    # Each process (every xdist worker too) owns its scratch root, removed in pytest_unconfigure (tests/scratch.py).
    os.environ[ROOT] = tempfile.mkdtemp(prefix="bebop-test-")
    # Before collection: huggingface_hub reads HF_HOME when test modules import it.
    for name in CACHES:  # the user's model caches are state too: a test makes what it reads
        os.environ[name] = str(scratch(f"{name.lower()}-"))
    os.environ["BEBOP_REFERENCE_RUNS"] = str(scratch("reference-runs-"))  # none shipped
    if os.environ.get("PYTEST_XDIST_WORKER"):  # `make test` runs one worker per core (pytest-xdist): one thread
        os.environ["OMP_NUM_THREADS"] = "1"  # each, its subprocesses' too, or two workers fight over each core
        torch.set_num_threads(1)


def pytest_unconfigure(config: pytest.Config):
    shutil.rmtree(os.environ.pop(ROOT), ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]):
    # `make test` hands whole modules to one worker per core (pytest-xdist, --dist loadfile: a module's fixtures are
    # built once) in collection order. Modules with more slow tests go first, so that a long one does not start last
    # and keep one worker busy while the other idles.
    slow = Counter(item.module.__name__ for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.module.__name__])  # stable: each module keeps its own order


@pytest.fixture(scope="session", autouse=True)
def _session_in_an_empty_directory(tmp_path_factory: pytest.TempPathFactory):
    start = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(start)


@pytest.fixture(autouse=True)
def _test_in_its_own_directory(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)


@pytest.fixture(scope="module", autouse=True)
def _seed_global_generator_per_module():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _seed_global_generator():
    torch.manual_seed(0)
