"""--device / --dtype on every command: the names, the one-line refusal of a device the machine lacks (before any
model loads), and the resolution rules (auto, LOCAL_RANK under torchrun)."""

from __future__ import annotations

import argparse
import importlib
import time

import pytest
import torch
from cli_checks import one_error_line

from bebop.cli import BENCHMARKS, COMMANDS, main
from bebop.device import autocast, check_device_name, resolve_device, resolve_dtype, to_device

# Commands that compute (the dashboard serves files; make-checkpoint writes random weights without computing;
# get-model converts a file on the host; preview writes simulated runs).
COMPUTING = [name for name in COMMANDS if name not in ("dashboard", "make-checkpoint", "get-model", "preview")]
# `bench memory` computes nothing itself: it runs whole jobs, each with its own --device.
BENCHES = {name: spec for name, spec in BENCHMARKS.items() if name != "memory"}
# The smallest valid command line of each, so only the device is wrong.
ARGS = {"rl": ["rl", "--out", "{tmp}/rl"], "train-mtp": ["train-mtp", "--tiny", "--run-dir", "{tmp}/mtp"],
        "eval-mtp": ["eval-mtp", "--run-dir", "{tmp}/eval"], "demo": ["demo", "--out", "{tmp}/demo"],
        "pretrain": ["pretrain", "--tiny", "--run-dir", "{tmp}/pre"],
        "task-sweep": ["task-sweep", "--run-dir", "{tmp}/sweep"],
        "bench engine": ["bench", "engine"], "bench rl": ["bench", "rl"], "bench losses": ["bench", "losses"],
        "bench depth": ["bench", "depth"], "bench step": ["bench", "step"],
        "bench train-mtp": ["bench", "train-mtp"], "bench coverage": ["bench", "coverage"],
        "bench corpus": ["bench", "corpus"]}


def _parser(module: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    return parser


@pytest.mark.parametrize("module", [COMMANDS[n][0] for n in COMPUTING] + [m for m, _ in BENCHES.values()])
def test_every_computing_command_takes_device_and_dtype(module):
    options = {o for action in _parser(module)._actions for o in action.option_strings}
    assert {"--device", "--dtype"} <= options, module


def test_the_command_list_covers_every_computing_command():
    assert set(ARGS) == set(COMPUTING) | {f"bench {name}" for name in BENCHES}


@pytest.mark.parametrize("command", sorted(ARGS))
def test_cuda_on_a_machine_without_it_is_one_line_before_any_work(command, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same test on a GPU machine
    argv = [a.format(tmp=tmp_path) for a in ARGS[command]]
    start = time.perf_counter()
    assert main([*argv, "--device", "cuda"]) == 2
    line = one_error_line(capsys)
    assert "--device cuda: CUDA is not available" in line, line
    assert time.perf_counter() - start < 5, "refused only after loading or computing"
    assert not any(tmp_path.iterdir()), "a refused command wrote files"


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:-1", "CPU", ""])
def test_a_malformed_device_name_is_refused_by_the_parser(bad, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["train-mtp", "--tiny", "--device", bad])
    assert exit_.value.code == 2
    assert "device must be auto, cpu, cuda or cuda:N" in capsys.readouterr().err
    with pytest.raises(ValueError, match="device must be"):
        check_device_name(bad)


def test_resolve_device(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device(None) == torch.device("cpu")
    for name in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device(name)


def test_auto_and_cuda_pick_the_torchrun_ranks_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("auto") == resolve_device("cuda") == torch.device("cuda", 3)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)  # an explicit index wins
    with pytest.raises(ValueError, match="has 4 CUDA device"):
        resolve_device("cuda:4")


def test_dtype_defaults_follow_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    assert resolve_dtype("auto", "cuda") == torch.float32  # fp16 would need loss scaling: never chosen
    assert resolve_dtype("fp32", "cuda") == torch.float32 and resolve_dtype("bf16", "cpu") == torch.bfloat16


def test_autocast_follows_the_device_type():
    with autocast("cpu", torch.bfloat16):
        assert torch.is_autocast_enabled("cpu")
        out = torch.ones(2, 2) @ torch.ones(2, 2)
    assert out.dtype == torch.bfloat16
    with autocast(torch.device("cpu"), torch.float32):
        assert not torch.is_autocast_enabled("cpu")
    assert to_device(torch.ones(2), "cpu").device.type == "cpu"
