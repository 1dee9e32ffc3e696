"""Data parallelism under torchrun on CPU (gloo): bebop rl and bebop train-mtp on 2 ranks, one update equal to the
single-process update, and kill -9 of one rank then --resume losing and repeating no step.

Each torchrun run takes seconds to tens of seconds on 2 cores (OMP_NUM_THREADS=1 per rank, torchrun's default)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from scratch import scratch

from bebop import distributed
from bebop.rl.parallel import check_world, combine_records, rank_block, rank_seed

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


def torchrun(*args: str, wait: bool = True, timeout: float = 240):
    """`torchrun --standalone --nproc-per-node 2 ARGS` with this checkout on the path; the finished process (or the
    running Popen when wait=False)."""
    # its own empty directory: the job must not see the checkout's runs/ (tests/conftest.py); torchrun's own
    # temporary files go there too, removed with the test process's scratch
    cwd = scratch("torchrun-")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{TESTS}", "TMPDIR": str(cwd)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    if not wait:
        return proc
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out[-4000:]
    return out


def steps_of(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of the launcher's worker with RANK=rank (its environ names it)."""
    children = Path(f"/proc/{launcher}/task/{launcher}/children")
    for pid in map(int, children.read_text().split() if children.exists() else []):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in environ:
            return pid
    return None


def kill_rank_after(proc, rank: int, ready, timeout: float = 180) -> None:
    """Once `ready()` holds, kill -9 the worker of `rank`; the launcher then stops the other and fails."""
    deadline = time.time() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before it could be killed: {proc.stdout.read()[-3000:]}"
        assert time.time() < deadline, "the run never reached the kill point"
        time.sleep(0.2)
    pid = rank_pid(proc.pid, rank)
    assert pid is not None, "no worker with that rank"
    os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0


def checkpoint_step(path: Path) -> int:
    if not path.exists():
        return -1
    try:
        return int(torch.load(path, weights_only=True)["step"])
    except Exception:  # replaced while read: atomically, so the next poll reads it whole
        return -1


# --------------------------------------------------------------------------------------------------- units
def test_rank_blocks_in_rank_order_are_the_global_batch():
    rows = list(range(12))
    assert sum((rank_block(rows, r, 3) for r in range(3)), []) == rows
    assert rank_block(rows, 1, 2) == list(range(6, 12))
    assert rank_seed(5, 0) == 5 and rank_seed(5, 1) != 5


def test_prompts_that_do_not_split_over_the_ranks_are_one_error_line():
    check_world(8, 2)
    with pytest.raises(ValueError, match="does not split over 3 ranks"):
        check_world(8, 3)


def test_ranks_that_logged_other_depths_and_bins_combine(monkeypatch):
    """Under γ auto each rank's engine chooses its own depths, and a rank logs only the entropy bins it filled: a
    counter one rank lacks is a 0 there, not a KeyError that stops the run."""
    ranks = [({"step": 3, "spec/num_gamma_chosen/2": 5, "spec/by_entropy/0/num_draft_tokens": 4, "actor/entropy": 1.0,
               "timing_s/gen": 2.0}, [1.0], 10),
             ({"step": 3, "spec/num_gamma_chosen/3": 7, "engine/cost/12/3/steps": 2, "actor/entropy": 2.0,
               "timing_s/gen": 3.0}, [0.0], 30)]
    monkeypatch.setattr(distributed, "all_gather_object", lambda obj: ranks)
    out = combine_records(ranks[0][0], torch.ones(1), 10)
    assert out["spec/num_gamma_chosen/2"] == 5 and out["spec/num_gamma_chosen/3"] == 7
    assert out["spec/by_entropy/0/num_draft_tokens"] == 4 and out["engine/cost/12/3/steps"] == 2
    assert (out["step"], out["actor/entropy"], out["timing_s/gen"], out["critic/score/mean"]) == (3, 1.75, 3.0, 0.5)


def test_one_process_is_world_one_and_helpers_are_the_identity():
    assert not distributed.active() and distributed.world() == 1 and distributed.is_main()
    record = {"step": 0, "actor/loss": 0.5}
    assert combine_records(record, torch.ones(2), 3) is record
    assert float(distributed.all_reduce(2.0)) == 2.0 and distributed.all_gather_object("x") == ["x"]


# --------------------------------------------------------------------------------------------------- torchrun
@pytest.mark.parametrize("mtp", ["frozen", "online-tv", "knobs"])
def test_one_update_on_two_ranks_equals_the_single_process_update(tmp_path, mtp):
    import dist_update

    torchrun(str(TESTS / "dist_update.py"), str(tmp_path / "two.pt"), mtp)
    two = torch.load(tmp_path / "two.pt", weights_only=True)
    one = dist_update.update(str(tmp_path / "one"), mtp)
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-5, abs=1e-7)
    assert two["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    assert one["grad_norm"] > dist_update.CONFIG.grad_clip  # the clip acted, with the global norm
    assert set(two["grads"]) == set(one["grads"])
    for name, grad in one["grads"].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(two["grads"][name], grad, rtol=1e-4, atol=1e-7, msg=name)
        torch.testing.assert_close(two["params"][name], one["params"][name], rtol=1e-5, atol=1e-7, msg=name)
    if mtp == "knobs":
        return check_knobs(one, two)
    if mtp == "frozen":
        return
    # The online head: trained on each rank's rows, its gradients summed, the step of one process on all rows.
    for key in ("loss", "grad_norm", "d_tv"):
        assert two["head"][key] == pytest.approx(one["head"][key], rel=1e-5), key
    assert one["head"]["grad_norm"] > 0.05  # the head's clip acted too, with the global norm
    for name, grad in one["head"]["grads"].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(two["head"]["grads"][name], grad, rtol=1e-4, atol=1e-7, msg=name)
        # Adam's first step is lr·g/(|g| + eps): where |g| is near eps (1e-8) float noise in g moves it, so the
        # updated weights agree to a small fraction of one step (mtp_lr = 1e-2), not to float precision.
        torch.testing.assert_close(two["head"]["params"][name], one["head"]["params"][name], rtol=1e-5, atol=1e-4,
                                   msg=name)


def check_knobs(one: dict, two: dict) -> None:
    """The entropy bonus and the shadow heads on two ranks: the global entropy the adaptive rule read, the coefficient
    the second update applied, every shadow counter and the online shadow head's step, as in one process."""
    assert one["entropy"]["applied"] == pytest.approx(0.055)  # the first update's global entropy was below the target
    for key in ("current", "applied", "coef", "last_entropy"):
        assert two["entropy"][key] == pytest.approx(one["entropy"][key], rel=1e-5), key
    assert [(r["head"], r["rule"]) for r in two["shadow"]] == [(r["head"], r["rule"]) for r in one["shadow"]]
    for mine, theirs in zip(two["shadow"], one["shadow"]):
        assert set(mine) == set(theirs)
        for key, value in theirs.items():
            assert mine[key] == (value if isinstance(value, str) else pytest.approx(value, rel=1e-5, nan_ok=True)), key
    for name, param in one["shadow_params"].items():
        torch.testing.assert_close(two["shadow_params"][name], param, rtol=1e-5, atol=1e-4, msg=name)


def test_rl_on_two_ranks_logs_each_step_once_and_checkpoints(tmp_path):
    out = tmp_path / "run"
    torchrun("-m", "bebop", "rl", "--preset", "quick", "--steps", "2", "--gamma", "3", "--out", str(out),
             "--no-progress")  # a static γ: every step drafts
    assert steps_of(out / "train.jsonl") == [0, 1]
    assert set(steps_of(out / "samples.jsonl")) == {0, 1}
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "meta.json", "samples.jsonl", "status.json",
                                                    "train.jsonl"]
    state = torch.load(out / "checkpoint.pt", weights_only=True)
    assert state["step"] == 1 and state["world_size"] == 2
    record = json.loads((out / "train.jsonl").read_text().splitlines()[0])
    # The record is the global batch's: 8 prompts x 4 completions drafted over both ranks.
    assert record["spec/num_drafts"] > 0 and 0 <= record["critic/score/mean"] <= 1


def test_rl_kill_one_rank_then_resume_loses_and_repeats_no_step(tmp_path):
    out = tmp_path / "run"
    args = ["-m", "bebop", "rl", "--preset", "quick", "--steps", "5", "--checkpoint-every", "1", "--sync",
            "--out", str(out), "--no-progress"]
    proc = torchrun(*args, wait=False)
    kill_rank_after(proc, 1, lambda: checkpoint_step(out / "checkpoint.pt") >= 1)
    done = steps_of(out / "train.jsonl")
    assert done and done[-1] < 4 and done == list(range(len(done)))
    torchrun(*args, "--resume")
    assert steps_of(out / "train.jsonl") == [0, 1, 2, 3, 4]
    assert json.loads((out / "status.json").read_text())["state"] == "finished"


# --------------------------------------------------------------------------------------------------- train-mtp
MTP_ARGS = ["train-mtp", "--tasks", "math", "--num-sequences", "16", "--max-new-tokens", "24", "--depth", "3",
            "--batch-size", "4", "--eval-every", "5", "--checkpoint-every", "1", "--autocast", "fp32"]


def train_mtp(run_dir: Path, *args: str) -> list[dict]:
    """One process: `bebop train-mtp MTP_ARGS ARGS --run-dir run_dir`; the train stream's records."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "bebop", *MTP_ARGS, *args, "--run-dir", str(run_dir)]
    done = subprocess.run(cmd, env=env, cwd=run_dir.parent, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (run_dir / "train.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def mtp_single(tmp_path_factory) -> list[dict]:
    return train_mtp(tmp_path_factory.mktemp("mtp") / "single", "--steps", "6")


def test_train_mtp_resume_continues_as_the_uninterrupted_run(tmp_path, mtp_single):
    first = train_mtp(tmp_path / "run", "--steps", "3")
    assert [r["step"] for r in first] == [0, 1, 2]
    resumed = train_mtp(tmp_path / "run", "--steps", "6", "--resume")
    assert [r["step"] for r in resumed] == list(range(6))
    assert resumed == [{**r, **{k: pytest.approx(v, rel=1e-6) for k, v in r.items()}} for r in mtp_single]


def test_train_mtp_on_two_ranks_steps_as_one_process(tmp_path, mtp_single):
    out = tmp_path / "run"
    torchrun("-m", "bebop", *MTP_ARGS, "--steps", "6", "--run-dir", str(out))
    two = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [r["step"] for r in two] == list(range(6))
    assert torch.load(out / "checkpoint.pt", weights_only=True)["step"] == 5
    # The first update: the same global batch, loss and gradient norm (before clipping) as one process's.
    for key in ("mtp/loss/e2e_tv", "mtp/d_tv_mean", "mtp/grad_norm"):
        assert two[0][key] == pytest.approx(mtp_single[0][key], rel=1e-5), key
    assert two[-1]["mtp/loss/e2e_tv"] == pytest.approx(mtp_single[-1]["mtp/loss/e2e_tv"], rel=1e-3)


def test_train_mtp_kill_one_rank_then_resume_loses_and_repeats_no_step(tmp_path):
    out = tmp_path / "run"
    args = ["-m", "bebop", *MTP_ARGS, "--steps", "40", "--run-dir", str(out)]
    proc = torchrun(*args, wait=False)
    kill_rank_after(proc, 1, lambda: checkpoint_step(out / "checkpoint.pt") >= 1)
    done = steps_of(out / "train.jsonl")
    assert done and done[-1] < 39 and done == list(range(len(done)))
    torchrun(*args, "--resume")
    assert steps_of(out / "train.jsonl") == list(range(40))
    assert json.loads((out / "status.json").read_text())["state"] == "finished"
