"""The real thing: the README's dashboard command in headless Chromium, following a run that is still growing.

Needs Debian's chromium (`.ci/install-browser`) and the `playwright` package (never `playwright install`:
the system browser is driven directly). Skipped with a reason when they are missing on a laptop; in CI
(CI=true) their absence is a failure. Leaves a screenshot in artifacts/dashboard.png, and one of the Live page over
real one-step `bebop rl` runs in artifacts/live.png (CI artifacts). The README's picture is taken from a real demo by
scripts/readme-picture (`make docs`, `make docs-images`), never by a test.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from bebop.commands import dashboard
from bebop.rl.synthetic import SyntheticRun, preview_configs, write_synthetic_run

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = REPO / "artifacts" / "dashboard.png"
PICTURE = REPO / "artifacts" / "live.png"  # the Live page over one-step runs: a CI artifact, not the README's
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
# Markers of the growing run drawn in the acceptance-vs-entropy chart, counted in the chart's SVG: what the
# user sees (-1: the chart is not on the page yet).
LIVE_POINTS_JS = """() => {
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const title = (gd.layout && gd.layout.title && gd.layout.title.text) || '';
    if (!title.includes('Acceptance vs entropy')) continue;
    const index = (gd.data || []).findIndex(t => t.mode === 'markers' && t.legendgroup === 'live');
    const traces = gd.querySelectorAll('.scatterlayer .trace');
    return index < 0 || !traces[index] ? 0 : traces[index].querySelectorAll('path.point').length;
  }
  return -1;
}"""


# The runs drawn in the acceptance-vs-entropy chart (its marker traces' legend groups).
LAW_SERIES_JS = """() => {
  for (const gd of document.querySelectorAll('.js-plotly-plot')) {
    const title = (gd.layout && gd.layout.title && gd.layout.title.text) || '';
    if (title.includes('Acceptance vs entropy'))
      return (gd.data || []).filter(t => t.mode === 'markers').map(t => t.legendgroup);
  }
  return [];
}"""


def _require_browser() -> None:
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (run .ci/install-browser)")
    if importlib.util.find_spec("playwright") is None:
        missing.append("the playwright package (pip install playwright)")
    if missing:
        reason = "headless browser test needs " + " and ".join(missing)
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(port: int, server: subprocess.Popen, log: Path, timeout: float = 90.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"dashboard exited with {server.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.read().strip() == b"ok":
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"dashboard not healthy after {timeout} s:\n{log.read_text()[-3000:]}")


def _measured(run_dir: Path) -> None:
    """A synthetic run marked as a measured one: this test follows runs as the pages show real ones (how synthetic
    runs are marked and kept apart: tests/test_app_claims.py)."""
    meta = json.loads((run_dir / "meta.json").read_text())
    meta.pop("synthetic", None)
    (run_dir / "meta.json").write_text(json.dumps(meta))


def _grow(run: SyntheticRun, stop: threading.Event, every: float) -> None:
    while not stop.wait(every):
        run.advance()


@contextlib.contextmanager
def _dashboard(root: Path, tmp_path: Path):
    """The README's dashboard command over `root`, serving on a free port until the block ends."""
    port, log = _free_port(), tmp_path / f"server-{root.name}.log"
    parser = argparse.ArgumentParser()
    dashboard.add_arguments(parser)
    args = parser.parse_args(["--runs", str(root), "--port", str(port)])
    command = dashboard.streamlit_command(args, script=REPO / "app" / "main.py")  # the README's entry
    with open(log, "wb") as out:
        server = subprocess.Popen(command, cwd=tmp_path, env={**os.environ, "BEBOP_RUNS": str(root)},
                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_healthy(port, server, log)
        yield port
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@contextlib.contextmanager
def _browser(tmp_path: Path, height: int = 2300):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1440, "height": height})
        try:
            yield browser.new_page()
        finally:
            browser.close()


# The sidebar as the user reads it: the selected runs' chips and the line of their states.
SIDEBAR_JS = """() => {
  const side = document.querySelector('section[data-testid="stSidebar"]');
  if (!side) return {chips: [], text: ''};
  const chips = [...side.querySelectorAll('span[data-tag] > span[title]')].map(s => s.textContent);
  return {chips, text: side.innerText};
}"""


@pytest.mark.timeout(300)
def test_dashboard_follows_a_growing_run_and_finds_new_ones(tmp_path):
    """Without a reload: a growing run's new points are drawn, a run started after the page opened appears (in the
    sidebar's selection and on the chart), and a run that finishes reads finished."""
    _require_browser()
    root = tmp_path / "runs"
    for config in preview_configs(steps=40)[1:4]:
        _measured(write_synthetic_run(root / config.name, config))
    live = SyntheticRun(root / "live", replace(preview_configs(steps=200)[3], name="live", seed=11))
    _measured(root / "live")
    live.advance(12)
    stop = threading.Event()
    writer = threading.Thread(target=_grow, args=(live, stop, 0.5), daemon=True)
    late = None
    try:
        with _dashboard(root, tmp_path) as port, _browser(tmp_path) as page:
            page.goto(f"http://127.0.0.1:{port}/live", timeout=60_000)
            page.get_by_text("per RL step", exact=True).click(timeout=90_000)  # a point per step: growth shows
            page.wait_for_function(f"({LIVE_POINTS_JS})() >= 12", timeout=90_000)
            first = page.evaluate(LIVE_POINTS_JS)
            page.evaluate("window.__bebop_same_page = true")  # gone if the page reloads
            writer.start()
            page.wait_for_function(f"({LIVE_POINTS_JS})() >= {first + 3}", timeout=60_000)
            late = SyntheticRun(root / "late", replace(preview_configs(steps=20)[2], name="late", seed=12))
            _measured(root / "late")
            late.advance(4)  # started after the page opened: it must join within one refresh (5 s)
            page.wait_for_function(f"({SIDEBAR_JS})().chips.includes('late')", timeout=30_000)
            page.wait_for_function(f"({LAW_SERIES_JS})().includes('late')", timeout=30_000)
            stop.set()
            writer.join(timeout=10)
            live.close()  # finished: the sidebar's line of states must say so, not "running"
            page.wait_for_function(f"!({SIDEBAR_JS})().text.includes('(live')", timeout=30_000)
            assert "running 1 (late)" in " ".join(page.evaluate(SIDEBAR_JS)["text"].split())
            assert page.evaluate("window.__bebop_same_page === true"), "the page reloaded"
            page.wait_for_timeout(1500)  # let the other panels finish their redraw for the picture
            SCREENSHOT.parent.mkdir(exist_ok=True)
            page.screenshot(path=str(SCREENSHOT), full_page=True)
            assert page.evaluate(LIVE_POINTS_JS) > first
    finally:
        stop.set()
        if writer.is_alive():
            writer.join(timeout=10)
        live.close()
        if late is not None:
            late.close()
    assert SCREENSHOT.stat().st_size > 10_000


# Points of the acceptance-vs-entropy chart and of every line chart, as drawn (SVG), and any exception box.
DRAWN_JS = """() => {
  const charts = [...document.querySelectorAll('.js-plotly-plot')];
  const law = charts.find(gd => ((gd.layout.title || {}).text || '').includes('Acceptance vs entropy'));
  return {charts: charts.length, law: law ? law.querySelectorAll('.scatterlayer path.point').length : -1,
          exceptions: document.querySelectorAll('[data-testid="stException"]').length};
}"""
# Selected-run chips in the sidebar: their names, and those cut (text wider than its box).
CHIPS_JS = """() => {
  const spans = [...document.querySelectorAll('section[data-testid="stSidebar"] span[data-tag] > span[title]')];
  return {names: spans.map(s => s.textContent),
          cut: spans.filter(s => s.scrollWidth > s.clientWidth + 1).map(s => s.textContent)};
}"""
LONG_NAME = "demo-20261201-221530/mtp-rs-e2e_tv"


def _settled(page, condition_js: str, timeout_ms: int = 15_000) -> None:
    """Wait until the page's fonts are loaded and `condition_js` holds; the caller asserts what it measures next,
    so a layout that never settles fails there with the measurement, not here with a timeout."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    page.wait_for_function("() => document.fonts.status === 'loaded'", timeout=timeout_ms)
    with contextlib.suppress(PlaywrightTimeout):
        page.wait_for_function(condition_js, timeout=timeout_ms)


@pytest.mark.timeout(480)  # eight pages, the Shadow heads page among them
def test_every_page_over_real_one_step_runs_and_a_picture_of_the_live_page(tmp_path):
    """Runs made by the real CLI: every page draws without an exception, and the Live page is kept as a picture."""
    _require_browser()
    from real_runs import real_runs_root

    real = real_runs_root()
    every = tmp_path / "every"
    shutil.copytree(real, every)
    shutil.copytree(real / "rl-rs", every / LONG_NAME)  # a name as long as the demo's
    with _dashboard(every, tmp_path) as port, _browser(tmp_path, height=1400) as page:
        for path in ("", "live", "speed", "compare", "shadow", "samples", "mtp", "metrics"):
            page.goto(f"http://127.0.0.1:{port}/{path}", timeout=60_000)
            page.wait_for_selector("h1", timeout=60_000)
            page.wait_for_function(f"({CHIPS_JS})().names.includes({json.dumps(LONG_NAME)})", timeout=60_000)
            page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')",
                                   timeout=60_000)  # the script run ended
            assert page.evaluate(DRAWN_JS)["exceptions"] == 0, f"an exception on page /{path}"
            _settled(page, f"({CHIPS_JS})().cut.length === 0")  # web fonts and the sidebar's width arrive late
            chips = page.evaluate(CHIPS_JS)
            assert LONG_NAME in chips["names"], chips  # the default selection shows it...
            assert chips["cut"] == [], f"run names cut in the sidebar on /{path}"  # ...whole
    readme = tmp_path / "readme-runs"  # the picture shows the two RL runs: MTP + RS and its no-MTP baseline
    for name in ("rl-rs", "rl-plain"):
        shutil.copytree(real / name, readme / name)
    with _dashboard(readme, tmp_path) as port, _browser(tmp_path, height=1750) as page:
        page.goto(f"http://127.0.0.1:{port}/live", timeout=60_000)
        page.wait_for_function(f"({DRAWN_JS})().law > 0", timeout=90_000)  # the one-step run's point is drawn
        page.wait_for_function(f"({DRAWN_JS})().charts >= 5", timeout=60_000)
        page.wait_for_timeout(500)  # Plotly's last layout pass after the final chart mounts
        PICTURE.parent.mkdir(exist_ok=True)
        page.screenshot(path=str(PICTURE), full_page=True, type="png", scale="css")
    assert 10_000 < PICTURE.stat().st_size < 600_000
