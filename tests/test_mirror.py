"""Mirrors of a run's streams: TensorBoard event files read back by TensorBoard's own reader, and an offline W&B run
whose record file holds the logged history; both under the names of docs/runs.md."""

from __future__ import annotations

import importlib.util
import struct
import time

import pytest

from bebop import cli
from bebop.runlog import RunWriter
from bebop.runlog.mirror import TENSORBOARD_DIR, MirrorUnavailable, make_mirrors, scalars

GAMMA = 3


def train_record(step: int) -> dict:
    return {"step": step, "critic/score/mean": 0.25 * step, "spec/gamma": GAMMA, "spec/method": "rs",
            "spec/num_drafts": 10, "spec/num_draft_tokens": 30, "spec/num_accepted_tokens": 12 + step,
            "spec/num_accepted_tokens_per_pos/0": 8, "spec/num_accepted_tokens_per_pos/1": 3 + step,
            "spec/num_accepted_tokens_per_pos/2": 1}


def write_run(run_dir, mirrors) -> None:
    with RunWriter(run_dir, {"task": "math"}, kind="rl", mirrors=mirrors) as run:
        for step in range(3):
            run.log("train", train_record(step))
            run.log("samples", {"step": step, "prompt": "1+1=", "pieces": ["2"], "origin": ["plain"]})
            run.log("eval", {"step": step, "loss": 1.0 / (step + 1), "mtp/eval/d_tv_mean": 0.1})


def test_scalars_keep_the_run_names_and_add_the_step_rates():
    values = scalars("train", train_record(1))
    assert values["critic/score/mean"] == 0.25 and values["spec/num_accepted_tokens"] == 13
    assert values["spec/accept_length"] == pytest.approx(1 + 13 / 10)
    assert values["spec/acceptance_rate"] == pytest.approx(13 / 30)
    assert "spec/method" not in values and "step" not in values
    assert scalars("eval", {"step": 0, "loss": 2.0, "mtp/eval/d_tv_mean": 0.5}) == {"eval/loss": 2.0,
                                                                                      "mtp/eval/d_tv_mean": 0.5}
    assert scalars("samples", {"step": 0, "reward": 1.0}) == {}
    assert scalars("shadow", {"step": 0, "head": "ce", "rule": "rs", "accept_length": 3.0}) == {}
    assert scalars("warnings", {"step": 0, "source": "no_signal", "message": "...", "time": 1.7e9}) == {}


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_tensorboard_event_files_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    write_run(tmp_path / "run", make_mirrors(tensorboard=True))
    events = EventAccumulator(str(tmp_path / "run" / TENSORBOARD_DIR))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"critic/score/mean", "spec/accept_length", "spec/acceptance_rate_pos/1", "eval/loss",
            "mtp/eval/d_tv_mean"} <= tags
    accept = events.Scalars("spec/accept_length")
    assert [e.step for e in accept] == [0, 1, 2]
    assert [e.value for e in accept] == pytest.approx([1 + (12 + s) / 10 for s in range(3)])
    assert [e.value for e in events.Scalars("eval/loss")] == pytest.approx([1.0, 0.5, 1 / 3])


def wandb_records(path) -> list:
    """The protobuf Records of a W&B run file: a LevelDB-style log (7-byte file header; 32 KiB blocks of chunks,
    each with a 7-byte header: crc32, length, type 1 full / 2 first / 3 middle / 4 last)."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    data, block, pos, chunks, records = path.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # the end, or a chunk wandb is still writing
            break
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            try:
                record.ParseFromString(chunks)
            except DecodeError:  # its bytes not all flushed yet: wandb_history reads the file again
                break
            chunks = b""
            records.append(record)
    return records


def wandb_history(path) -> list[dict]:
    """The history rows of a finished W&B run file. wandb's core process may still be writing it when `finish()`
    returns, so read until its closing `exit` record is there (a completion wait, not a timing test)."""
    deadline = time.monotonic() + 60
    records = wandb_records(path)
    while not any(r.WhichOneof("record_type") == "exit" for r in records) and time.monotonic() < deadline:
        time.sleep(0.2)
        records = wandb_records(path)
    return [{item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_offline_run_holds_the_records(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")  # no account, no network
    monkeypatch.setenv("WANDB_SILENT", "true")
    write_run(tmp_path / "run", make_mirrors(wandb=True))
    files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    rows = {int(row["_step"]): row for row in wandb_history(files[0])}
    assert sorted(rows) == [0, 1, 2]
    for step, row in rows.items():
        assert float(row["critic/score/mean"]) == pytest.approx(0.25 * step)
        assert float(row["spec/accept_length"]) == pytest.approx(1 + (12 + step) / 10)
        assert float(row["eval/loss"]) == pytest.approx(1.0 / (step + 1))


@pytest.mark.parametrize("command", [["rl", "--out", "OUT"], ["train-mtp", "--tiny", "--run-dir", "OUT"]])
@pytest.mark.parametrize("flag, package", [("--tensorboard", "tensorboard"), ("--wandb", "wandb")])
def test_a_missing_package_is_one_line_and_exit_2(command, flag, package, tmp_path, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else real(name, *a))
    with pytest.raises(MirrorUnavailable):
        make_mirrors(**{package: True})
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    assert cli.main([*argv, flag]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and flag in err[0] and f"pip install {package}" in err[0], err
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard not installed")
def test_train_mtp_tensorboard_flag_writes_event_files_beside_the_run(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "train-mtp"
    assert cli.main(["train-mtp", "--tiny", "--tensorboard", "--run-dir", str(run_dir)]) == 0
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    events.Reload()
    assert {"mtp/loss/e2e_tv", "mtp/d_tv_mean", "mtp/eval/d_tv_mean"} <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("mtp/loss/e2e_tv")] == [0, 1, 2, 3]  # TrainMTPConfig.tiny: 4 steps
