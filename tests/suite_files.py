"""What the suite's own files say about where its tests run: the test modules that carry a marker, and the lines of
a Makefile target's recipe (the checks that every marked test is run by the target or CI step meant for it)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def marked_modules(marker: str) -> set[str]:
    """The names of the test modules that use `pytest.mark.<marker>` (as a decorator, a module's pytestmark, or a
    call that wraps a test)."""
    pattern = re.compile(rf"\bpytest\.mark\.{re.escape(marker)}\b")
    return {p.name for p in (REPO / "tests").glob("test_*.py") if pattern.search(p.read_text())}


def make_recipe(target: str) -> list[str]:
    """The lines of a Makefile target's recipe."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe
