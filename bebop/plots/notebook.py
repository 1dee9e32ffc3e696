"""What every notebook sets up before it draws: a Plotly renderer that each viewer can show, and where its runs go.

Renderer. Inside a Jupyter kernel Plotly's default is `plotly_mimetype` alone: JupyterLab and VS Code draw it, but
`jupyter nbconvert --to html` cannot (it warns that the mimetype "is not able to be represented" and leaves the
cell empty) and GitHub cannot either. So each figure goes out as the Plotly mimetype (interactive in JupyterLab and
VS Code) plus a static PNG (what nbconvert's HTML and GitHub show). The PNG is drawn by kaleido in the machine's
Chrome or Chromium, through one kaleido server kept for the kernel's life: about 2 s to start, then 0.1-0.2 s per
figure, instead of a browser started per figure. No `text/html` goes in the bundle: GitHub prefers HTML to PNG and
strips its scripts, which would leave an empty box. Without kaleido or a browser the fallback is `notebook`, which
embeds plotly.js itself (interactive and offline in nbconvert's HTML; blank on GitHub). A PLOTLY_RENDERER set by
the user wins over both.

Runs. A notebook opened in Jupyter runs in `notebooks/`, so a relative `runs` would land in `notebooks/runs/`,
where `bebop dashboard` (started from the repository, reading ./runs or $BEBOP_RUNS) never looks.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

STATIC = "plotly_mimetype+png"  # interactive where a frontend draws Plotly, a PNG everywhere else
FALLBACK = "plotly_mimetype+notebook"  # no PNG possible: plotly.js embedded in the output instead
PNG_WIDTH, PNG_SCALE = 900, 1.5  # the notebook column's width; 1.5x for sharp text on high-density screens


def use_renderer() -> str:
    """Set (and return) the renderer of every figure this kernel shows; see the module docstring for the choice."""
    if os.environ.get("PLOTLY_RENDERER"):
        return pio.renderers.default  # Plotly read it at import: the user's choice
    # Plotly passes kaleido its (empty) options even when a server runs, and kaleido then warns under every figure.
    warnings.filterwarnings("ignore", message="The kopts argument is ignored", category=UserWarning)
    pio.renderers.default = STATIC if _kaleido_draws() else FALLBACK
    png = pio.renderers["png"]
    png.width, png.scale = PNG_WIDTH, PNG_SCALE
    return pio.renderers.default


def _kaleido_draws() -> bool:
    """Whether kaleido can draw a PNG here: the package, a browser it finds, and one trial figure."""
    if importlib.util.find_spec("kaleido") is None:
        return False
    import kaleido

    try:
        # mathjax=False: kaleido's page would otherwise load MathJax from a CDN, which fails offline (no figure
        # here uses LaTeX)
        kaleido.start_sync_server(silence_warnings=True, mathjax=False)
        pio.to_image(go.Figure(), format="png", width=20, height=20)
        return True
    except Exception:  # no Chrome/Chromium (kaleido.errors.ChromeNotFoundError), or it would not start
        kaleido.stop_sync_server(silence_warnings=True)
        return False


def repository(start: Path | None = None) -> Path | None:
    """The bebop checkout holding `start` (default: the working directory): the first folder up with both
    pyproject.toml and notebooks/; None outside one (an installed package, a copied notebook)."""
    here = (start or Path.cwd()).resolve()
    return next((d for d in (here, *here.parents) if (d / "pyproject.toml").is_file() and (d / "notebooks").is_dir()),
                None)


def runs_root(runs: str | os.PathLike | None = None) -> Path:
    """Where a notebook writes its run directories: `runs` (a notebook passes $BEBOP_RUNS), else the repository's
    runs/ (what `bebop dashboard` opens from the repository root), else ./runs."""
    if runs:
        return Path(runs)
    repo = repository()
    return (repo or Path.cwd()) / "runs"


def shown(path: str | os.PathLike) -> str:
    """A path as a rendered page should print it: under $BEBOP_RUNS as `$BEBOP_RUNS/...`, inside the repository
    relative to it, else whole. A page rendered in a temporary folder then names no temporary path."""
    if not Path(path).exists():
        return str(path)  # a name, not a folder here (a hub id, "smollm2")
    path = Path(path).resolve()
    env = os.environ.get("BEBOP_RUNS")
    bases = [("$BEBOP_RUNS", Path(env).resolve())] if env else []
    repo = repository()
    bases += [("", repo)] if repo else []
    for name, base in bases:
        if path == base or base in path.parents:
            relative = path.relative_to(base).as_posix()
            return f"{name}/{relative}" if name else relative
    return str(path)


def setup(runs: str | os.PathLike | None = None) -> Path:
    """A notebook's first call: the renderer set, and the runs root returned (see `runs_root`)."""
    use_renderer()
    return runs_root(runs)
