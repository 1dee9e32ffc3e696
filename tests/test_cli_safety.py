"""Nothing a user made is overwritten without --force or --resume, a preset never drops a flag, and every misuse is
one line naming the flag or file and the cause, exit status 2, before any heavy work (issue 46). The jobs' loaders
are replaced by ones that fail the test, so "before any work" is checked, not assumed."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_checks import no_load, one_error_line, snapshot

from bebop import cli
from bebop.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def no_work(monkeypatch):
    import bebop.commands.eval_mtp as eval_mtp
    import bebop.heads.train
    import bebop.policy
    import bebop.pretrain

    monkeypatch.setattr(bebop.heads.train, "load_frozen_policy", no_load)
    monkeypatch.setattr(bebop.pretrain, "pretrain", no_load)
    monkeypatch.setattr(eval_mtp, "load_policy_heads", no_load)
    monkeypatch.setattr(bebop.policy, "load_policy_heads", no_load)


@pytest.fixture
def head(tmp_path) -> Path:
    """A directory holding a trained head (what `train-mtp --out` wrote an hour ago)."""
    out = tmp_path / "H"
    out.mkdir()
    (out / "head.json").write_text('{"objective": "e2e_tv"}')
    (out / "head.safetensors").write_bytes(b"weights")
    return out


# ------------------------------------------------------------------------------------ overwrites: train-mtp, pretrain
def test_train_mtp_refuses_an_out_that_holds_a_head(head, no_work, capsys):
    before = snapshot(head)
    assert main(["train-mtp", "--tiny", "--objective", "ce", "--out", str(head)]) == 2
    line = one_error_line(capsys)
    assert f"--out {head} already holds a head" in line and "--force" in line
    assert snapshot(head) == before


def test_train_mtp_force_replaces_the_head(head, tmp_path, capsys):
    assert main(["train-mtp", "--tiny", "--steps", "1", "--objective", "ce", "--out", str(head), "--force",
                 "--run-dir", str(tmp_path / "run")]) == 0
    assert json.loads((head / "head.json").read_text())["objective"] == "ce"
    assert json.loads((tmp_path / "run" / "meta.json").read_text())["config"]["steps"] == 1  # --tiny kept --steps


def test_train_mtp_refuses_a_used_run_dir_naming_the_flags(tmp_path, no_work, capsys):
    run = tmp_path / "R1"
    run.mkdir()
    (run / "meta.json").write_text("{}")
    assert main(["train-mtp", "--tiny", "--run-dir", str(run)]) == 2
    line = one_error_line(capsys)
    assert f"--run-dir {run} is not empty: pass --resume" in line and "resume=True" not in line


@pytest.mark.parametrize("command", ["train-mtp", "pretrain"])
def test_a_preset_applies_the_flags_given_beside_it(command):
    module = __import__(f"bebop.commands.{command.replace('-', '_')}", fromlist=["add_arguments"])
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)
    config = module.config_from_args(parser.parse_args(["--tiny", "--steps", "3", "--batch-size", "2", "--lr", "0.01"]))
    assert (config.steps, config.batch_size, config.lr) == (3, 2, 0.01)
    tiny = module.config_from_args(parser.parse_args(["--tiny"]))
    assert tiny.steps != 3 and tiny.batch_size != 2  # the preset's own values where no flag is given


@pytest.mark.parametrize("command", ["train-mtp", "pretrain"])
def test_a_preset_refuses_a_bad_flag_beside_it(command, no_work, capsys):
    assert main([command, "--tiny", "--batch-size", "-4"]) == 2
    assert "--batch-size must be a positive int, got -4" in one_error_line(capsys)


def test_pretrain_refuses_an_out_that_holds_a_checkpoint(tmp_path, no_work, capsys):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "config.json").write_text("{}")
    assert main(["pretrain", "--tiny", "--out", str(out)]) == 2
    assert f"--out {out} already holds a checkpoint: pass --force" in one_error_line(capsys)


def test_eval_mtp_and_bench_rl_refuse_used_directories(tmp_path, no_work, capsys):
    used = tmp_path / "used"
    used.mkdir()
    (used / "meta.json").write_text("{}")
    assert main(["eval-mtp", "--run-dir", str(used)]) == 2
    assert f"--run-dir {used} already holds a run" in one_error_line(capsys)
    assert main(["bench", "rl", "--out", str(used)]) == 2
    assert f"--out {used} already holds a run" in one_error_line(capsys)


# --------------------------------------------------------------------------------------------------------- preview
def test_preview_reruns_refuse_cleanly_and_force_replaces(tmp_path, capsys):
    root = tmp_path / "pv"
    assert main(["preview", str(root), "--steps", "3"]) == 0
    before = snapshot(root)
    assert main(["preview", str(root), "--steps", "3"]) == 2
    assert "already hold preview runs: pass --force" in one_error_line(capsys)
    assert snapshot(root) == before
    assert main(["preview", str(root), "--steps", "4", "--force"]) == 0
    assert json.loads((root / "rs-ce" / "status.json").read_text())["step"] == 3  # rewritten: 4 steps


def test_preview_never_replaces_nor_half_writes_beside_a_real_run(tmp_path, capsys):
    root = tmp_path / "runs"
    (root / "rs-ce").mkdir(parents=True)  # a real run that happens to share a preview run's name
    (root / "rs-ce" / "meta.json").write_text(json.dumps({"kind": "rl", "name": "rs-ce"}))
    for force in ([], ["--force"]):
        assert main(["preview", str(root), "--steps", "3", *force]) == 2
        assert "is not a preview run" in one_error_line(capsys)
        assert sorted(p.name for p in root.iterdir()) == ["rs-ce"]  # nothing written beside it
    (root / "rs-ce").rename(root / "mine")
    assert main(["preview", str(root), "--steps", "3"]) == 0
    assert "also holds 1 real run(s) (mine)" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------- errors: one line
@pytest.mark.parametrize("content, cause", [
    ('{"question": "1+1", "answer": "2"\n', "line 1 is not JSON (Expecting ',' delimiter at column 34)"),
    ('{"question": "1", "answer": "1"}\n{oops\n', "line 2 is not JSON"),
    ("", "has no rows: the file is empty"),
    ("[1, 2]\n", "line 1 is a JSON list, not an object"),
])
def test_a_bad_jsonl_names_the_row_and_the_cause(tmp_path, monkeypatch, capsys, content, cause):
    import bebop.commands.rl as rl

    monkeypatch.setattr(rl, "load_policy", no_load)
    data = tmp_path / "data.jsonl"
    data.write_text(content)
    assert main(["rl", "--task", f"jsonl:{data}", "--out", str(tmp_path / "run")]) == 2
    line = one_error_line(capsys)
    assert cause in line and str(data) in line and "DatasetGenerationError" not in line


@pytest.mark.parametrize("argv, expected", [
    (["rl", "--steps", "-3"], "--steps must be a positive int, got -3"),
    (["rl", "--gamma", "0"], "--gamma must be a positive int or 'auto' or 'rows', got 0"),
    (["train-mtp", "--batch-size", "-4", "--steps", "2"], "--batch-size must be a positive int, got -4"),
    (["pretrain", "--eval-prompts", "0"], "--eval-prompts must be a positive int"),
])
def test_config_errors_name_the_flags(tmp_path, no_work, capsys, argv, expected):
    argv = argv + (["--out", str(tmp_path / "run")] if argv[0] == "rl" else [])
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert expected in line and "Config." not in line


def test_internal_names_become_flags():
    parser = argparse.ArgumentParser()
    parser.add_argument("--run-dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--dtype")
    parser.add_argument("--rollout")
    assert cli.in_flags("RLConfig.dtype must be 'auto', got 'x'", parser) == "--dtype must be 'auto', got 'x'"
    assert cli.in_flags("RLConfig.method must be 'rs'", parser) == "--rollout must be 'rs'"
    assert cli.in_flags("RLConfig.group_size must be >= 2", parser) == "RLConfig.group_size must be >= 2"  # no flag


@pytest.mark.parametrize("argv, expected", [
    (["trian-mtp", "--tiny"], "unknown command 'trian-mtp'; did you mean 'train-mtp'?"),
    (["bench", "engin"], "unknown benchmark 'engin'; did you mean 'engine'?"),
])
def test_a_typo_gets_a_did_you_mean(capsys, argv, expected):
    assert main(argv) == 2
    assert one_error_line(capsys) == f"bebop: error: {expected}"


def test_a_busy_port_is_one_line_before_the_url(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "bebop", "dashboard", "--runs", str(tmp_path), "--port",
                               str(port)], capture_output=True, text=True, timeout=60,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2 and done.stdout == ""  # no URL printed for a server that never starts
    assert done.stderr.strip().splitlines() == [
        f"bebop: error: --port {port}: cannot serve on 127.0.0.1:{port} (Address already in use; another "
        "dashboard?): pick another --port"]


def test_get_model_refuses_a_directory_that_holds_something_else(tmp_path, capsys):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    assert main(["get-model", "smollm2", str(tmp_path / "mine")]) == 2
    assert "holds files but no converted model" in one_error_line(capsys)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine"
