"""Run directories: atomic JSON files, append-only streams, crash repair, incremental reads, resume."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

import bebop
from bebop import metrics
from bebop.rl.synthetic import SyntheticConfig, write_synthetic_run
from bebop.runlog import RunWriter, StreamTail, list_runs, load_run, run_state
from bebop.runlog import write as runwriter
from bebop.runlog.setup import SETUP_KEYS, run_setup


@dataclass(frozen=True)
class _Inner:
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)


@dataclass(frozen=True)
class _Config:
    task: str = "math"
    rollout: str = "rs"
    gamma: int = 3
    optim: _Inner = field(default_factory=_Inner)


def _lines(path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_meta_and_status_contents(tmp_path):
    with RunWriter(tmp_path / "run", _Config(), kind="rl", name="r1", meta_extra={"note": "x"}) as w:
        meta = json.loads((w.path / "meta.json").read_text())
        status = json.loads((w.path / "status.json").read_text())
    assert meta["name"] == "r1" and meta["kind"] == "rl" and meta["note"] == "x"
    assert meta["config"] == {"task": "math", "rollout": "rs", "gamma": 3, "optim": {"lr": 3e-4, "betas": [0.9, 0.95]}}
    assert set(meta["versions"]) == {"python", "torch", "bebop"}
    assert meta["entropy_bin_edges"] == list(metrics.ENTROPY_BIN_EDGES)  # inf survives as JSON Infinity
    assert abs(meta["created"] - time.time()) < 60
    assert status["state"] == "running" and abs(status["heartbeat"] - time.time()) < 60
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "finished"


def test_status_replacement_is_atomic(tmp_path, monkeypatch):
    w = RunWriter(tmp_path / "run", {"a": 1})
    w.status(step=1, message="before")
    before = (w.path / "status.json").read_bytes()

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(runwriter.os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        w.status(step=2, message="after")
    assert (w.path / "status.json").read_bytes() == before  # the old version, whole
    assert sorted(p.name for p in w.path.iterdir()) == ["meta.json", "status.json"]  # no temp file left


def test_streams_are_append_only_one_write_per_record(tmp_path, monkeypatch):
    w = RunWriter(tmp_path / "run", {})
    w.log("train", {"step": 0, "x": 1.0})
    w.log("train", {"step": 1, "x": float("nan")})
    first = (w.path / "train.jsonl").read_bytes()
    calls = []
    real_write = os.write
    monkeypatch.setattr(runwriter.os, "write", lambda fd, data: calls.append(data) or real_write(fd, data))
    w.log("train", {"step": 2, "x": 3.0, "text": "a\nb"})
    assert len(calls) == 1 and calls[0].endswith(b"\n") and calls[0].count(b"\n") == 1
    data = (w.path / "train.jsonl").read_bytes()
    assert data.startswith(first)  # earlier bytes untouched
    rows = [json.loads(line) for line in data.splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and rows[2]["text"] == "a\nb"


def test_torn_tail_is_not_read_and_repaired_on_reopen(tmp_path):
    w = RunWriter(tmp_path / "run", {})
    for step in range(3):
        w.log("train", {"step": step})
    with open(w.path / "train.jsonl", "ab") as f:  # a crash in the middle of writing step 3
        f.write(b'{"step": 3, "actor/ent')
    run = load_run(w.path)
    assert list(run.streams["train"]["step"]) == [0, 1, 2] and run.skipped_lines == 0

    w2 = RunWriter(w.path, {}, resume=True)
    assert (w.path / "train.jsonl").read_bytes().endswith(b"}\n")
    assert w2.last_step == 2
    w2.log("train", {"step": 3})
    w2.close()
    rows = [json.loads(line) for line in _lines(w.path / "train.jsonl")]  # every line parses again
    assert [r["step"] for r in rows] == [0, 1, 2, 3]


def test_corrupt_middle_line_is_counted_and_skipped(tmp_path):
    w = RunWriter(tmp_path / "run", {})
    w.log("train", {"step": 0})
    with open(w.path / "train.jsonl", "ab") as f:
        f.write(b"not json at all\n[1, 2]\n")
    w.log("train", {"step": 1})
    run = load_run(w.path)
    assert list(run.streams["train"]["step"]) == [0, 1]
    assert run.skipped_lines == 2


def test_stream_tail_reads_only_new_complete_lines(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(b'{"step": 0}\n{"step": 1}\n')
    tail = StreamTail(path)
    assert [r["step"] for r in tail.read()] == [0, 1]
    assert tail.offset == path.stat().st_size
    assert tail.read() == []
    with open(path, "ab") as f:
        f.write(b'{"step": 2}\n{"step": 3')
    assert [r["step"] for r in tail.read()] == [2]
    offset = tail.offset
    assert offset == path.stat().st_size - len(b'{"step": 3')  # stops at the last newline
    with open(path, "ab") as f:
        f.write(b"}\n")
    assert [r["step"] for r in tail.read()] == [3] and not tail.restarted
    path.write_bytes(b'{"step": 9}\n')  # replaced (e.g. a rewind): start over
    assert [r["step"] for r in tail.read()] == [9] and tail.restarted


def test_run_refresh_appends_new_rows(tmp_path):
    w = RunWriter(tmp_path / "run", {})
    w.log("train", {"step": 0, "a": 1})
    run = load_run(w.path)
    assert len(run.streams["train"]) == 1 and "samples" not in run.streams
    w.log("train", {"step": 1, "a": 2})
    w.log("samples", {"step": 1, "prompt": "p"})
    assert run.refresh() == {"samples": 1, "train": 1}
    assert list(run.streams["train"]["a"]) == [1, 2] and len(run.streams["samples"]) == 1
    w.close("failed", message="boom")
    run.refresh()
    assert run.status["state"] == "failed" and run.status["message"] == "boom"


def test_resume_never_repeats_or_skips_a_step(tmp_path):
    w = RunWriter(tmp_path / "run", {})
    for step in range(5):
        w.log("train", {"step": step})
        w.log("samples", {"step": step, "i": 0})
    # killed without close(); the resumed loop continues at last_step + 1
    w2 = RunWriter(tmp_path / "run", {}, resume=True)
    assert w2.last_step == 4
    with pytest.raises(ValueError, match="not after the last logged step"):
        w2.log("train", {"step": 4})
    for step in range(w2.last_step + 1, 8):
        w2.log("train", {"step": step})
    w2.close()
    assert list(load_run(tmp_path / "run").streams["train"]["step"]) == list(range(8))
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["resumes"][0]["last_step"] == 4


def test_rewind_to_an_older_checkpoint(tmp_path):
    w = RunWriter(tmp_path / "run", {})
    for step in range(6):
        w.log("train", {"step": step})
        w.log("samples", {"step": step})
    w2 = RunWriter(tmp_path / "run", {}, resume=True)
    w2.rewind(3)  # the checkpoint holds step 3: steps 4 and 5 will be redone
    assert w2.last_step == 3
    for step in (4, 5, 6):
        w2.log("train", {"step": step})
        w2.log("samples", {"step": step})
    w2.close()
    run = load_run(tmp_path / "run")
    assert list(run.streams["train"]["step"]) == list(range(7))
    assert list(run.streams["samples"]["step"]) == list(range(7))


def test_a_warning_is_written_to_the_run_and_printed_once(tmp_path, capsys):
    """`warn` appends to the warnings stream (which list_runs and load_run read back), prints one line on stderr, and
    a resume from an older checkpoint drops the warnings of the steps it redoes, as it drops their records."""
    w = RunWriter(tmp_path / "run", {}, kind="rl", name="mine")
    for step in range(4):
        w.log("train", {"step": step})
        if step in (1, 3):
            w.warn(f"trouble at {step}", source="test", step=step)
    assert capsys.readouterr().err.splitlines() == ["bebop: warning (mine, step 1): trouble at 1",
                                                    "bebop: warning (mine, step 3): trouble at 3"]
    w.close()
    [info] = list_runs(tmp_path)
    assert [(r["step"], r["source"], r["message"]) for r in info.warnings] == [(1, "test", "trouble at 1"),
                                                                              (3, "test", "trouble at 3")]
    resumed = RunWriter(tmp_path / "run", {}, kind="rl", resume=True)
    resumed.rewind(2)
    resumed.close()
    assert list(load_run(tmp_path / "run").streams["warnings"]["message"]) == ["trouble at 1"]
    with RunWriter(tmp_path / "eval", {}, kind="eval-mtp") as other:  # a job without steps
        other.warn("no steps here", source="test")
    assert [r.get("step") for r in load_run(tmp_path / "eval").streams["warnings"].to_dict("records")] == [None]
    assert capsys.readouterr().err == "bebop: warning (eval): no steps here\n"


def test_meta_learnt_after_the_start_is_merged_in(tmp_path):
    with RunWriter(tmp_path / "run", {}, kind="train-mtp", meta_extra={"policy": {"name": "default"}}) as w:
        w.update_meta(head={"name": "H", "draft_vocab": 64})
    meta = json.loads((tmp_path / "run" / "meta.json").read_text())
    assert meta["policy"] == {"name": "default"} and meta["head"] == {"name": "H", "draft_vocab": 64}


def test_never_clobbers_an_existing_run(tmp_path):
    w = RunWriter(tmp_path / "run", {})
    w.log("train", {"step": 0})
    w.close()
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()}
    with pytest.raises(FileExistsError, match="resume=True"):
        RunWriter(tmp_path / "run", {})
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "x.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not a bebop run"):
        RunWriter(tmp_path / "junk", {}, resume=True)
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir()} == before
    assert (tmp_path / "junk" / "x.txt").read_text() == "mine"


def test_unwritable_run_dir_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(PermissionError, match="cannot write run_dir"):
        RunWriter(blocker / "run", {})
    if os.geteuid() != 0:  # root ignores permission bits
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(PermissionError, match="cannot write run_dir"):
            RunWriter(locked / "run", {})


def test_bad_records_are_refused(tmp_path):
    w = RunWriter(tmp_path / "run", {})
    with pytest.raises(ValueError, match="carries 'step'"):
        w.log("train", {"loss": 1.0})
    with pytest.raises(ValueError, match="stream must be a simple name"):
        w.log("../escape", {"step": 0})
    with pytest.raises(ValueError, match="cannot be written as JSON"):
        w.log("train", {"step": 0, "obj": object()})
    with pytest.raises(ValueError, match="state must be one of"):
        w.status(state="exploded")
    with pytest.raises(ValueError, match="kind must be one of"):
        RunWriter(tmp_path / "other", {}, kind="nope")


def test_context_manager_marks_failures(tmp_path):
    with pytest.raises(RuntimeError):
        with RunWriter(tmp_path / "run", {}) as w:
            w.log("train", {"step": 0})
            raise RuntimeError("nan loss")
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["state"] == "failed" and "nan loss" in status["message"] and status["step"] == 0


def test_rates_are_derived_on_read(tmp_path):
    path = write_synthetic_run(tmp_path / "run", SyntheticConfig.tiny())
    train = load_run(path).streams["train"]
    row = train.iloc[3]
    assert row["spec/accept_length"] == pytest.approx(1 + row["spec/num_accepted_tokens"] / row["spec/num_drafts"])
    assert row["spec/acceptance_rate_pos/0"] == pytest.approx(
        row["spec/num_accepted_tokens_per_pos/0"] / row["spec/num_drafts"])


def test_setup_keys_one_schema_for_every_run(tmp_path):
    path = write_synthetic_run(tmp_path / "plain", SyntheticConfig(name="plain", rollout="none", mtp_objective=None,
                                                                   mtp_strategy=None, steps=1))
    info = list_runs(tmp_path)[0]
    assert info.setup == {"task": "math", "rollout": "none", "mtp_objective": None, "mtp_strategy": None,
                          "gamma": None, "mode": "async"}  # no MTP: no γ either
    assert {k: json.loads((path / "meta.json").read_text())[k] for k in SETUP_KEYS} == info.setup
    # Runs written before jobs wrote the keys: RL's config.mtp and meta.head, a config's `tasks`.
    legacy_rl = {"kind": "rl", "head": "ce", "config": {"task": "code", "rollout": "rs", "mtp": "online-tv",
                                                        "gamma": 3, "mode": "sync"}}
    assert run_setup(legacy_rl) == {"task": "code", "rollout": "rs", "mtp_objective": "ce",
                                    "mtp_strategy": "online-tv", "gamma": 3, "mode": "sync"}
    legacy_plain = {"kind": "rl", "config": {"task": "math", "rollout": "none", "mtp": "frozen", "gamma": 3}}
    assert run_setup(legacy_plain)["gamma"] is None and run_setup(legacy_plain)["mtp_strategy"] is None
    assert run_setup({"kind": "train-mtp", "config": {"tasks": ["math"], "objective": "tv"}})["task"] == ["math"]


def test_synthetic_laws_follow_the_measured_relations():
    """RS accepts at least what TO does at every entropy (finding 2) and TO falls faster; TV heads are flat."""
    def law(**kw):
        a, b = SyntheticConfig(**kw).accept_law
        return lambda h: a - b * h

    to, rs_ce, rs_tv = law(rollout="to", mtp_objective="ce"), law(mtp_objective="ce"), law(mtp_objective="e2e_tv")
    for h in [i / 20 for i in range(61)]:  # 0-3 nats
        assert rs_ce(h) >= to(h)
    assert to(0.0) - to(1.0) > rs_ce(0.0) - rs_ce(1.0) > 5 * (rs_tv(0.0) - rs_tv(1.0))


def test_list_runs_states_and_junk(tmp_path):
    root = tmp_path / "runs"
    write_synthetic_run(root / "done", SyntheticConfig.tiny())
    write_synthetic_run(root / "group" / "nested", SyntheticConfig.tiny(), state="running")
    stale = RunWriter(root / "stale", {"task": "code"})
    stale.status(heartbeat=time.time() - 3600)
    (root / "stale" / "status.json").write_text(json.dumps({"state": "running", "heartbeat": time.time() - 3600}))
    (root / "junk" / "deeper").mkdir(parents=True)
    (root / "broken").mkdir()
    (root / "broken" / "meta.json").write_text("{not json")
    outside = tmp_path / "outside"
    write_synthetic_run(outside, SyntheticConfig.tiny())
    (root / "link").symlink_to(outside, target_is_directory=True)

    infos = {i.path.relative_to(root).as_posix(): i for i in list_runs(root)}
    assert set(infos) == {"done", "group/nested", "stale", "broken"}
    assert infos["done"].state == "finished" and infos["done"].step == 7 and infos["done"].kind == "rl"
    assert infos["group/nested"].state == "running"
    assert infos["stale"].state == "stale" and infos["stale"].config == {"task": "code"}
    assert infos["broken"].state == "corrupt"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        list_runs(tmp_path / "missing")


def test_run_state_stale_threshold():
    now = 1000.0
    assert run_state({"state": "running", "heartbeat": 990.0}, now=now, stale_after=30) == "running"
    assert run_state({"state": "running", "heartbeat": 900.0}, now=now, stale_after=30) == "stale"
    assert run_state({"state": "finished", "heartbeat": 0.0}, now=now, stale_after=30) == "finished"


def test_load_run_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_run(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        load_run(tmp_path / "empty")


@pytest.mark.parametrize("code", [
    "import bebop.runlog, sys; from bebop.runlog import RunWriter; assert 'pandas' not in sys.modules",
    "import bebop.rl.trainer, sys; assert 'pandas' not in sys.modules",  # the trainer writes a run, never reads one
])
def test_writers_do_not_import_pandas(code):
    # A fresh interpreter: in this one, other tests have long since imported pandas.
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_run_logs_and_files_do_not_import_torch():
    """Writing and reading a run directory (and bebop.files' atomic JSON under it) loads no torch: the dashboard
    and a job's help text start without it; only a checkpoint's save or load imports it."""
    code = "import bebop.runlog.read, bebop.files, sys; assert 'torch' not in sys.modules"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_setup_schema_has_one_writer():
    """meta.json's setup keys are spelled as dict keys in bebop.runlog.setup only: the jobs write them through
    `setup_keys` / `rl_setup`, so a job cannot drift from what the dashboard reads (the app's column titles aside)."""
    import ast

    package = Path(bebop.__file__).parent
    owners = {package / "runlog" / "setup.py", package / "app" / "state.py"}
    spelled = []
    for path in sorted(set(package.rglob("*.py")) - owners):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Dict):
                keys = {k.value for k in node.keys if isinstance(k, ast.Constant)}
                if {"mtp_objective", "mtp_strategy"} & keys:
                    spelled.append(f"{path.relative_to(package)}:{node.lineno}")
    assert not spelled, f"setup keys written by hand: {spelled}"


def test_bebop_preview_writes_the_five_runs_the_dashboard_lists(tmp_path, capsys):
    from bebop.cli import main

    assert main(["preview", str(tmp_path / "preview"), "--steps", "4"]) == 0
    runs = list_runs(tmp_path / "preview")
    assert len(runs) == 5 and all(r.state == "finished" and r.kind == "rl" for r in runs)
    assert all(json.loads((r.path / "meta.json").read_text())["synthetic"] for r in runs)
    assert main(["preview", str(tmp_path / "bad"), "--steps", "1"]) == 2
    assert "--steps" in capsys.readouterr().err and not (tmp_path / "bad").exists()
