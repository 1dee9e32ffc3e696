"""What every notebook sets up before it draws: a Plotly renderer that each viewer can show, and where its runs go.

Renderer. Inside a Jupyter kernel Plotly's default is `plotly_mimetype` alone: JupyterLab and VS Code draw it, but
`jupyter nbconvert --to html` cannot (it warns that the mimetype "is not able to be represented" and leaves the
cell empty) and GitHub cannot either. So each figure goes out as the Plotly mimetype (interactive in JupyterLab and
VS Code) plus a static PNG (what nbconvert's HTML and GitHub show). The PNG is drawn by kaleido in the machine's
Chrome or Chromium, through one kaleido server kept for the kernel's life: about 2 s to start, then 0.1-0.2 s per
figure, instead of a browser started per figure. No `text/html` goes in the bundle: GitHub prefers HTML to PNG and
strips its scripts, which would leave an empty box. Without kaleido or a browser the fallback is `notebook`, which
embeds plotly.js itself (interactive and offline in nbconvert's HTML; blank on GitHub), and the setup cell says in
one line what to install for PNGs. A PLOTLY_RENDERER set by the user wins over both.

Never a hang. kaleido's server runs in a thread: when it cannot start a browser that thread dies, and every figure
sent to it then waits forever for an answer (kaleido 1.5). So the browser is looked for first, as choreographer
looks for it (its own download, $BROWSER_PATH, PATH, the usual install paths), which starts nothing; only when one
is there does a trial figure run, in a subprocess killed after TRIAL_S, and then once more in this kernel's server,
waited for at most TRIAL_S.

Runs. A notebook opened in Jupyter runs in `notebooks/`, so a relative `runs` would land in `notebooks/runs/`,
where `bebop dashboard` (started from the repository, reading ./runs or $BEBOP_RUNS) never looks.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

STATIC = "plotly_mimetype+png"  # interactive where a frontend draws Plotly, a PNG everywhere else
FALLBACK = "plotly_mimetype+notebook"  # no PNG possible: plotly.js embedded in the output instead
PNG_WIDTH, PNG_SCALE = 900, 1.5  # the notebook column's width; 1.5x for sharp text on high-density screens
TRIAL_S = 60.0  # a trial figure's bound, far above a browser's start (seconds) even on a busy machine
INSTALL_BROWSER = "install Chrome or Chromium (Debian/Ubuntu: sudo apt-get install chromium) or run kaleido_get_chrome"
_TRIAL = ("import kaleido; kaleido.calc_fig_sync({'data': [], 'layout': {}}, "
          "opts={'format': 'png', 'width': 20, 'height': 20}, kopts={'mathjax': False})")


def use_renderer() -> str:
    """Set (and return) the renderer of every figure this kernel shows; see the module docstring for the choice."""
    if os.environ.get("PLOTLY_RENDERER"):
        return pio.renderers.default  # Plotly read it at import: the user's choice
    # Plotly passes kaleido its (empty) options even when a server runs, and kaleido then warns under every figure.
    warnings.filterwarnings("ignore", message="The kopts argument is ignored", category=UserWarning)
    missing = _png_missing()
    if missing:
        print(f"Figures embed plotly.js (interactive here and in nbconvert's HTML, blank on GitHub): {missing}. "
              f"For PNG figures too: {INSTALL_BROWSER}, then restart the kernel.")
    pio.renderers.default = FALLBACK if missing else STATIC
    png = pio.renderers["png"]
    png.width, png.scale = PNG_WIDTH, PNG_SCALE
    return pio.renderers.default


def browser() -> str | None:
    """The Chrome or Chromium kaleido would start, found as choreographer finds it, without starting anything;
    None when there is none (a path that names no executable file counts as none)."""
    if importlib.util.find_spec("choreographer") is None:
        return None
    from choreographer.browsers import Chromium

    path = Chromium.find_browser(skip_local=False)
    return path if path and Path(path).is_file() and os.access(path, os.X_OK) else None


def _png_missing() -> str | None:
    """What keeps kaleido from drawing PNGs here, in words (None: nothing, and its server is running)."""
    if importlib.util.find_spec("kaleido") is None:
        return "kaleido is not installed (pip install kaleido)"
    path = browser()
    if path is None:
        return "kaleido found no Chrome or Chromium"
    if not _draws_in_a_subprocess():
        return f"kaleido could not draw a trial figure with {path} (within {TRIAL_S:.0f} s)"
    if not _draws_in_this_kernel():
        return f"kaleido's server could not draw a trial figure with {path} (within {TRIAL_S:.0f} s)"
    return None


def _draws_in_a_subprocess() -> bool:
    """One tiny figure drawn by kaleido in a subprocess: a browser that never answers costs TRIAL_S, then the
    trial is killed with the processes it started."""
    trial = subprocess.Popen([sys.executable, "-c", _TRIAL], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        return trial.wait(timeout=TRIAL_S) == 0
    except subprocess.TimeoutExpired:
        _kill_with_children(trial)
        return False


def _kill_with_children(process: subprocess.Popen) -> None:
    """Kill a process and its descendants: choreographer starts the browser in a session of its own, which killing
    a process group would miss. psutil comes with every Jupyter kernel (ipykernel needs it); without it only the
    process itself is killed, and the browser, its stdin closed, is left to exit."""
    try:
        import psutil

        children = psutil.Process(process.pid).children(recursive=True)
    except Exception:  # no psutil, or the process is gone already
        children = []
    process.kill()
    for child in children:
        try:
            child.kill()
        except psutil.Error:  # exited meanwhile
            pass
    process.wait()


def _draws_in_this_kernel() -> bool:
    """Start this kernel's kaleido server and draw one tiny figure through it, waiting at most TRIAL_S: the thread
    waiting on a server that died is abandoned (a daemon), never joined."""
    import kaleido

    # mathjax=False: kaleido's page would otherwise load MathJax from a CDN, which fails offline (no figure here
    # uses LaTeX)
    kaleido.start_sync_server(silence_warnings=True, mathjax=False)
    drawn: list[bool] = []

    def draw() -> None:
        try:
            pio.to_image(go.Figure(), format="png", width=20, height=20)
            drawn.append(True)
        except Exception:  # the browser would not start, or failed the figure
            kaleido.stop_sync_server(silence_warnings=True)

    waiter = threading.Thread(target=draw, name="bebop-kaleido-trial", daemon=True)
    waiter.start()
    waiter.join(TRIAL_S)
    return bool(drawn)


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
