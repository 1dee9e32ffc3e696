"""`bebop bench engine|depth|rl --gamma auto ...`: auto timed beside every static γ in the same interleaved rounds
(speeds are the benchmark's output, not asserted here), and bad --gamma refused."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from bebop.cli import main


def test_bench_engine_times_auto_beside_plain_and_every_static_gamma(tmp_path):
    path = tmp_path / "engine.json"
    code = main(["bench", "engine", "--models", "tiny", "--batch", "2", "--gamma", "auto", "0", "1", "2",
                 "--new-tokens", "8", "--prompt-len", "4", "--repeats", "2", "--threads", "1", "--no-compile",
                 "--no-hf", "--json", str(path)])
    assert code == 0
    records = json.loads(path.read_text())
    cells = {(r["mode"], r["gamma"]) for r in records}
    assert cells == {("plain", 0), ("rs", "auto"), ("to", "auto"), ("rs", 1), ("to", 1), ("rs", 2), ("to", 2)}
    plain = next(r for r in records if r["mode"] == "plain")
    for auto in (r for r in records if r["gamma"] == "auto"):
        static = {r["gamma"]: r for r in records if r["mode"] == auto["mode"] and isinstance(r["gamma"], int)
                  and r["gamma"] > 0}
        over = {g: statistics.median(a / b for a, b in zip(r["round_seconds"], auto["round_seconds"]))
                for g, r in static.items()}
        assert auto["best_static_gamma"] == min(over, key=over.get)
        assert auto["over_best_static"] == pytest.approx(min(over.values()))
        best = [a / b for a, b in zip(static[auto["best_static_gamma"]]["round_seconds"], auto["round_seconds"])]
        assert auto["over_best_static_se"] == pytest.approx(1.2533 * statistics.stdev(best) / math.sqrt(2), rel=1e-4)
        assert auto["speedup"] == pytest.approx(statistics.median(
            a / b for a, b in zip(plain["round_seconds"], auto["round_seconds"])))
        assert sum(auto["gamma_chosen"].values()) > 0 and set(auto["gamma_chosen"]) == {"0", "1", "2"}


def test_bench_depth_times_auto_beside_plain_and_every_static_depth_on_a_task(tmp_path):
    path = tmp_path / "depth.json"
    code = main(["bench", "depth", "--tasks", "math", "--prompts", "1", "--group", "2", "--gamma", "auto", "1", "2",
                 "--max-new-tokens", "12", "--repeats", "2", "--json", str(path)])
    assert code == 0
    records = json.loads(path.read_text())
    assert [r["gamma"] for r in records] == [0, 1, 2, "auto"] and {r["rows"] for r in records} == {2}
    rounds = {r["gamma"]: r["round_seconds_per_token"] for r in records}
    for r in records:
        assert len(r["round_seconds_per_token"]) == 2 and all(s > 0 for s in r["round_seconds_per_token"])
        assert r["speedup"] == pytest.approx(statistics.median(a / b for a, b in zip(rounds[0], rounds[r["gamma"]])))
    auto = records[-1]
    over = {g: statistics.median(a / b for a, b in zip(rounds[g], rounds["auto"])) for g in (1, 2)}
    assert auto["best_static_gamma"] == min(over, key=over.get)
    assert auto["over_best_static"] == pytest.approx(min(over.values()))
    best = [a / b for a, b in zip(rounds[auto["best_static_gamma"]], rounds["auto"])]  # its median's standard error
    assert auto["over_best_static_se"] == pytest.approx(1.2533 * statistics.stdev(best) / math.sqrt(2), rel=1e-4)
    assert set(auto["gamma_chosen"]) == {"0", "1", "2"} and sum(auto["gamma_chosen"].values()) > 0


@pytest.mark.parametrize("flags, named", [(["--repeats", "0"], "--repeats"), (["--prompts", "0"], "--prompts"),
                                          (["--group", "0"], "--group"), (["--gamma", "0"], "--gamma"),
                                          (["--tasks", "nosuch"], "nosuch")])
def test_bench_depth_refuses_bad_input_in_one_line(flags, named, capsys):
    assert main(["bench", "depth", *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and named in err[0]


@pytest.mark.parametrize("argv", [["bench", "engine", "--gamma", "deep"], ["bench", "rl", "--gamma", "auto", "x"],
                                  ["bench", "depth", "--gamma", "auto", "x"],
                                  ["rl", "--gamma", "x"], ["demo", "--gamma", "many"]])
def test_gamma_that_is_neither_an_int_nor_auto_is_argparse_s_error(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--gamma" in err and "'auto'" in err


@pytest.mark.parametrize("argv", [["bench", "rl", "--gamma", "auto", "0"], ["bench", "engine", "--gamma", "0"],
                                  ["bench", "engine", "--gamma", "auto", "-1"], ["demo", "--gamma", "0"]])
def test_gamma_out_of_range_is_one_line_before_loading(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gamma" in err[0]


def test_rl_cli_gamma_auto_reaches_the_config():
    import argparse

    from bebop.commands.rl import add_arguments, config_from_args
    from bebop.rl import RLConfig

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    config = config_from_args(parser.parse_args(["--out", "x", "--gamma", "auto", "--max-gamma", "4"]))
    assert (config.gamma, config.max_gamma, config.online_depth) == ("auto", 4, 4)
    two = config_from_args(parser.parse_args(["--out", "x", "--gamma", "2"]))
    assert (two.gamma, two.mtp_depth, two.online_depth) == (2, None, 2)  # the flag sets γ only; the loss follows it
    with pytest.raises(ValueError, match="vllm"):
        RLConfig(gamma="auto", backend="vllm")
    with pytest.raises(ValueError, match="'auto'"):
        RLConfig(gamma="deep")
