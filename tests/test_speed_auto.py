"""The Speed page with gamma="auto" runs: the chosen depths, the measured step costs and the draft-health alarm,
read from what the trainer wrote (the dashboard computes nothing the library did not log)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from bebop.data.tokenizer import CharTokenizer  # noqa: E402
from bebop.engine import generate  # noqa: E402
from bebop.engine.depth import Choice, DepthController, row_bucket  # noqa: E402
from bebop.models.config import ModelConfig  # noqa: E402
from bebop.models.mtp import MTPHead  # noqa: E402
from bebop.models.transformer import Transformer  # noqa: E402
from bebop.plots import speed as speed_plots  # noqa: E402
from bebop.rl import RLConfig, build_trainer  # noqa: E402
from bebop.rl.draft_health import HealthConfig  # noqa: E402
from bebop.runlog import load_run  # noqa: E402
from test_draft_health import CORRUPT_AT  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


class _Cycling(DepthController):
    """The engine's controller with its choice replaced by a cycle through every depth, so the run drafts at each γ
    whatever this machine's step costs say (which decide, on a random-init head, that plain decoding pays best)."""

    def decide(self, rows: int) -> Choice:
        self.turn = getattr(self, "turn", -1) + 1
        gamma = self.turn % (self.config.max_gamma + 1)
        return Choice(gamma, rows, row_bucket(rows), self.expected_accepted(gamma), self.cost(rows, gamma), False)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    from test_draft_health import corrupting
    from test_rl import MODEL, Digits

    root, tok = tmp_path_factory.mktemp("runs"), CharTokenizer()
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tok.vocab_size, **MODEL)
    model, head = Transformer(config), MTPHead(config)
    rl = RLConfig.tiny(steps=CORRUPT_AT + 2 + HealthConfig().window, prompts_per_step=4, group_size=4,
                       max_new_tokens=24, mode="sync", lr=1e-3, gamma="auto", max_gamma=3)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(generate, "DepthController", _Cycling)
        corrupting(build_trainer(rl, model, tok, head=head, run_dir=root / "auto", task=Digits())).run()
    return root


def test_auto_runs_log_their_depths_costs_and_health(root):
    train = load_run(root / "auto").streams["train"]
    depths = speed_plots.chosen_depths({"auto": train})
    assert set(depths["gamma"]) == {0, 1, 2, 3}
    assert depths.groupby("step")["share"].sum().to_numpy() == pytest.approx(1.0)
    costs = speed_plots.measured_costs({"auto": train})
    assert set(costs["gamma"]) == {0, 1, 2, 3} and (costs["seconds"] > 0).all()
    health = speed_plots.draft_health({"auto": train})
    # The draft is corrupted in step CORRUPT_AT's update; the alarm rises within a window of steps after it (a
    # bootstrap over steps calls it, tests/test_draft_health.py) and stays, and never before.
    alarm = dict(zip(health["step"], health["alarm"]))
    first = min(step for step, raised in alarm.items() if raised == 1.0)
    assert CORRUPT_AT < first <= CORRUPT_AT + HealthConfig().window, alarm
    assert all(raised == (step >= first) for step, raised in alarm.items()), alarm
    assert "mismatch term" in health["warning"].iloc[-1]


def test_speed_page_shows_them(root, monkeypatch):
    monkeypatch.setenv("BEBOP_RUNS", str(root))
    at = AppTest.from_file(str(REPO / "app" / "main.py"), default_timeout=60)
    at.session_state["runs_selected"] = ["auto"]
    at = at.run().switch_page(str(REPO / "bebop" / "app" / "views" / "speed.py")).run()
    assert not at.exception
    titles = [json.loads(chart.proto.spec)["layout"]["title"]["text"] for chart in at.get("plotly_chart")]
    assert {"Draft depth chosen by the engine (gamma=auto)",
            "Measured engine step cost by depth (a line per rows bucket)", "Draft health: acceptance minus the entropy law's prediction"} <= set(titles)
    assert any("mismatch term" in str(w.value) for w in at.warning)
