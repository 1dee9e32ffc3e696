"""bebop.plots.notebook (the renderer and runs root every notebook sets up) and the colours a notebook's figures share."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import plotly.io as pio
import pytest

from bebop import plots
from bebop.plots import notebook

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def renderer():
    saved = pio.renderers.default
    yield
    pio.renderers.default = saved


def test_runs_land_in_the_repositorys_runs_where_the_dashboard_looks(monkeypatch):
    monkeypatch.chdir(REPO / "notebooks")  # where Jupyter runs a notebook
    assert notebook.runs_root() == REPO / "runs"  # not notebooks/runs
    assert notebook.runs_root("/elsewhere/runs") == Path("/elsewhere/runs")  # $BEBOP_RUNS, passed by the notebook


def test_outside_a_checkout_runs_land_beside_the_notebook(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert notebook.repository() is None
    assert notebook.runs_root() == tmp_path / "runs"


def test_shown_names_no_temporary_path(tmp_path, monkeypatch):
    run = tmp_path / "runs" / "nb01"
    run.mkdir(parents=True)
    monkeypatch.setenv("BEBOP_RUNS", str(tmp_path / "runs"))
    assert notebook.shown(run) == "$BEBOP_RUNS/nb01"
    monkeypatch.delenv("BEBOP_RUNS")
    monkeypatch.chdir(REPO / "notebooks")
    assert notebook.shown(REPO / "bebop" / "assets") == "bebop/assets"
    assert notebook.shown("smollm2") == "smollm2"  # a name, not a folder


def test_the_users_plotly_renderer_wins(monkeypatch, renderer):
    monkeypatch.setenv("PLOTLY_RENDERER", "json")
    pio.renderers.default = "json"
    assert notebook.use_renderer() == "json"


def test_without_kaleido_the_figures_embed_plotlyjs_instead_of_a_png(monkeypatch, renderer):
    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "kaleido" else real(name, *a))
    assert notebook.use_renderer() == notebook.FALLBACK == "plotly_mimetype+notebook"


def test_a_series_keeps_its_colour_across_figures_that_name_it_differently():
    keys = [(head, method) for head in ("ce", "e2e_tv", "tv") for method in ("rs", "to")]
    law = plots.series_colors(keys, label="engine · {head} {method}")
    sweep = plots.series_colors(keys)
    assert law["engine · ce rs"] == sweep["ce · rs"] and law["engine · tv to"] == sweep["tv · to"]
    assert len(set(sweep.values())) == len(keys)  # six series, six colours
    assert sweep["ce · rs"] == plots.PAIRED[0][0] and sweep["ce · to"] == plots.PAIRED[0][1]  # one hue per head
