"""The command line on bad input: one line on stderr naming the problem, exit status 2, before any heavy work, and
nothing already written is lost (issue items 13-17). The jobs' model loaders are replaced by ones that fail the
test, so "before any model is loaded" is checked, not assumed."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import no_load, one_error_line, snapshot
from rich.console import Console

from bebop.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_rl_model(monkeypatch):
    import bebop.commands.rl as rl

    monkeypatch.setattr(rl, "load_policy", no_load)


@pytest.fixture
def old_run(tmp_path) -> Path:
    """A run directory another job already wrote."""
    run = tmp_path / "runs" / "old"
    run.mkdir(parents=True)
    (run / "meta.json").write_text(json.dumps({"kind": "rl", "name": "old"}))
    (run / "train.jsonl").write_text('{"step": 0}\n')
    return run


# ---------------------------------------------------------------------------------- 13: rl --out on a used directory
def test_rl_refuses_a_non_empty_out_in_one_line_naming_resume(old_run, no_rl_model, capsys):
    before = snapshot(old_run)
    assert main(["rl", "--out", str(old_run)]) == 2
    line = one_error_line(capsys)
    assert f"--out {old_run} is not empty: pass --resume" in line
    assert snapshot(old_run) == before


def test_rl_refuses_a_non_empty_out_from_a_real_process(old_run):
    """The issue's exact command: no traceback, one line, exit 2."""
    before = snapshot(old_run)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "bebop", "rl", "--out", str(old_run)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "--resume" in done.stderr, done.stderr
    assert snapshot(old_run) == before


@pytest.mark.parametrize("argv, names", [
    (["--resume"], "does not exist"),  # --out missing: nothing to resume
    (["--gamma", "0"], "gamma"),
    (["--steps", "0"], "steps"),
    (["--lr", "-1"], "lr"),
])
def test_rl_refuses_bad_values_before_loading(tmp_path, no_rl_model, capsys, argv, names):
    assert main(["rl", "--out", str(tmp_path / "new")] + argv) == 2
    assert names in one_error_line(capsys)
    assert not (tmp_path / "new").exists()


# --------------------------------------------------------------------------------------- 14: bench numeric flags
@pytest.mark.parametrize("argv, flag", [
    (["--batch", "0"], "--batch"),
    (["--batch", "1", "-2"], "--batch"),
    (["--gamma", "0"], "--gamma"),
    (["--new-tokens", "0"], "--new-tokens"),
    (["--small-new-tokens", "-1"], "--small-new-tokens"),
    (["--prompt-len", "0"], "--prompt-len"),
    (["--repeats", "0"], "--repeats"),
    (["--threads", "0"], "--threads"),
])
def test_bench_engine_checks_its_numbers_first(monkeypatch, capsys, argv, flag):
    import bebop.commands.bench.engine as engine

    monkeypatch.setattr(engine, "bench_model", no_load)
    assert main(["bench", "engine", "--no-hf", "--no-compile"] + argv) == 2
    assert flag in one_error_line(capsys)


@pytest.mark.parametrize("argv, flag", [
    (["--batch", "0"], "--batch"),
    (["--gamma", "0"], "--gamma"),
    (["--new-tokens", "0"], "--new-tokens"),
    (["--repeats", "0"], "--repeats"),
    (["--threads", "0"], "--threads"),
    (["--temperature", "0"], "--temperature"),
])
def test_bench_step_checks_its_numbers_first(capsys, argv, flag):
    assert main(["bench", "step"] + argv) == 2  # before any policy loads: check_args runs first
    assert flag in one_error_line(capsys)


@pytest.mark.parametrize("argv, flag", [
    (["--steps", "0"], "--steps"),
    (["--prompts", "8", "0"], "--prompts"),
    (["--group", "1"], "--group"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--gamma", "-1"], "--gamma"),
    (["--repeats", "0"], "--repeats"),
    (["--micro-batch-tokens", "-1"], "--micro-batch-tokens"),
    (["--seed", "-1"], "--seed"),
])
def test_bench_rl_checks_its_numbers_first(monkeypatch, capsys, argv, flag):
    import bebop.policy

    monkeypatch.setattr(bebop.policy, "load_policy_heads", no_load)
    assert main(["bench", "rl"] + argv) == 2
    assert flag in one_error_line(capsys)


@pytest.mark.parametrize("argv, flag", [(["--repeats", "0"], "--repeats"), (["--tile", "0"], "--tile")])
def test_bench_losses_checks_its_numbers_first(capsys, argv, flag):
    assert main(["bench", "losses", "--device", "cpu", "--vocab", "8"] + argv) == 2
    assert flag in one_error_line(capsys)


# ---------------------------------------------------------- issue 18: a typed --policy path that does not exist
@pytest.mark.parametrize("command", [["rl", "--out", "{tmp}/run"], ["train-mtp"], ["eval-mtp"],
                                     ["demo", "--out", "{tmp}/runs"], ["bench", "rl"]])
def test_a_missing_policy_directory_is_one_line_before_loading(monkeypatch, tmp_path, capsys, command):
    import bebop.models.checkpoint

    monkeypatch.setattr(bebop.models.checkpoint, "load_pretrained", no_load)
    argv = [a.format(tmp=tmp_path) for a in command] + ["--policy", str(tmp_path / "nowhere")]
    assert main(argv) == 2
    assert f"--policy {tmp_path / 'nowhere'}: no such directory" in one_error_line(capsys)
    assert not any(tmp_path.iterdir())


# ------------------------------------------------------------------------- 15: the hint, and resuming a finished run
def test_resuming_a_finished_run_says_so_once_and_points_at_the_dashboard(old_run, no_rl_model, capsys):
    (old_run / "status.json").write_text(json.dumps({"state": "finished", "step": 15}))
    before = snapshot(old_run)
    assert main(["rl", "--out", str(old_run), "--resume", "--steps", "16"]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("already finished") == 1 and captured.err == ""
    assert snapshot(old_run) == before
    hint = next(line for line in captured.out.splitlines() if "bebop dashboard" in line)
    # The hint is a command `bebop dashboard` itself accepts, showing the run's parent directory.
    from bebop.commands import dashboard

    parser = argparse.ArgumentParser()
    dashboard.add_arguments(parser)
    args = parser.parse_args(hint.split("bebop dashboard", 1)[1].split())
    assert args.runs == old_run.parent


def test_resuming_a_finished_run_with_more_steps_goes_on(old_run, no_rl_model):
    (old_run / "status.json").write_text(json.dumps({"state": "finished", "step": 15}))
    with pytest.raises(AssertionError, match="model was loaded"):  # it gets as far as loading the policy
        main(["rl", "--out", str(old_run), "--resume", "--steps", "20"])


# --------------------------------------------------------------------------------------------------- 16: rl --help
def test_rl_help_documents_every_flag_its_default_and_the_real_heads(capsys):
    from bebop.default import DEFAULT_DIR, shipped_heads
    from bebop.policy import EMBEDDED

    with pytest.raises(SystemExit) as exit_:
        main(["rl", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps; compare on single spaces
    for head in {*shipped_heads(DEFAULT_DIR), EMBEDDED}:
        assert f"'{head}'" in text
    assert "save_head directory" in text and "hub id" in text
    from bebop.commands import rl

    parser = argparse.ArgumentParser()
    rl.add_arguments(parser)
    for action in parser._actions:
        if action.dest != "help":
            assert action.help, f"{action.option_strings} is undocumented"
            if action.nargs != 0 and not action.required:  # every option that takes a value (switches are off)
                assert "default" in action.help, f"{action.option_strings} hides its default"
    assert "quick 3e-05" in text  # --lr shows each preset's value


# ------------------------------------------------------------------------------- 17: eval-mtp tables and their noise
def _rows(temperatures) -> list[dict]:
    rows = []
    for t in temperatures:
        for head, accepted in (("ce", 600), ("tv", 610), ("e2e_tv", 700)):
            for method, shift in (("to", 0), ("rs", 5)):
                k = accepted + shift
                rows.append({"task": "math", "temperature": t, "head": head, "method": method,
                             "acceptance_rate": k / 1000, "num_accepted_tokens": k, "num_draft_tokens": 1000,
                             "accept_length": 2.0, "draft_entropy_mean": 0.1 * t, "d_tv_mean": 0.2, "tokens_per_s": 1.0})
    return rows


def _printed(rows) -> str:
    from bebop.commands.eval_mtp import print_tables
    from bebop.heads.evaluate import fit_slopes

    out = io.StringIO()
    print_tables(rows, fit_slopes(rows), console=Console(file=out, width=250))
    return out.getvalue()


def test_eval_mtp_says_why_there_is_no_entropy_law_fit():
    text = _printed(_rows([0.5, 1.0]))
    assert "needs >= 3 temperatures" in text and "this sweep has 2" in text
    assert "entropy law over the sweep" not in text  # no empty table
    assert "entropy law over the sweep" in _printed(_rows([0.5, 1.0, 1.5]))


def test_eval_mtp_prints_counts_and_intervals_and_calls_noise_noise():
    from bebop.metrics import rate_interval

    text = _printed(_rows([1.0]))
    lo, hi = rate_interval(600, 1000)
    assert f"60.0 [{100 * lo:.1f}, {100 * hi:.1f}] 600/1000" in text
    for line in text.splitlines():
        if "│" in line and "math" in line:
            assert "/1000" in line and "[" in line  # every acceptance rate printed carries its counts and interval
    assert "+1.0 noise" in text  # tv - ce: 1 point over 1000 draft tokens
    assert "+10.0 noise" not in text and "+10.0" in text  # e2e_tv - ce is far outside it


def test_rate_intervals_cover_the_rate_and_hold_zero_only_for_small_differences():
    from bebop.metrics import rate_difference_interval, rate_interval

    lo, hi = rate_interval(50, 100)
    assert lo < 0.5 < hi and hi - lo == pytest.approx(2 * 1.96 * 0.05, rel=0.05)
    assert all(math.isnan(x) for x in rate_interval(0, 0))  # no trials, no rate
    assert 0.0 <= rate_interval(0, 10)[0] and rate_interval(10, 10)[1] <= 1.0
    lo, hi = rate_difference_interval(510, 1000, 500, 1000)
    assert lo < 0 < hi
    lo, hi = rate_difference_interval(600, 1000, 500, 1000)
    assert 0 < lo < 0.1 < hi
