"""Issue 51, items 4-6, from the outside: misuse is refused before torch loads (so it can answer at once), a resumed
run keeps what it recorded, and Ctrl-C / SIGTERM leave the run marked `interrupted` with the command that continues
it. Each case runs the real command line in a fresh process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_checks import snapshot

ROOT = Path(__file__).resolve().parents[1]
# The command line in a fresh process, reporting its exit status and whether torch was imported by then.
PROBE = """
import json, sys
from bebop.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit_:  # argparse's own errors
    code = exit_.code
print(json.dumps({"code": code, "torch": "torch" in sys.modules}))
"""


def bebop(argv: list[str], cwd: Path, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BEBOP_CACHE": str(cwd / "cache")}
    return subprocess.run([sys.executable, "-c", PROBE, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120, check=False, **popen)


@pytest.fixture
def used(tmp_path) -> Path:
    run = tmp_path / "used"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"kind": "rl", "name": "used", "config": {"steps": 20}}))
    (run / "train.jsonl").write_text('{"step": 0}\n')
    return run


@pytest.mark.parametrize("argv, says", [
    (["rl", "--policy", "no-such-dir", "--out", "x"], "--policy no-such-dir: no such directory, and not a hub id"),
    (["rl", "--policy", "smollm2", "--head", "tv", "--out", "x"], "head 'tv' is neither a directory nor a head of"),
    (["rl", "--task", "csv:data.csv", "--out", "x"], "or a dataset: jsonl:PATH, parquet:PATH"),
    (["rl", "--task", "jsonl:missing.jsonl", "--out", "x"], "no such file 'missing.jsonl'"),
    (["rl", "--dtype", "fp16", "--out", "x"], "rl: argument --dtype/--gen-dtype: invalid choice: 'fp16'"),
    (["rl", "--steps", "-3", "--out", "x"], "--steps must be a positive int, got -3"),
    (["rl", "--resume", "--out", "used", "--prompts", "4"], "cannot resume --out used with --prompts 4"),
    (["rl", "--out", "used"], "--out used is not empty: pass --resume"),
    (["train-mtp", "--tiny", "--batch-size", "-4"], "--batch-size must be a positive int, got -4"),
    (["train-mtp", "--tiny", "--run-dir", "used"], "--run-dir used is not empty: pass --resume"),
])
def test_misuse_is_one_line_before_torch_loads(tmp_path, used, argv, says):
    """Checks that need no model (policy names, head names against the policy's heads, task specs, dtypes, values,
    resumes) answer before torch is imported, in one line with exit status 2; `--help` is named for argparse's."""
    before = snapshot(used)
    done = bebop(argv, tmp_path)
    report = json.loads(done.stdout.strip().splitlines()[-1])
    lines = done.stderr.strip().splitlines()
    assert report == {"code": 2, "torch": False}, done.stderr
    assert len(lines) == 1 and lines[0].startswith("bebop: error: ") and says in lines[0], done.stderr
    assert "--help" in lines[0] or "argument" not in lines[0]
    assert snapshot(used) == before and not (tmp_path / "x").exists() and not (tmp_path / "cache").exists()


def test_sigterm_marks_the_run_interrupted_and_says_how_to_resume_it(tmp_path):
    """SIGTERM (Ctrl-C the same) mid-run: the step being written is whole, status.json says `interrupted`, exit
    status 130, and the printed command resumes the run as it was recorded, every step once."""
    argv = ["rl", "--preset", "quick", "--steps", "40", "--prompts", "2", "--group", "2", "--max-new-tokens", "12",
            "--gamma", "2", "--threads", "1", "--device", "cpu", "--dtype", "fp32", "--no-progress", "--out", "run"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    job = subprocess.Popen([sys.executable, "-m", "bebop", *argv], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    train, deadline = tmp_path / "run" / "train.jsonl", time.time() + 120
    while not (train.exists() and train.read_text().count("\n") >= 2) and job.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 130, err
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "interrupted"
    assert all(line.endswith("}") for line in train.read_text().splitlines())  # no torn record
    command = err.strip().splitlines()[-1].strip()
    assert command.startswith("bebop rl ") and command.endswith("--out run --resume")
    resumed = subprocess.run([sys.executable, "-m", "bebop", *command.split()[1:], "--steps", "4"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=300, check=False)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming --out run with --steps 4 (recorded: 40)" in resumed.stderr
    assert [json.loads(line)["step"] for line in train.read_text().splitlines()] == [0, 1, 2, 3]
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["config"]["steps"] == 4 and meta["resumes"][-1]["changed"] == {"steps": [40, 4]}


@pytest.fixture
def sigint(request: pytest.FixtureRequest):
    """SIGINT handled as `request.param` for the test, whatever the test process was started with (a shell script
    starts a background job with SIGINT ignored), and the process's own handler put back after."""
    before = signal.signal(signal.SIGINT, request.param)
    yield request.param
    signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("sigint", [signal.default_int_handler], ids=["handled"], indirect=True)
def test_a_checkpoint_being_written_is_finished_before_ctrl_c_stops_the_run(sigint):
    """`uninterrupted` holds SIGINT and SIGTERM until its block is done, then raises KeyboardInterrupt."""
    from bebop.runlog.session import uninterrupted

    done = []
    with pytest.raises(KeyboardInterrupt):
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # a signal arrives between bytecodes: the block goes on
            done.append("written")
    assert done == ["written"] and signal.getsignal(signal.SIGINT) is sigint


@pytest.mark.parametrize("sigint", [signal.SIG_IGN], ids=["ignored"], indirect=True)
def test_a_job_that_ignores_ctrl_c_is_not_stopped_by_it_while_it_writes(sigint):
    """A process started ignoring SIGINT (in the background by a script, or under nohup) goes on ignoring it."""
    from bebop.runlog.session import uninterrupted

    done = []
    try:
        with uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            done.append("written")
    except KeyboardInterrupt:
        pytest.fail("a Ctrl-C the process ignores stopped it once its block was written")
    assert done == ["written"] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
