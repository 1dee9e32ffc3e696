"""Folders a test process makes outside pytest's `tmp_path` (the model caches, runs one process shares), all under
one root that tests/conftest.py makes when the process starts and removes when it ends. Left behind, a day of test
runs (the demo's and the dashboard's runs alone, 4 GB each) filled the disk of the machine CI runs on.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

ROOT = "BEBOP_TEST_SCRATCH"  # the environment variable naming this process's root


def scratch(prefix: str) -> Path:
    """A new empty folder under this test process's root."""
    return Path(tempfile.mkdtemp(prefix=prefix, dir=os.environ[ROOT]))
