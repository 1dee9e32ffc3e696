"""The README and docs/ against what they describe: a test count from the suite, links that resolve, a docs build
that writes only ignored paths, and a picture that shows its story.

The README's quick start states how many tests `make test` runs. The number is the suite's own collection (what
`pytest --collect-only -q` counts: the same on every machine with the dev extras, unlike a passed / skipped split),
checked whenever a session collects the whole suite, as `make test` and CI do, so adding tests without updating the
README fails here with the number to write.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from suite_files import make_recipe, marked_modules
from script_module import load_script

REPO = Path(__file__).resolve().parents[1]
MAKE_TEST_MARKS = "not compile"  # the -m of `make test`
README = REPO / "README.md"
COUNT = re.compile(r"the test suite CI runs: (\d[\d,]*) tests")
README_LINES = 250  # a newcomer's page: the measurements live in docs/


def whole_suite(config: pytest.Config) -> bool:
    """Whether this session collected every test under tests/ that `make test` runs (no paths below it, no -k or
    --deselect, no -m but `make test`'s own, which leaves the compiled engine's tests to `make test-compiled`)."""
    start = config.invocation_params.dir
    paths = {(start / arg.split("::")[0]).resolve() for arg in config.args}
    return (paths == {REPO / "tests"} and not config.option.keyword and config.option.markexpr in ("", MAKE_TEST_MARKS)
            and not config.getoption("deselect", None))


def test_the_readme_states_the_number_of_tests_the_suite_collects(request: pytest.FixtureRequest):
    if not whole_suite(request.config):
        pytest.skip("only a session that collects the whole suite knows its count (make test, CI)")
    stated = COUNT.search(README.read_text())
    assert stated, f"the quick start must say 'the test suite CI runs: N tests' ({COUNT.pattern})"
    collected = len(request.session.items)
    assert int(stated.group(1).replace(",", "")) == collected, (
        f"README.md says {stated.group(1)} tests; the suite collects {collected}: write {collected}")


def test_make_test_leaves_the_compile_marked_tests_to_make_test_compiled_which_runs_them_all():
    """`make test` deselects the compile marker and `make test-compiled` selects it in the modules it names: a module
    that gains a compile-marked test must be named there, or no make target (and so no CI step) would run it."""
    test, compiled = " ".join(make_recipe("test")), " ".join(make_recipe("test-compiled"))
    assert f'-m "{MAKE_TEST_MARKS}"' in test and "-m compile" in compiled, (test, compiled)
    marked = marked_modules("compile")
    named = {word.split("/")[-1] for word in compiled.split() if word.startswith("tests/")}
    assert marked and marked == named, (sorted(marked), sorted(named))
    assert "make test-compiled" in (REPO / ".ci" / "run").read_text()


def test_the_readme_is_a_newcomers_page_whose_links_resolve():
    text = README.read_text()
    assert len(text.splitlines()) <= README_LINES, f"README.md is over {README_LINES} lines: move detail to docs/"
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if not re.match(r"[a-z]+://", t)]
    assert "docs/images/live.png" in local
    missing = [t for t in local if not (REPO / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"
    smollm2 = text.split("### On SmolLM2", 1)  # one short subsection under the findings; the numbers in docs/
    assert len(smollm2) == 2 and "docs/real-model.md" in smollm2[1].split("\n## ", 1)[0], (
        "README.md needs its '### On SmolLM2' subsection, linking docs/real-model.md")


def test_every_docs_page_links_only_to_files_that_exist():
    for page in sorted((REPO / "docs").glob("*.md")):
        targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
        missing = [t for t in targets if not re.match(r"[a-z]+://", t) and not (page.parent / t).exists()]
        assert not missing, f"{page.name} links to files that do not exist: {missing}"


def test_make_docs_writes_only_paths_git_ignores():
    """`make docs` must leave `git status` clean: no copy over a tracked file, and every output folder ignored."""
    recipe = make_recipe("docs")
    assert recipe, "the Makefile has no docs recipe"
    assert not [c for c in recipe if re.search(r"(^|\s)(cp|mv|tee)\s|>", c)], f"docs writes a file by hand: {recipe}"
    outputs = [m.group(1) for c in recipe for m in re.finditer(r"BEBOP_NOTEBOOK_HTML=(\S+)", c)]
    outputs += [c.split("readme-picture", 1)[1].split()[0] for c in recipe if "readme-picture" in c]
    assert len(outputs) == 2, recipe
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    for folder in outputs:
        probe = f"{folder}/probe.html"
        # git answers from the checkout's ignore rules alone: no job runs there, none reads its runs/ or caches
        ignored = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", probe]).returncode == 0
        assert ignored, f"make docs writes into {folder}/, which git does not ignore"


def test_the_picture_script_refuses_a_picture_without_its_story():
    check = load_script("readme-picture").check
    good = {"points": [11, 12], "lines": 2, "names": ["a · slope -0.2/nat, R² 0.75", "b · slope -0.2/nat, R² 0.8"],
            "x0": 0.0, "y0": 0.0}
    assert check(good) == []
    assert "fewer than two points" in check(good | {"points": [1, 12]})[0]  # the old one-step run's single dot
    assert "fitted line" in check(good | {"lines": 1, "names": ["a · too few points to fit", "b · R² 0.8"]})[0]
    assert "below 0" in check(good | {"x0": -0.5})[0]  # the old picture's -0.5 nats
    png = (REPO / "docs" / "images" / "live.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and 20_000 < len(png) < 1_000_000
