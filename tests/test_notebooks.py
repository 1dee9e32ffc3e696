"""The step-through notebooks (notebooks/*.ipynb) run top to bottom with the quick profile, within budget.

Each notebook asserts its own headline (the TO entropy law; RS >= TO at T >= 0.7 with both rules lossless;
the TV losses' gradients and acceptance gain; frozen vs online heads during RL; the batch-size regime of the
speedup), so executing it is the test: a regression in `bebop` makes a
cell raise. The notebooks are committed without outputs; `pytest --nbmake notebooks/` runs them as well.

Quick profile, each notebook's own clock (notebooks/README.md): 01 23 s, 02 18 s, 03 53 s, 04 23 s, 05 15 s on 2
CPU cores beside a training job (2026-12-05), 3 minutes for the set with kernels and imports; 14 minutes with seven
busy jobs beside it (2026-12-02).
BUDGET_S is a hang guard, not a speed test: a notebook is stopped (and the
test fails) only when one cell runs past it. Notebook 02 has twice taken minutes instead of seconds inside a full
suite run with its kernel idle the whole time (never reproduced alone), so the guard is 600 s for every notebook.
Speed belongs in `bebop bench`, not in wall-clock assertions that flake with the host's load.

The stall: inside full suite runs, notebook 02 (the one with an `ipywidgets.interact` cell) sometimes sat out the whole
guard with its kernel idle: nbclient waits for each cell's execute_reply in one zmq.asyncio poll as long as the
budget, and a wakeup that poll misses is only noticed when it times out (nbclient #312, nbconvert #2029, pyzmq #2173
report the same with widget cells). `SlicedPollChannel` polls in half-second slices instead, so a missed wakeup costs
half a second; and the test's pytest timeout sits above the per-cell guard, so a real hang fails as nbclient's
CellTimeoutError naming the cell instead of a bare pytest-timeout.

Every executed notebook is rendered to HTML as `jupyter nbconvert --to html --execute` renders it, with the renderer
the notebook sets itself (`bebop.plots.notebook`, no PLOTLY_RENDERER from here), and each code cell that drew a
figure must show it on the page: the defect this guards against is a page with every plot missing. With
`BEBOP_NOTEBOOK_HTML=DIR` the pages are also written to DIR/<name>.html: `make docs` and CI build docs/notebooks/
this way (an artifact, never committed), so a reader sees every plot without running anything.
"""

from __future__ import annotations

import ast
import asyncio
import json
import os
import re
import time
import warnings
from pathlib import Path
from queue import Empty

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
import zmq  # noqa: E402
import zmq.asyncio  # noqa: E402
from jupyter_client.asynchronous import AsyncKernelClient  # noqa: E402 (nbclient's own dependency)
from jupyter_client.channels import AsyncZMQSocketChannel  # noqa: E402
from jupyter_client.manager import AsyncKernelManager  # noqa: E402
from jupyter_client.session import Session  # noqa: E402
from traitlets import Type, default  # noqa: E402

NOTEBOOK_DIR = Path(__file__).resolve().parents[1] / "notebooks"
BUDGET_S = {  # per-cell hang guard, seconds
    "01_entropy_bounds_acceptance": 600,
    "02_rejection_vs_greedy": 600,
    "03_tv_loss": 600,
    "04_online_vs_pre_rl": 600,
    "05_end_to_end_speedup": 600,
}
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
POLL_SLICE_S = 0.5


class SlicedPollChannel(AsyncZMQSocketChannel):
    """A kernel channel that waits for a message in short polls, each of which checks the socket afresh."""

    late_messages = 0  # messages noticed only as a slice ended: missed wakeups (or, rarely, a message just then)

    async def get_msg(self, timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = POLL_SLICE_S if deadline is None else max(0.0, min(POLL_SLICE_S, deadline - time.monotonic()))
            started = time.monotonic()
            if await self.socket.poll(int(left * 1000)):
                if left > 0 and time.monotonic() - started >= left:
                    SlicedPollChannel.late_messages += 1
                return await self._recv()
            if deadline is not None and time.monotonic() >= deadline:
                raise Empty


class SlicedPollKernelClient(AsyncKernelClient):
    shell_channel_class = Type(SlicedPollChannel)
    iopub_channel_class = Type(SlicedPollChannel)


class SlicedPollKernelManager(AsyncKernelManager):
    @default("client_factory")
    def _sliced_client(self) -> type:
        return SlicedPollKernelClient


def notebook_client(nb, budget_s: float, **kwargs) -> nbclient.NotebookClient:
    return nbclient.NotebookClient(nb, timeout=budget_s, kernel_name="python3",
                                   kernel_manager_class=SlicedPollKernelManager, **kwargs)


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
    math = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and "$" in c.source]
    assert not math, f"{path.name}: markdown cells {math} hold $-math, raw LaTeX wherever MathJax cannot load (offline " \
        "HTML): write formulas as text (α<sub>TO</sub> ≤ max p)"
    assert "notebook.setup(" in source, f"{path.name}: call bebop.plots.notebook.setup (renderer and runs root)"
    headline = nb.cells[-2].source
    assert "assert " in headline or "claims.check(" in headline, (
        f"{path.name}: the cell before the conclusion must assert (or check, `bebop.claims`) the headline")


REAL_PROFILE = {"01_entropy_bounds_acceptance", "02_rejection_vs_greedy", "03_tv_loss", "04_online_vs_pre_rl",
                "05_end_to_end_speedup"}


def parameters_and_profiles(path: Path) -> tuple[dict, dict]:
    """(the names the notebook's parameters cell sets, its PROFILES) as the current environment makes them, without
    running the rest of the notebook."""
    nb = nbformat.read(path, as_version=4)
    names: dict = {}
    exec(next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", [])), names)
    assignment = next(node for c in nb.cells if c.cell_type == "code" for node in ast.parse(c.source).body
                      if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PROFILES")
    return names, eval(compile(ast.Expression(assignment.value), path.name, "eval"), names)


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.stem in REAL_PROFILE], ids=lambda p: p.stem)
def test_real_profile_runs_smollm2_and_reports_its_claims(path: Path, monkeypatch: pytest.MonkeyPatch):
    """BEBOP_PROFILE=real (run by hand, minutes to tens of minutes: notebooks/README.md) points the notebook at SmolLM2,
    sizes every setting the quick profile has, and checks its findings through `Claims` (reported, not raised)."""
    monkeypatch.setenv("BEBOP_PROFILE", "real")
    for name in ("BEBOP_POLICY", "BEBOP_HEADS", "BEBOP_THREADS"):
        monkeypatch.delenv(name, raising=False)
    names, profiles = parameters_and_profiles(path)
    assert names["policy_path"] == "smollm2" and names["threads"] == 0, (names["policy_path"], names["threads"])
    assert profiles["real"].keys() == profiles["quick"].keys(), f"{path.name}: the real profile must size every setting"
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "Claims(strict=not real)" in source and "claims.summary()" in source


def test_tv_loss_profiles_make_valid_train_and_eval_configs():
    """Notebook 03 builds a TrainMTPConfig and an EvalMTPConfig from each profile's settings: a setting out of range
    fails here in a second, not after a SmolLM2 run has trained for minutes (CI runs only the quick profile)."""
    from bebop.heads.config import TrainMTPConfig
    from bebop.heads.evaluate import EvalMTPConfig

    _, profiles = parameters_and_profiles(NOTEBOOK_DIR / "03_tv_loss.ipynb")
    for settings in profiles.values():
        train = TrainMTPConfig(**settings["train"])
        EvalMTPConfig(temperatures=(train.temperature,), gamma=3, **settings["eval"])


@pytest.mark.slow
@pytest.mark.timeout(max(BUDGET_S.values()) + 300)  # above the per-cell guard: a hang names its cell
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_with_the_quick_profile(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              pytestconfig: pytest.Config):
    monkeypatch.setenv("BEBOP_PROFILE", "quick")
    monkeypatch.setenv("BEBOP_RUNS", str(tmp_path / "runs"))
    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)  # the notebook's own choice, as a user's nbconvert gets it
    monkeypatch.delenv("BEBOP_REFERENCE_RUNS", raising=False)  # the reference runs bebop ships, as a reader gets them
    nb = nbformat.read(path, as_version=4)
    budget = BUDGET_S[path.stem]
    client = notebook_client(nb, budget, resources={"metadata": {"path": str(NOTEBOOK_DIR)}})
    late = SlicedPollChannel.late_messages
    # Raises CellExecutionError (with the failing cell's traceback) on any error, or a timeout past the budget.
    client.execute()
    if SlicedPollChannel.late_messages > late:  # the stall this client works around (module docstring): say so
        warnings.warn(f"{path.name}: {SlicedPollChannel.late_messages - late} kernel messages were noticed only when "
                      "a poll slice ended (missed zmq wakeups, or messages that came just then)")
    page = render_html(nb)
    drew, shown = cells_that_drew(nb), cells_showing_a_plot(page)
    assert drew, f"{path.name} drew no figure"
    assert shown == drew, f"{path.name}: code cells {sorted(drew - shown)} drew a figure the HTML page does not show"
    assert str(tmp_path) not in page, f"{path.name}: the page prints a temporary path (use notebook.shown)"
    html_dir = os.environ.get("BEBOP_NOTEBOOK_HTML")
    if html_dir:  # a relative DIR means where pytest was started, not this test's own directory (tests/conftest.py)
        out = pytestconfig.invocation_params.dir / html_dir / f"{path.stem}.html"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page, encoding="utf-8")
    runs = [p for p in (tmp_path / "runs").rglob("meta.json")]
    assert runs, f"{path.name} wrote no run directory for the dashboard under BEBOP_RUNS"
    kinds = {json.loads(p.read_text())["kind"] for p in runs}
    assert kinds <= {"eval-mtp", "train-mtp", "rl"}, kinds


REFERENCE_SECTION = {"01_entropy_bounds_acceptance": "## 5. On a real GRPO run (the reference runs)",
                     "04_online_vs_pre_rl": "## 4. On a real GRPO run (the reference runs)"}


def reference_section(path: Path):
    """The notebook's last section alone, from its heading: it imports what it reads, so it runs without the rest."""
    nb = nbformat.read(path, as_version=4)
    start = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## ")][-1]
    assert nb.cells[start].source.startswith(REFERENCE_SECTION[path.stem]), f"{path.name} ends with another section"
    nb.cells = nb.cells[start:]
    return nb


@pytest.mark.parametrize("shipped", [True, False], ids=["shipped", "none-shipped"])
@pytest.mark.parametrize("stem", sorted(REFERENCE_SECTION))
def test_the_reference_run_section_reads_the_shipped_runs(stem, shipped, tmp_path, monkeypatch):
    """Notebooks 01 and 04 end by reading the reference runs bebop ships, under every profile and computing nothing:
    here the section runs alone on the stand-in (tests/reference_run.py) and draws the law (01) or each head's
    accept length over the steps (04) for every head and rule, its table, its reading from `bebop.claims` and how to
    make the run again; with none shipped it says so and draws nothing."""
    from reference_run import COMMIT, NAME, packed_root

    monkeypatch.setenv("BEBOP_REFERENCE_RUNS", str(packed_root() if shipped else tmp_path / "none"))
    nb = reference_section(NOTEBOOK_DIR / f"{stem}.ipynb")
    notebook_client(nb, 300, resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    text = "".join(o.get("text", "") for o in outputs)
    markdown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    figures = [o["data"][PLOTLY_MIME] for o in outputs if PLOTLY_MIME in o.get("data", {})]
    if not shipped:
        assert markdown.startswith("**No reference run is shipped with this bebop**") and not figures and not text
        return
    assert [f["layout"]["title"]["text"].split(":")[0] for f in figures] == [NAME]
    legend = [t["name"] for t in figures[0]["data"] if t.get("showlegend", True)]  # 01's names carry the fit
    series = {name.split(" · slope")[0].split(" · too few")[0] for name in legend}
    assert series == {f"{head} · {rule}" for head in ("rollout", "ce", "online-tv:e2e_tv", "online-ce:e2e_tv")
                      for rule in ("rs", "to")}
    assert any("text/html" in o.get("data", {}) for o in outputs)  # the shadow_summary table
    assert markdown.startswith("**What this run found**") and f"{NAME}: " in markdown
    assert "made by `bebop rl " in text and f"git checkout {COMMIT}" in text and "scripts/pack-reference-run " in text


def last_section_markdown(stem: str, heading: str, shipped: bool, tmp_path, monkeypatch) -> str:
    """The markdown that a notebook's last section (its heading checked) writes when run on its own, over the test
    reference run or over none."""
    from reference_run import packed_root

    monkeypatch.setenv("BEBOP_REFERENCE_RUNS", str(packed_root() if shipped else tmp_path / "none"))
    nb = nbformat.read(NOTEBOOK_DIR / f"{stem}.ipynb", as_version=4)
    start = [i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("## ")][-1]
    assert nb.cells[start].source.startswith(heading)
    nb.cells = nb.cells[start:]
    notebook_client(nb, 300, resources={"metadata": {"path": str(NOTEBOOK_DIR)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    markdown = "".join(o.get("data", {}).get("text/markdown", "") for o in outputs)
    assert shipped or markdown.startswith("**No reference run is shipped with this bebop**")
    return markdown


@pytest.mark.parametrize("shipped", [True, False], ids=["shipped", "none-shipped"])
def test_notebook_02_reads_rs_against_to_from_the_reference_runs(shipped, tmp_path, monkeypatch):
    """Notebook 02 ends with finding 2 over a real GRPO run: for each shipped reference run, its head's RS and TO
    slopes over the steps and their ratio with an interval (`rule_slope_ratio`), read and reported, never raised."""
    from reference_run import NAME

    markdown = last_section_markdown("02_rejection_vs_greedy", "## 5. RS against TO along a real GRPO run (the "
                                     "reference runs)", shipped, tmp_path, monkeypatch)
    if shipped:
        assert f"{NAME} (head " in markdown and "RS's slope over the RL steps is flatter than TO's" in markdown
        assert "ratio" in markdown and "accept length per nat" in markdown


@pytest.mark.parametrize("shipped", [True, False], ids=["shipped", "none-shipped"])
def test_notebook_03_reads_tv_against_ce_from_the_reference_runs(shipped, tmp_path, monkeypatch):
    """Notebook 03 ends with finding 3 over a real GRPO run: for each shipped reference run that scored the CE head
    beside its e2e TV rollout head, the two heads under RS compared along the steps with paired intervals
    (`paired_slopes`), read and reported, never raised."""
    from reference_run import NAME

    markdown = last_section_markdown("03_tv_loss", "## 5. TV against CE along a real GRPO run (the reference runs)",
                                     shipped, tmp_path, monkeypatch)
    if shipped:
        assert f"{NAME}: under RS the e2e TV head's line over the RL steps is flatter" in markdown
        assert "TV - CE accept length" in markdown and "accept length per nat" in markdown


def render_html(nb) -> str:
    """The page `jupyter nbconvert --to html` makes of an executed notebook (its default, the lab template)."""
    from nbconvert import HTMLExporter

    body, _ = HTMLExporter().from_notebook_node(nb)
    return body


PLOTLY_MIME = "application/vnd.plotly.v1+json"
# A figure on the page: kaleido's PNG (the notebooks' renderer) or plotly.js drawing it in place (the fallback).
PLOT_ON_PAGE = re.compile(r'<img[^>]+src="data:image/png;base64|Plotly\.newPlot\(')


def cells_that_drew(nb) -> set[int]:
    """Indices of the cells with a Plotly figure among their outputs (every renderer puts its JSON there)."""
    return {i for i, c in enumerate(nb.cells) if c.cell_type == "code"
            and any(PLOTLY_MIME in o.get("data", {}) for o in c.get("outputs", []))}


def cells_showing_a_plot(page: str) -> set[int]:
    """Indices of the cells whose part of an nbconvert page shows a figure (the lab template: one div per cell). The
    page's widget state, after its cells, is left out: an ipywidgets output's captured figures (notebook 02's
    slider) are there, JSON-escaped, and drawn with plotly.js they too say `Plotly.newPlot(`."""
    cells = re.split(r'<div[^>]*class="jp-Cell ', page.split("</main>")[0])[1:]
    return {i for i, html in enumerate(cells) if PLOT_ON_PAGE.search(html)}


def test_the_notebooks_renderer_puts_every_figure_on_an_nbconvert_page(tmp_path, monkeypatch):
    """The notebooks' setup in a real kernel: with Plotly's own default (the mimetype alone) the page has no plot."""
    pytest.importorskip("nbconvert")
    monkeypatch.delenv("PLOTLY_RENDERER", raising=False)
    monkeypatch.chdir(tmp_path)
    figure = "import plotly.graph_objects as go\ngo.Figure(go.Scatter(x=[1, 2], y=[3, 4]))"
    for setup, shows in (("from bebop.plots import notebook\nnotebook.setup()", True), ("", False)):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("a figure"),
                                             nbformat.v4.new_code_cell(setup), nbformat.v4.new_code_cell(figure)])
        notebook_client(nb, 120).execute()
        assert cells_that_drew(nb) == {2}
        assert cells_showing_a_plot(render_html(nb)) == ({2} if shows else set()), setup or "Plotly's default"


class DeafSocket(zmq.asyncio.Socket):
    """A zmq.asyncio socket whose poll misses every wakeup: it notices a waiting message only when its timeout ends."""

    async def poll(self, timeout: int | None = None, flags: int = zmq.POLLIN) -> int:
        await asyncio.sleep((timeout or 0) / 1000)
        return await super().poll(0, flags)


def test_sliced_poll_channel_notices_a_waiting_message_despite_missed_wakeups():
    async def run() -> tuple[dict, float, float]:
        ctx = zmq.asyncio.Context()
        kernel_side, client_side = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR, socket_class=DeafSocket)
        kernel_side.bind("inproc://shell")
        client_side.connect("inproc://shell")
        session = Session()
        channel = SlicedPollChannel(client_side, session)
        start = time.monotonic()
        with pytest.raises(Empty):
            await channel.get_msg(timeout=1.2)
        quiet_s = time.monotonic() - start
        session.send(kernel_side, "execute_reply", {"status": "ok"})
        start = time.monotonic()
        msg = await channel.get_msg(timeout=60)  # one 60 s poll on this socket would take the full minute
        waited_s = time.monotonic() - start
        ctx.destroy(linger=0)
        return msg, quiet_s, waited_s

    msg, quiet_s, waited_s = asyncio.run(run())
    assert msg["msg_type"] == "execute_reply" and msg["content"] == {"status": "ok"}
    assert 1.2 <= quiet_s < 30, "Empty must come at the deadline, not before it and not a slice series later"
    assert waited_s < 30, f"the waiting message took {waited_s:.1f} s to be noticed"
    assert SlicedPollChannel.late_messages >= 1


def test_notebook_client_polls_in_slices():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1")])
    client = notebook_client(nb, 120)
    channels = []
    client.on_cell_executed = lambda **_: channels.extend([client.kc.shell_channel, client.kc.iopub_channel])
    client.execute()
    assert nb.cells[0].outputs[0]["data"]["text/plain"] == "2"
    assert len(channels) == 2 and all(isinstance(c, SlicedPollChannel) for c in channels), channels
