"""The step-through notebooks (notebooks/*.ipynb) run top to bottom with the quick profile, within budget.

Each notebook asserts its own headline (the TO entropy law; RS >= TO at T >= 0.7 with both rules lossless;
the TV losses' gradients and acceptance gain; frozen vs online heads during RL; the batch-size regime of the
speedup), so executing it is the test: a regression in `bebop` makes a
cell raise. The notebooks are committed without outputs; `pytest --nbmake notebooks/` runs them as well.

Quick profile, 2 CPU cores shared with seven other busy jobs (2026-12-02, each notebook's own clock): 01 141 s,
02 143 s, 03 297 s, 04 101 s, 05 57 s; 14 minutes for the set with kernels and imports (notebooks/README.md).
BUDGET_S is a hang guard, not a speed test: a notebook is stopped (and the
test fails) only when one cell runs past it. Notebook 02 has twice taken minutes instead of seconds inside a full
suite run with its kernel idle the whole time (never reproduced alone), so the guard is 600 s for every notebook.
Speed belongs in `bebop bench`, not in wall-clock assertions that flake with the host's load.

With `BEBOP_NOTEBOOK_HTML=DIR` each executed notebook is also rendered to DIR/<name>.html (nbconvert), outputs and
plots included: `make docs` and CI build docs/notebooks/ this way (an artifact, never committed), so a reader sees
every plot without running anything.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
BUDGET_S = {  # per-cell hang guard, seconds
    "01_entropy_bounds_acceptance": 600,
    "02_rejection_vs_greedy": 600,
    "03_tv_loss": 600,
    "04_online_vs_pre_rl": 600,
    "05_end_to_end_speedup": 600,
}
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def test_every_notebook_has_a_budget():
    assert NOTEBOOKS, f"no notebooks under {NOTEBOOK_DIR}"
    assert {path.stem for path in NOTEBOOKS} <= set(BUDGET_S), "give every notebook a CI budget in BUDGET_S"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_clean_and_teaches(path: Path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    dirty = [i for i, c in enumerate(code) if c.outputs or c.execution_count is not None]
    assert not dirty, f"{path.name}: code cells {dirty} carry outputs; strip them before committing"
    first, last = nb.cells[0], nb.cells[-1]
    assert first.cell_type == "markdown" and "What you will learn" in first.source and "What it needs" in first.source
    assert last.cell_type == "markdown", f"{path.name} must end with a markdown reading of what was found"
    params = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(params) == 1 and "BEBOP_PROFILE" in params[0].source, f"{path.name}: one `parameters` cell reading BEBOP_PROFILE"
    source = "\n".join(c.source for c in code)
    assert "import bebop" in source or "from bebop" in source
    assert "assert " in nb.cells[-2].source, f"{path.name}: the cell before the conclusion must assert the headline"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_with_the_quick_profile(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BEBOP_PROFILE", "quick")
    monkeypatch.setenv("BEBOP_RUNS", str(tmp_path / "runs"))
    html_dir = os.environ.get("BEBOP_NOTEBOOK_HTML")
    if html_dir:  # the figures as HTML with plotly.js beside their JSON: nbconvert renders no plotly JSON by itself
        monkeypatch.setenv("PLOTLY_RENDERER", "plotly_mimetype+notebook")
    nb = nbformat.read(path, as_version=4)
    budget = BUDGET_S[path.stem]
    client = nbclient.NotebookClient(nb, timeout=budget, kernel_name="python3",
                                     resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    # Raises CellExecutionError (with the failing cell's traceback) on any error, or a timeout past the budget.
    client.execute()
    if html_dir:
        render_html(nb, Path(html_dir) / f"{path.stem}.html")
    runs = [p for p in (tmp_path / "runs").rglob("meta.json")]
    assert runs, f"{path.name} wrote no run directory for the dashboard under BEBOP_RUNS"
    kinds = {json.loads(p.read_text())["kind"] for p in runs}
    assert kinds <= {"eval-mtp", "train-mtp", "rl"}, kinds


def render_html(nb, out: Path) -> None:
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(body, encoding="utf-8")


def test_render_html_keeps_outputs_and_plots(tmp_path, monkeypatch):
    pytest.importorskip("nbconvert")
    monkeypatch.setenv("PLOTLY_RENDERER", "plotly_mimetype+notebook")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import plotly.graph_objects as go\ngo.Figure(go.Scatter(x=[1, 2], y=[3, 4]))")])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    render_html(nb, tmp_path / "docs" / "x.html")
    page = (tmp_path / "docs" / "x.html").read_text()
    assert "Plotly.newPlot" in page and "Figure" in page  # the (highlighted) code and a drawn figure
