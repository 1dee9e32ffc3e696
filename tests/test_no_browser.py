"""The notebooks on a machine without Chrome or Chromium (the README's path): their setup never hangs, it chooses the
plotly.js renderer and says once what to install for PNGs, and a page `jupyter nbconvert --to html --execute`
renders shows every figure. With a browser (`.ci/install-browser`, the `browser` marker) the figures are PNGs.

The browser is hidden from kaleido as choreographer looks for it: $BROWSER_PATH names a file that is not there
(choreographer then skips PATH and the usual install paths) and $XDG_DATA_HOME an empty folder (where its own
download would be). choreographer reads the latter at import, so every setup here runs in a process of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from suite_files import marked_modules

from bebop.plots import notebook

REPO = Path(__file__).resolve().parents[1]
SETUP = """
import json, sys, time
import plotly.io as pio
from bebop.plots import notebook
notebook.TRIAL_S = float(sys.argv[1])
start = time.monotonic()
notebook.setup()
print(json.dumps({"renderer": pio.renderers.default, "seconds": time.monotonic() - start}))
"""


def hidden_browser(tmp_path: Path, browser_path: Path | None = None) -> dict:
    """The environment of a process that sees no browser (or only `browser_path`)."""
    env = {**os.environ, "BROWSER_PATH": str(browser_path or tmp_path / "no-browser" / "chromium"),
           "XDG_DATA_HOME": str(tmp_path / "empty-data"), "PYTHONPATH": str(REPO)}
    env.pop("PLOTLY_RENDERER", None)  # the notebook's own choice, as a user's nbconvert gets it
    return env


def run_setup(env: dict, trial_s: float) -> tuple[dict, str]:
    """A notebook's setup in a fresh interpreter: (its renderer and seconds, the line it printed)."""
    done = subprocess.run([sys.executable, "-c", SETUP, str(trial_s)], env=env, capture_output=True, text=True,
                          timeout=trial_s + 120)
    assert done.returncode == 0, done.stderr[-3000:]
    *said, result = done.stdout.strip().splitlines()
    return json.loads(result), "\n".join(said)


def test_without_a_browser_the_setup_chooses_plotlyjs_at_once_and_says_what_to_install(tmp_path):
    result, said = run_setup(hidden_browser(tmp_path), trial_s=notebook.TRIAL_S)
    assert result["renderer"] == notebook.FALLBACK
    # No trial ran (it would say "could not draw"): the hang this guards against was a trial on a dead server.
    assert "kaleido found no Chrome or Chromium" in said and notebook.INSTALL_BROWSER in said, said
    assert len(said.splitlines()) == 1, said
    assert result["seconds"] < notebook.TRIAL_S / 2, result  # seconds, not a trial's bound and never a hang


def test_a_browser_that_never_answers_costs_the_trial_bound_and_is_killed(tmp_path):
    """A browser that starts and never answers kaleido (a stub here) holds the setup TRIAL_S, then the trial is
    killed with the browser it started, and the figures fall back to plotly.js."""
    pid_file = tmp_path / "browser.pid"
    stub = tmp_path / "bin" / "chromium"
    stub.parent.mkdir()
    stub.write_text(f"#!/bin/sh\necho $$ > {pid_file}\nexec sleep 600\n")
    stub.chmod(0o755)
    trial_s = 3.0
    result, said = run_setup(hidden_browser(tmp_path, browser_path=stub), trial_s=trial_s)
    assert result["renderer"] == notebook.FALLBACK
    assert f"kaleido could not draw a trial figure with {stub}" in said, said
    assert trial_s <= result["seconds"] < trial_s + 60, result
    assert pid_file.exists(), "kaleido never started the stub browser: the trial tested nothing"
    assert not alive(int(pid_file.read_text())), "the stub browser outlived its trial"


def alive(pid: int, wait_s: float = 10.0) -> bool:
    """Whether `pid` still runs after `wait_s` (a zombie waiting for its reaper counts as gone)."""
    psutil = pytest.importorskip("psutil")
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
        time.sleep(0.2)
    return True


def plots_on_page(page: str) -> tuple[int, int]:
    """(figures plotly.js draws on an nbconvert page, PNG images among its outputs), counted in the lab template's
    markup of each (plotly.js's own source and the page's CSS mention images too, in other words)."""
    cells = page.split("</main>")[0]  # not the widget state after them (tests/test_notebooks.py)
    return cells.count('<div class="plotly-graph-div"'), cells.count('<div class="jp-RenderedImage jp-OutputArea-output')


def figures_notebook(figures: int):
    """A notebook that opens as bebop's do (the setup cell) and then draws `figures` plotly figures, a cell each."""
    nbformat = pytest.importorskip("nbformat")
    figure = "import plotly.graph_objects as go\ngo.Figure(go.Scatter(x=[1, 2], y=[3, 4]))"
    setup = nbformat.v4.new_code_cell("from bebop.plots import notebook\nnotebook.setup()")
    return nbformat.v4.new_notebook(cells=[setup, *(nbformat.v4.new_code_cell(figure) for _ in range(figures))])


def test_nbconvert_renders_a_notebook_without_a_browser_with_every_figure(tmp_path):
    """The README's user without a browser: `jupyter nbconvert --to html --execute` of a notebook that opens as
    bebop's do (its setup) and draws three figures finishes, every figure on the page (nbconvert warns of any it
    cannot show), drawn by plotly.js, and the page says once what to install for PNGs. The five notebooks take the
    same path in tests/test_notebooks.py wherever the suite runs without a browser (CI's first step)."""
    pytest.importorskip("nbconvert")
    path = tmp_path / "three_figures.ipynb"
    pytest.importorskip("nbformat").write(figures_notebook(3), path)
    done = subprocess.run([sys.executable, "-m", "nbconvert", "--to", "html", "--execute", "--output-dir",
                           str(tmp_path / "out"), str(path)], env=hidden_browser(tmp_path), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "is not able to be represented" not in done.stderr, done.stderr[-3000:]  # a figure the page lacks
    page = (tmp_path / "out" / "three_figures.html").read_text(encoding="utf-8")
    assert plots_on_page(page) == (3, 0)
    assert page.count("For PNG figures too") == 1


@pytest.mark.browser
def test_with_a_browser_every_figure_is_a_png(monkeypatch):
    """The other side, after `.ci/install-browser`: the setup chooses kaleido's PNGs, drawn in this kernel."""
    if notebook.browser() is None:
        reason = "no Chrome or Chromium for kaleido (run .ci/install-browser)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    from test_notebooks import cells_showing_a_plot, cells_that_drew, notebook_client, render_html

    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    nb = figures_notebook(2)
    notebook_client(nb, 300).execute()
    assert not any("For PNG figures too" in o.get("text", "") for o in nb.cells[0].outputs), nb.cells[0].outputs
    page = render_html(nb)
    assert cells_that_drew(nb) == cells_showing_a_plot(page) == {1, 2}
    assert plots_on_page(page) == (0, 2)


def test_ci_runs_every_browser_marked_module_once_it_has_a_browser():
    """.ci/run's second step names the browser-marked modules instead of collecting the whole suite again: a module
    that gains a browser test must be named there, or CI would never run that test with a browser."""
    marked = marked_modules("browser")
    step = next(line for line in (REPO / ".ci" / "run").read_text().splitlines() if "-m browser" in line)
    assert marked and marked == {word.split("/")[-1] for word in step.split() if word.startswith("tests/")}, step
