"""`bebop bench train-mtp`: every variant's records from one run, the same loss on the dense and chunked paths, bad
input; `bebop bench memory`: a job's peak.

Times and peaks are not asserted (they are what the bench reports, not what a test checks on a shared CPU); what
is asserted is that each variant measured what it says: the same first loss (the dense and chunked paths are one
function), a peak and a time per step, and a data cache that holds logits for "dense" and hidden states only for
"chunked".
"""

from __future__ import annotations

import json

import pytest
import torch

from bebop.cli import main

TINY = ["--vocab", "300", "--hidden-size", "32", "--seq-len", "24", "--prompt-len", "4", "--depth", "2",
        "--batch-size", "2", "--steps", "2", "--autocast", "fp32"]


def test_one_run_writes_every_variant(tmp_path, capsys):
    path = tmp_path / "train_mtp.json"
    assert main(["bench", "train-mtp", *TINY, "--draft-vocab", "40", "--json", str(path)]) == 0
    out = json.loads(path.read_text())
    dense, chunked, on_s = out["results"]
    assert (dense["variant"], chunked["variant"], on_s["variant"]) == ("dense", "chunked", 40)
    # a draft vocabulary: hidden states [T, d] plus the log-normalisers [T], float32, per sequence
    assert on_s["anchors"] == chunked["anchors"] and on_s["cache_bytes_per_seq"] == 24 * (32 + 1) * 4
    for r in (dense, chunked):
        assert len(r["seconds"]) == len(r["losses"]) == 2 and all(s > 0 for s in r["seconds"])
        assert r["peak_bytes"] >= 0 and r["anchors"] > 0 and r["bf16"] is False
    assert dense["anchors"] == chunked["anchors"]
    for (dense_loss, dense_tv), (chunked_loss, chunked_tv) in zip(dense["losses"], chunked["losses"]):
        assert chunked_loss == pytest.approx(dense_loss, rel=1e-4)
        assert chunked_tv == pytest.approx(dense_tv, rel=1e-4, abs=1e-6)
    # dense caches hidden [T, d] and logits [T, V] per sequence, chunked the hidden states only (fp32 here)
    assert chunked["cache_bytes_per_seq"] == 24 * 32 * 4
    assert dense["cache_bytes_per_seq"] == 24 * (32 + 300) * 4
    assert "peak dense / chunked" in capsys.readouterr().out


def test_each_chunk_size_runs_the_chunked_steps_again_with_the_same_loss(tmp_path, capsys):
    """--chunk-elements: the chunked steps once per chunk size, each in its own process at that size (the first loss
    the same whatever the chunks: they split rows, not the function), dense once."""
    path = tmp_path / "chunks.json"
    assert main(["bench", "train-mtp", *TINY, "--draft-vocab", "40", "--chunk-elements", "4096", "64",
                 "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["results"]
    assert [(r["variant"], r["chunk_elements"]) for r in rows] == [
        ("dense", 4096), ("chunked", 4096), (40, 4096), ("chunked", 64), (40, 64)]
    for big, small in ((rows[1], rows[3]), (rows[2], rows[4])):
        assert small["losses"][0][0] == pytest.approx(big["losses"][0][0], rel=1e-5)
    out = capsys.readouterr().out
    assert "chunked: time at 64 elements per chunk / at 4,096" in out and "draft vocab 40: time at 64" in out


@pytest.mark.parametrize("args, match", [
    (["--vocab", "0"], "--vocab must be >= 1"),
    (["--seq-len", "8", "--prompt-len", "4", "--depth", "5"], "--seq-len 8 leaves no anchor"),
    (["--objective", "mse"], "--objective 'mse' is not one of"),
    pytest.param(["--device", "cuda"], "CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    (["--hidden-size", "7"], "--hidden-size must be an even number"),
    (["--vocab", "300", "--draft-vocab", "301"], "--draft-vocab sizes must lie in 1..--vocab (300)"),
    (["--chunk-elements", "0"], "--chunk-elements must each be >= 1"),
])
def test_bad_arguments_are_one_line_and_exit_2(args, match, capsys):
    assert main(["bench", "train-mtp", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err, err


def test_bench_memory_reports_each_jobs_peak_and_refuses_a_job_without_its_separator(capsys):
    from bebop.commands.bench.memory import measure, split_jobs

    assert split_jobs(["--", "rl", "--steps", "1", "--", "demo"]) == [["rl", "--steps", "1"], ["demo"]]
    with pytest.raises(ValueError, match="after `--`"):
        split_jobs(["rl"])
    with pytest.raises(ValueError, match="at least one job"):
        split_jobs(["--"])
    ok, bad = measure(["--help"]), measure(["no-such-command"])
    assert ok["returncode"] == 0 and ok["peak_bytes"] > 10 * 2**20  # a Python process with argparse loaded
    assert bad["returncode"] == 2
