"""The GRPO trainer (bebop.rl): learning signal, lossless MTP rollouts, strategies, async, resume, bad input.

Runs on a 2-layer random-init policy and a toy task (reward = fraction of digits in the completion), which
a working gradient lifts within a dozen steps and a broken one cannot; each run takes about a second."""

import copy
import inspect
import json
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from claim_stats import K, pooled_sd, t_margin

from bebop.commands.rl import add_arguments, config_from_args
from bebop.data.tasks import Example
from bebop.data.tokenizer import CharTokenizer
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig, Rollout
from bebop.engine.stops import Stop
from bebop.files import checkpoint_path
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.rl import OnlineMTP, RLConfig, build_trainer
from bebop.rl.batch import Rollouts, align, sample_examples
from bebop.rl.grpo import group_advantages, grpo_loss, token_logprobs
from bebop.rl.shared_prompt import micro_batches, prompt_groups
from bebop.rl.alerts import SILENT_GROUPS
from bebop.runlog import load_run


class Digits:
    """Toy task: any prompt; reward = fraction of completion characters that are digits."""

    name = "digits"
    levels = (1,)
    stop_strings = ("<eos>",)
    env = None

    def sample(self, n, seed, level=None):
        return [Example(prompt=f"go {(seed + i) % 7}:\n", answer=0, level=1, task="digits") for i in range(n)]

    def rewards(self, examples, completions):
        return [sum(c.isdigit() for c in s) / max(len(s), 1) for s in completions]


MODEL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, max_position_embeddings=512)


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


@pytest.fixture(scope="module")
def pair(tok):
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tok.vocab_size, **MODEL)
    return Transformer(config), MTPHead(config)


def train(pair, tok, tmp_path, name, **overrides):
    model, head = pair
    config = RLConfig.tiny(**{"prompts_per_step": 4, "group_size": 4, "max_new_tokens": 16, **overrides})
    trainer = build_trainer(config, model, tok, head=head, run_dir=tmp_path / name, task=Digits())
    return trainer, trainer.run()


def rewards(records):
    return [r["critic/score/mean"] for r in records]


def reward_window(trainer, records) -> tuple[float, float]:
    """Mean reward over these steps and its sampling standard error: a step's mean over its n completions has SE
    std/sqrt(n-1) (critic/score/std is the population std of the step's rewards)."""
    n = trainer.config.prompts_per_step * trainer.config.group_size
    mean = sum(rewards(records)) / len(records)
    return mean, math.sqrt(sum(r["critic/score/std"] ** 2 / (n - 1) for r in records)) / len(records)


def minus(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    """(value, SE) of a - b for independent measurements."""
    return a[0] - b[0], math.hypot(a[1], b[1])


# ------------------------------------------------------------------------------------- learning signal
def test_grpo_raises_reward_where_a_zero_learning_rate_does_not(pair, tok, tmp_path):
    """A working gradient lifts the reward by many sampling standard errors; at lr=0 nothing moves beyond them.

    Measured over seeds 0-15: the last 4 of 20 steps minus the first 4 rise 0.43 (run-to-run SD 0.08, lowest 0.26),
    against K·SE ~0.07, so a run falls under the bar only 4 run-to-run SDs below the mean (at 14 steps the rise was
    0.18 ± 0.05 against the same bar: too close). At lr=0 the difference is pure sampling noise, |z| < 1.6."""
    learner, learn = train(pair, tok, tmp_path, "learn", steps=20, lr=1e-2, method="rs")
    stiller, still = train(pair, tok, tmp_path, "still", steps=20, lr=0.0, method="rs")
    rise = minus(reward_window(learner, learn[-4:]), reward_window(learner, learn[:4]))
    gap = minus(reward_window(learner, learn[-4:]), reward_window(stiller, still[-4:]))
    drift = minus(reward_window(stiller, still[-4:]), reward_window(stiller, still[:4]))
    assert rise[0] > K * rise[1], (rise, rewards(learn))
    assert gap[0] > K * gap[1], (gap, rewards(learn), rewards(still))
    assert abs(drift[0]) < K * drift[1], (drift, rewards(still))  # lr=0: nothing moves


def test_mtp_rollouts_leave_reward_curves_statistically_unchanged(pair, tok, tmp_path):
    """Lossless rollouts: plain vs RS vs TO reach the same rewards within noise.

    A run's mean reward over its 10 steps is one measurement. Runs with other seeds learn apart, so they spread
    more than the sampling noise within one run (seeds 0-15: SD 0.012-0.017 between runs, 2.5x): the SE comes from
    that spread, pooled over the three rollouts (4 seeds each, 9 df), with Student's t margin for 9 df. Measured
    (seeds 0-3): plain - RS +0.009, plain - TO +0.015, SE 0.008, margin 0.038. Over 16 seeds plain stays ahead by
    0.010 (RS) and 0.010 (TO) with SE 0.005-0.006: not resolved, and well inside the margin."""
    seeds = range(4)
    curves = {rollout: [sum(rewards(train(pair, tok, tmp_path, f"{rollout}-{seed}", steps=10, lr=1e-2, method=rollout,
                                          seed=seed)[1])) / 10 for seed in seeds]
              for rollout in ("none", "rs", "to")}
    sd, df = pooled_sd(list(curves.values()))
    se = sd * math.sqrt(2 / len(seeds))
    for rollout in ("rs", "to"):
        diff = (sum(curves["none"]) - sum(curves[rollout])) / len(seeds)
        assert abs(diff) < t_margin(df) * se, (rollout, diff, se, curves)


def test_frozen_head_is_bit_identical_and_online_head_moves(pair, tok, tmp_path):
    model, head = pair
    before = {k: v.clone() for k, v in head.state_dict().items()}
    frozen, recs = train(pair, tok, tmp_path, "frozen", steps=3, lr=1e-2, mtp="frozen")
    for k, v in frozen.head.state_dict().items():
        assert torch.equal(v, before[k]), k
    assert all(r["mtp/online_update"] == 0 for r in recs)
    for strategy, objective in (("online-tv", "e2e_tv"), ("online-ce", "ce")):
        online, recs = train(pair, tok, tmp_path, strategy, steps=3, lr=1e-2, mtp=strategy, mtp_lr=1e-2)
        assert any(not torch.equal(v, before[k]) for k, v in online.head.state_dict().items())
        assert all(r["mtp/online_update"] == 1 and f"mtp/loss/{objective}" in r for r in recs)
        assert 0 <= recs[-1]["mtp/d_tv_mean"] <= 1
    for k, v in head.state_dict().items():  # the caller's head is never modified
        assert torch.equal(v, before[k])


def test_online_draft_loss_never_reaches_the_policy(pair, tok):
    model, head = pair
    policy, draft = Transformer(model.config), MTPHead(model.config)
    policy.load_state_dict(model.state_dict())
    draft.load_state_dict(head.state_dict())
    online = OnlineMTP(draft, "online-tv", lr=1e-2, grad_clip=1.0, depth=2)
    tokens = torch.randint(0, tok.vocab_size, (3, 20))
    _, hidden = policy(tokens)  # with grad: the head must detach it
    stats = online.update(policy, hidden, tokens, torch.tensor([20, 18, 15]), torch.tensor([4, 4, 4]))
    assert stats["mtp/online_update"] == 1
    assert all(p.grad is None for p in policy.parameters())
    assert any(p.grad is not None for p in draft.parameters())
    torch.testing.assert_close(policy.state_dict(), model.state_dict())
    with pytest.raises(ValueError, match="unknown MTP strategy"):
        OnlineMTP(draft, "online-kl", lr=1e-3, grad_clip=1.0, depth=2)


# ----------------------------------------------------------------------------------------------- async
def test_async_trains_on_one_step_stale_behaviour_logprobs_and_overlaps(pair, tok, tmp_path):
    _, sync = train(pair, tok, tmp_path, "sync", steps=5, lr=1e-2, mode="sync")
    _, asyn = train(pair, tok, tmp_path, "async", steps=5, lr=1e-2, mode="async")
    assert [r["staleness"] for r in sync] == [0] * 5
    assert [r["staleness"] for r in asyn] == [0] + [1] * 4
    assert [r["policy_version"] for r in asyn] == [0, 0, 1, 2, 3]
    # Sync: behaviour = current policy (fp32), ratio 1 up to rounding. Async: the ratio sees the last update.
    sync_kl = max(abs(r["actor/ppo_kl"]) for r in sync)
    async_kl = max(abs(r["actor/ppo_kl"]) for r in asyn[1:])
    assert sync_kl < 1e-4 and async_kl > 20 * max(sync_kl, 1e-6), (sync_kl, async_kl)
    assert sum(r["timing_s/overlap"] for r in asyn) > 0  # generation really ran during the update
    assert all(r["timing_s/overlap"] == 0 for r in sync)


def test_update_uses_the_batch_behaviour_logprobs(pair, tok, tmp_path):
    model, head = pair
    trainer = build_trainer(RLConfig.tiny(method="none", lr=0.0), model, tok, run_dir=tmp_path / "u", task=Digits())
    batch = trainer._generate(0, 0)
    exact = trainer.update(batch).metrics["actor/ppo_kl"]
    batch.behaviour_logprobs = batch.behaviour_logprobs - 0.5 * batch.policy_mask
    assert trainer.update(batch).metrics["actor/ppo_kl"] == pytest.approx(exact - 0.5, abs=1e-4)
    trainer.writer.close()


class Ragged(Digits):
    """Digits with prompts of different lengths, so a micro-batch pads prompts as well as completions."""

    def sample(self, n, seed, level=None):
        return [Example(prompt=f"go {'x' * ((seed + i) % 5)}{i}:\n", answer=0, level=1, task="digits")
                for i in range(n)]


def padded_row_step(policy, head, batch, config, reference=None):
    """The update written the plain way, on the padded [N, L] rows: (loss, grad norm, policy grads, head grads,
    head record). Like the trainer, it steps the policy before the online head trains on its activations."""
    logits, hidden = policy(batch.tokens)
    ref_logprobs = None if reference is None else token_logprobs(reference(batch.tokens)[0][:, :-1], batch.targets)
    loss, _ = grpo_loss(token_logprobs(logits[:, :-1], batch.targets), batch.behaviour_logprobs,
                        group_advantages(batch.rewards, config.group_size), batch.policy_mask, clip_eps=config.clip_eps,
                        ref_logprobs=ref_logprobs, kl_coef=config.kl_coef)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), config.grad_clip)
    torch.optim.AdamW(policy.parameters(), lr=config.lr, weight_decay=0.0).step()  # the head reads the new LM head
    online = OnlineMTP(head, config.mtp, lr=config.mtp_lr, grad_clip=config.mtp_grad_clip, depth=config.online_depth)
    mtp = online.update(policy, hidden.detach(), batch.tokens, batch.lengths, batch.prompt_lengths)
    grads = lambda module: {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}  # noqa: E731
    return float(loss.detach()), float(grad_norm), grads(policy), grads(head), mtp


@pytest.mark.parametrize("share, budget, mtp, kl", [(True, 0, "frozen", 0.0), (True, 60, "online-tv", 0.0),
                                                     (False, 40, "frozen", 0.0), (True, 60, "frozen", 0.5)])
def test_update_equals_the_step_on_the_padded_rows(pair, tok, tmp_path, share, budget, mtp, kl):
    """Shared prompts and micro-batches compute less, not something else: the loss, the gradient (after
    clipping), the stats, the KL to the reference and the online head's step equal the plain update on the
    padded rows."""
    model, head = pair
    config = RLConfig.tiny(method="rs", mtp=mtp, mtp_lr=1e-2, prompts_per_step=4, group_size=4, max_new_tokens=16,
                           lr=1e-2, micro_batch_tokens=budget, share_prompts=share, kl_coef=kl)
    trainer = build_trainer(config, model, tok, head=head, run_dir=tmp_path / "u", task=Ragged())
    if kl:  # a reference away from the policy, so the KL term and its gradient are not zero
        with torch.no_grad():
            for p in trainer.reference.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    batch = trainer._generate(0, 0)
    assert len(set(batch.lengths.tolist())) > 1 and len(set(batch.prompt_lengths.tolist())) > 1  # ragged both ways
    groups = prompt_groups(batch.prompts) if share else [[i] for i in range(len(batch.prompts))]
    parts = micro_batches(groups, batch.prompt_lengths.tolist(), batch.lengths.tolist(), budget)
    assert len(parts) >= (3 if budget else 1) and len(groups) == (4 if share else 16)
    loss, grad_norm, policy_grads, head_grads, mtp_record = padded_row_step(
        copy.deepcopy(trainer.policy), copy.deepcopy(trainer.head), batch, config, trainer.reference)
    record = trainer.update(batch).metrics
    assert (record["actor/kl_ref"] > 1e-4) == bool(kl)
    assert record["actor/loss"] == pytest.approx(loss, rel=1e-4, abs=1e-6)  # a sum near cancellation
    assert record["actor/grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    assert record["actor/ppo_kl"] < 1e-5 and record["actor/clip_frac"] == 0  # behaviour = this policy (fp32)
    torch.testing.assert_close({n: p.grad for n, p in trainer.policy.named_parameters()}, policy_grads,
                               rtol=1e-4, atol=1e-7)
    if mtp != "frozen":
        assert record["mtp/loss/e2e_tv"] == pytest.approx(mtp_record["mtp/loss/e2e_tv"], rel=1e-5)
        torch.testing.assert_close({n: p.grad for n, p in trainer.head.named_parameters()}, head_grads,
                                   rtol=1e-4, atol=1e-7)
    trainer.writer.close()


def test_bf16_update_runs_under_autocast_with_an_online_head(pair, tok, tmp_path):
    model, head = pair
    config = RLConfig.tiny(method="rs", mtp="online-ce", prompts_per_step=2, group_size=2, dtype="bf16",
                           micro_batch_tokens=30)
    trainer = build_trainer(config, model, tok, head=head, run_dir=tmp_path / "b", task=Ragged())
    record = trainer.update(trainer._generate(0, 0)).metrics
    assert record["mtp/online_update"] == 1 and math.isfinite(record["actor/loss"])
    trainer.writer.close()


def test_micro_batches_hold_whole_groups_within_the_budget():
    prompt_lengths = [4, 4, 9, 9, 2, 2, 6]
    lengths = [10, 20, 12, 30, 3, 5, 40]
    groups = prompt_groups([[1] * 4, [1] * 4, [2] * 9, [2] * 9, [3] * 2, [3] * 2, [4] * 6])
    assert groups == [[0, 1], [2, 3], [4, 5], [6]]
    cost = lambda part: len(part) * max(prompt_lengths[g[0]] for g in part) + sum(map(len, part)) * max(  # noqa: E731
        lengths[i] - prompt_lengths[i] for g in part for i in g)
    for budget in (0, 1, 50, 80, 120, 1000):
        parts = micro_batches(groups, prompt_lengths, lengths, budget)
        assert sorted(map(tuple, (g for part in parts for g in part))) == sorted(map(tuple, groups))
        assert [max(lengths[i] for i in g) for part in parts for g in part] == [40, 30, 20, 5]  # longest first
        assert all(budget == 0 or len(part) == 1 or cost(part) <= budget for part in parts), (budget, parts)
    assert micro_batches(groups, prompt_lengths, lengths, 0) == [[[6], [2, 3], [0, 1], [4, 5]]]
    assert micro_batches(groups, prompt_lengths, lengths, 80) == [[[6]], [[2, 3]], [[0, 1], [4, 5]]]
    assert micro_batches(groups, prompt_lengths, lengths, 120) == [[[6], [2, 3]], [[0, 1], [4, 5]]]  # 2*9 + 3*34
    assert micro_batches([], [], [], 10) == []
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="max_tokens"):
            micro_batches(groups, prompt_lengths, lengths, bad)
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        RLConfig.tiny(micro_batch_tokens=-5)
    with pytest.raises(ValueError, match="share_prompts"):
        RLConfig.tiny(share_prompts="yes")


# ------------------------------------------------------------------------------------- logs and shapes
def test_streams_hold_the_design_names_and_samples(pair, tok, tmp_path):
    trainer, _ = train(pair, tok, tmp_path, "logs", steps=2, method="rs", samples_per_step=3)
    run = load_run(tmp_path / "logs")
    train_rows, samples = run.streams["train"], run.streams["samples"]
    for key in ("critic/score/mean", "actor/entropy", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl",
                "response_length/mean", "timing_s/gen", "timing_s/update_actor", "timing_s/step",
                "perf/throughput", "spec/num_drafts", "spec/num_accepted_tokens_per_pos/0", "spec/accept_length",
                "spec/by_entropy/0/num_draft_tokens", "mtp/online_update", "critic/groups_with_signal"):
        assert key in train_rows.columns, key
    assert list(train_rows["step"]) == [0, 1] and run.status["state"] == "finished"
    assert list(samples.groupby("step").size()) == [3, 3]
    row = samples.iloc[0]
    assert len(row["pieces"]) == len(row["origin"]) == len(row["entropy"])
    assert set(row["origin"]) <= {"plain", "accepted", "recovered", "bonus", "env"}


class Unsolvable(Digits):
    """Every completion scores 0: no group carries a GRPO signal."""

    def rewards(self, examples, completions):
        return [0.0] * len(completions)


def test_a_run_without_reward_signal_says_so_once(pair, tok, tmp_path, capsys):
    """Warned once, when the run's first SILENT_GROUPS groups all scored alike, into the run's warnings and on stderr
    as one clean line (no Python warning glued to a progress bar); fewer such groups are ordinary GRPO."""
    model, head = pair
    few = RLConfig.tiny(prompts_per_step=2, group_size=2, max_new_tokens=8, steps=2)  # 4 groups in all
    records = build_trainer(few, model, tok, head=head, run_dir=tmp_path / "few", task=Unsolvable()).run()
    assert [r["critic/groups_with_signal"] for r in records] == [0.0, 0.0]
    assert "warnings" not in load_run(tmp_path / "few").streams and capsys.readouterr().err == ""
    many = RLConfig.tiny(prompts_per_step=SILENT_GROUPS // 2, group_size=2, max_new_tokens=8, steps=3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Python warning: the run's own record and one line say it
        build_trainer(many, model, tok, head=head, run_dir=tmp_path / "many", task=Unsolvable()).run(progress=True)
    warned = load_run(tmp_path / "many").streams["warnings"]
    assert list(warned["step"]) == [1] and list(warned["source"]) == ["no_signal"]  # once per run, not every step
    assert f"none of the run's first {SILENT_GROUPS} prompt groups" in warned["message"][0]
    lines = [line for line in capsys.readouterr().err.splitlines() if "scored differently" in line]
    assert len(lines) == 1 and lines[0].lstrip("\r ").startswith("bebop: warning (many, step 1): none of")


def test_align_masks_prompt_padding_and_env_tokens():
    prompts = [[5, 6, 7], [5]]
    rollout = Rollout(tokens=[[10, 11, 12], [20]], logprobs=[[-1.0, 0.0, -3.0], [-2.0]],
                      entropy=[[0.1, 0.0, 0.3], [0.2]], origin=[["plain", "env", "accepted"], ["plain"]],
                      finish_reason=["stop", "length"], stops=[Stop(), None])
    tokens, lengths, prompt_lengths, targets, mask, logprobs = align(prompts, rollout, pad_id=0)
    assert tokens.tolist() == [[5, 6, 7, 10, 11, 12], [5, 20, 0, 0, 0, 0]]
    assert lengths.tolist() == [6, 2] and prompt_lengths.tolist() == [3, 1]
    assert mask.tolist() == [[False, False, True, False, True], [True, False, False, False, False]]
    assert logprobs[0, 2] == -1.0 and logprobs[0, 4] == -3.0 and logprobs[1, 0] == -2.0
    assert torch.equal(targets, tokens[:, 1:])


def test_agent_rollouts_are_multi_turn_with_env_tokens_masked(pair, tok):
    from bebop.data.tasks import get

    model, _ = pair
    task = get("agent")
    examples = sample_examples(task, 2, 2, seed=0)
    # A policy that always closes a tool call right away: every stop gets an environment reply.
    close = tok.token_id("</call>")
    with torch.no_grad():
        bias = torch.full((tok.vocab_size,), -30.0)
        bias[close] = 30.0
        forced = Transformer(model.config)
        forced.load_state_dict(model.state_dict())
        forced.lm_head = torch.nn.Linear(model.config.hidden_size, tok.vocab_size)
        forced.lm_head.weight.zero_()
        forced.lm_head.bias.copy_(bias)
    engine = Engine(forced.eval(), None)
    batch = Rollouts(engine, task, tok).collect(examples, GenerationConfig(max_new_tokens=40, gamma=0, seed=0))
    origins = batch.rollout.origin[0]
    assert "env" in origins and origins[0] == "plain"
    text = batch.completions[0]
    assert text.startswith("</call><result>")
    env_positions = [i for i, o in enumerate(origins) if o == "env"]
    P = len(batch.prompts[0])
    assert not batch.policy_mask[0, [P - 1 + i for i in env_positions]].any()
    assert batch.policy_mask[0, P - 1]


# ---------------------------------------------------------------------------------------------- resume
SCRIPT = "from bebop.data.tasks import Example\n" + inspect.getsource(Digits) + '''
import sys, torch
from bebop.models.config import ModelConfig
from bebop.models.transformer import Transformer
from bebop.models.mtp import MTPHead
from bebop.rl import RLConfig, build_trainer
from bebop.data.tokenizer import CharTokenizer
tok = CharTokenizer()
torch.manual_seed(0)
config = ModelConfig.tiny(vocab_size=tok.vocab_size, **{model})
model, head = Transformer(config), MTPHead(config)
rl = RLConfig.tiny(steps=int(sys.argv[2]), prompts_per_step=4, group_size=4, max_new_tokens=24, lr=1e-2,
                   checkpoint_every=3, samples_per_step=2)
build_trainer(rl, model, tok, head=head, run_dir=sys.argv[1], task=Digits(), resume=sys.argv[3] == "resume").run()
'''.replace("{model}", repr(MODEL))


def _lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_sigkill_mid_run_then_resume_logs_every_step_exactly_once(tmp_path):
    script, run_dir, steps = tmp_path / "job.py", tmp_path / "run", 16
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    job = subprocess.Popen([sys.executable, str(script), str(run_dir), str(steps), "new"], env=env)
    deadline = time.time() + 60
    while _lines(run_dir / "train.jsonl") < 5 and job.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.05)  # somewhere inside a step
    job.send_signal(signal.SIGKILL)
    job.wait()
    logged = _lines(run_dir / "train.jsonl")
    assert 5 <= logged < steps, "the job must be killed mid-run"
    assert checkpoint_path(run_dir).exists()
    subprocess.run([sys.executable, str(script), str(run_dir), str(steps), "resume"], env=env, check=True, timeout=120)
    run = load_run(run_dir)
    assert list(run.streams["train"]["step"]) == list(range(steps))
    assert run.streams["samples"].groupby("step").size().tolist() == [2] * steps
    assert run.status["state"] == "finished" and run.skipped_lines == 0
    assert len(run.meta["resumes"]) == 1


# ------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize("field, value, match", [("task", "chess", "unknown task"), ("mtp", "online-kl", "unknown mtp"),
                                                 ("rollout", "eagle", "unknown rollout"), ("mode", "lazy", "unknown mode"),
                                                 ("group_size", 1, "group_size")])
def test_config_rejects_bad_names(field, value, match):
    with pytest.raises(ValueError, match=match):
        RLConfig.tiny(**{field: value})
    with pytest.raises(ValueError, match="unknown preset"):
        RLConfig.preset("huge")
    with pytest.raises(ValueError, match="needs rollout"):
        RLConfig.tiny(method="none", mtp="online-tv")


def test_the_rollout_method_keeps_its_earlier_name():
    """RLConfig.method was RLConfig.rollout: the presets, replace() and a saved config (config.json, a checkpoint's)
    still read the earlier name, and a run saved under it resumes."""
    from bebop.runlog.session import config_changes

    config = RLConfig.tiny(rollout="to")
    assert config.method == "to" and config.replace(rollout="none").method == "none"
    saved = {("rollout" if k == "method" else k): v for k, v in config.to_dict().items()}
    assert "rollout" in saved and RLConfig.from_dict(saved) == config
    # steps may change on resume; the renamed key is no change
    assert config_changes(saved, config.replace(steps=9), RLConfig.RESUMABLE) == ({"steps": (3, 9)}, {})
    assert config_changes(saved, config.replace(method="rs"), RLConfig.RESUMABLE) == ({}, {"method": ("to", "rs")})


def test_cli_rejects_bad_names_before_loading_a_model(tmp_path):
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--task", "chess", "--out", str(tmp_path / "x")])
    with pytest.raises(ValueError, match="unknown task 'chess'"):
        config_from_args(args)
    args = parser.parse_args(["--out", str(tmp_path / "x"), "--sync", "--rollout", "to", "--steps", "3"])
    config = config_from_args(args)
    assert (config.mode, config.method, config.steps) == ("sync", "to", 3)
    assert config.micro_batch_tokens == RLConfig.micro_batch_tokens
    args = parser.parse_args(["--out", str(tmp_path / "x"), "--micro-batch-tokens", "0"])
    assert config_from_args(args).micro_batch_tokens == 0
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        config_from_args(parser.parse_args(["--out", str(tmp_path / "x"), "--micro-batch-tokens", "-1"]))


def test_head_that_does_not_fit_the_policy_is_refused(pair, tok, tmp_path):
    model, _ = pair
    for change in (dict(vocab_size=tok.vocab_size + 1), dict(hidden_size=96)):
        other = MTPHead(ModelConfig.tiny(**{**MODEL, "vocab_size": tok.vocab_size, **change}))
        with pytest.raises(ValueError, match="does not match the policy"):
            build_trainer(RLConfig.tiny(), model, tok, head=other, run_dir=tmp_path / "h", task=Digits())
    with pytest.raises(ValueError, match="pass head="):
        build_trainer(RLConfig.tiny(method="rs"), model, tok, run_dir=tmp_path / "h", task=Digits())
    assert not (tmp_path / "h").exists()


def test_unwritable_run_dir_is_a_clear_error(pair, tok, tmp_path):
    model, head = pair
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises((PermissionError, NotADirectoryError), match="run_dir"):
        build_trainer(RLConfig.tiny(), model, tok, head=head, run_dir=blocker / "run", task=Digits())
    with pytest.raises(FileNotFoundError, match="cannot resume"):
        build_trainer(RLConfig.tiny(), model, tok, head=head, run_dir=tmp_path / "missing", task=Digits(), resume=True)


def test_existing_run_is_never_clobbered_and_corrupt_checkpoint_loses_nothing(pair, tok, tmp_path):
    train(pair, tok, tmp_path, "done", steps=2)
    run_dir = tmp_path / "done"
    model, head = pair
    with pytest.raises(FileExistsError):
        build_trainer(RLConfig.tiny(), model, tok, head=head, run_dir=run_dir, task=Digits())
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name != "checkpoint.pt"}
    checkpoint_path(run_dir).write_bytes(b"PK\x03\x04 this is not a checkpoint")
    with pytest.raises(ValueError, match="corrupt"):
        build_trainer(RLConfig.tiny(), model, tok, head=head, run_dir=run_dir, task=Digits(), resume=True)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir() if p.name != "checkpoint.pt"} == before
    with pytest.raises(ValueError, match="different config"):
        checkpoint_path(run_dir).unlink()
        train(pair, tok, tmp_path, "other", steps=2)
        build_trainer(RLConfig.tiny(lr=0.5), model, tok, head=head, run_dir=tmp_path / "other", task=Digits(),
                      resume=True)


def test_checkpoint_for_other_parameters_is_a_clear_error(pair, tok, tmp_path):
    import torch

    from bebop.rl.resume import save_checkpoint

    trainer, _ = train(pair, tok, tmp_path, "run", steps=2)
    run_dir = tmp_path / "run"
    state = torch.load(checkpoint_path(run_dir), weights_only=True)
    state["optimizer"]["param_groups"][0]["params"].pop()  # as if saved by a model with one tensor fewer
    save_checkpoint(run_dir, {k: v for k, v in state.items() if k != "format"})
    model, head = pair
    with pytest.raises(ValueError, match=f"checkpoint in {run_dir} does not fit this model"):
        build_trainer(trainer.config, model, tok, head=head, run_dir=run_dir, task=Digits(), resume=True)


# ------------------------------------------------------------------------------------- CLI and bench
@pytest.fixture(scope="module")
def policy_dir(pair, tok, tmp_path_factory):
    from bebop.models.checkpoint import save_head, save_pretrained

    model, head = pair
    path = tmp_path_factory.mktemp("policy")
    save_pretrained(model, path)
    tok.save(path)
    for name in ("ce", "e2e_tv"):
        save_head(head, path / "heads" / name)
    return path


def test_cli_runs_and_resumes_from_a_policy_directory(policy_dir, tmp_path, capsys):
    import argparse

    from bebop.commands import rl as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--policy", str(policy_dir), "--out", str(tmp_path / "run"), "--steps", "2", "--threads", "1",
            "--no-progress", "--task", "agent", "--mtp", "online-ce"]
    assert cli.run(parser.parse_args(argv)) == 0
    assert cli.run(parser.parse_args(argv[:5] + ["3"] + argv[6:] + ["--resume"])) == 0
    run = load_run(tmp_path / "run")
    assert list(run.streams["train"]["step"]) == [0, 1, 2]
    assert run.meta["config"]["task"] == "agent" and run.meta["head"]["name"] == "e2e_tv"
    assert run.meta["policy"]["name"] == str(policy_dir) and len(run.meta["resumes"]) == 1  # kept on resume
    assert f"bebop dashboard --runs {tmp_path}" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="--head"):
        cli.run(parser.parse_args(["--policy", str(policy_dir), "--out", str(tmp_path / "r2"), "--head", "nope"]))


def test_bench_rl_writes_the_speedups(policy_dir, tmp_path):
    import argparse

    from bebop.commands.bench import rl as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    args = parser.parse_args(["--policy", str(policy_dir), "--json", str(out), "--steps", "3", "--prompts", "2", "1",
                              "--group", "2", "--max-new-tokens", "16", "--tasks", "math", "agent", "--with-sync"])
    assert bench.run(args) == 0
    result = json.loads(out.read_text())
    assert result["speedup_end_to_end"] > 0 and result["speedup_rollout"] > 0
    assert set(result["tasks"]) == {"math", "agent"} and result["tasks"]["math"]["rows"] == 4  # the first --prompts
    assert result["speedup_end_to_end"] == result["tasks"]["math"]["speedup_end_to_end"]
    assert sorted((r["task"], r["rows"]) for r in result["sweep"]) == [("agent", 2), ("agent", 4), ("math", 2),
                                                                       ("math", 4)]
    assert all(r["speedup_end_to_end"] > 0 and r["speedup_rollout"] > 0 for r in result["sweep"])
    assert result["tasks"]["math"]["speedup_async_over_sync"] > 0 and "math-none-sync" in result["tasks"]["math"]["runs"]
    runs = result["tasks"]["agent"]["runs"]
    assert runs["agent-rs-e2e_tv"]["accept_length"] >= 1 and "accept_length" not in runs["agent-none"]
    with pytest.raises(ValueError, match="unknown task"):
        bench.run(parser.parse_args(["--policy", str(policy_dir), "--tasks", "chess"]))


@pytest.mark.parametrize("shape", ["policy", "deep"])
def test_bench_rl_self_draft_ceiling_accepts_every_draft(policy_dir, tmp_path, shape):
    """--self-draft swaps in a perfect draft pair: RS accepts (nearly) every draft, and lr 0 keeps it perfect."""
    import argparse

    from bebop.commands.bench import rl as bench

    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "bench.json"
    args = parser.parse_args(["--policy", str(policy_dir), "--json", str(out), "--steps", "3", "--prompts", "2",
                              "--group", "2", "--max-new-tokens", "16", "--tasks", "math", "--gamma", "2",
                              "--self-draft", shape, "--out", str(tmp_path / "runs")])
    assert bench.run(args) == 0
    result = json.loads(out.read_text())
    spec = result["tasks"]["math"]["runs"]["math-rs-e2e_tv"]
    assert result["self_draft"] == shape and spec["accept_length"] > 2.9 and spec["accept_length_drift"] == 0, spec
    run = load_run(tmp_path / "runs" / "math-rs-e2e_tv-0")
    assert run.meta["config"]["lr"] == 0.0
    assert (run.meta["policy_parameters"] > policy_parameters(policy_dir)) == (shape == "deep")


def policy_parameters(path) -> int:
    from bebop.default import load_default

    return load_default(path=path).model.num_parameters()


def test_cli_dtype_reaches_the_config():
    import argparse

    from bebop.commands.rl import add_arguments, config_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert config_from_args(parser.parse_args(["--out", "x", "--dtype", "bf16"])).dtype == "bf16"
    assert config_from_args(parser.parse_args(["--out", "x", "--gen-dtype", "bf16"])).dtype == "bf16"  # its old name
    assert config_from_args(parser.parse_args(["--out", "x"])).dtype == RLConfig.preset("quick").dtype
    with pytest.raises(SystemExit):
        parser.parse_args(["--out", "x", "--gen-dtype", "fp8"])
    with pytest.warns(DeprecationWarning, match="RLConfig.gen_dtype is now RLConfig.dtype"):
        assert RLConfig.tiny(gen_dtype="bf16").dtype == "bf16"


def test_a_resume_keeps_what_the_run_recorded(tmp_path):
    """`auto` is the default of a new run; a resumed run keeps every setting it recorded where its flag is left out
    (γ 3 from before that default, its steps), applies a flag a resume may change and says so in one line, and
    refuses one it may not, naming the flag."""
    import argparse

    from bebop.commands import rl as cli
    from bebop.cli import given_dests

    run = tmp_path / "run"
    run.mkdir()
    (run / "meta.json").write_text(json.dumps({"config": {"gamma": 3, "steps": 20, "prompts_per_step": 2}}))

    def config(*argv):
        parser = argparse.ArgumentParser()
        cli.add_arguments(parser)
        args = parser.parse_args(["--out", str(run), *argv])
        args._given = given_dests(parser, ["--out", str(run), *argv])  # as bebop.cli records them
        return cli.config_and_note(args)

    resumed, note = config("--resume")
    assert (resumed.gamma, resumed.steps, resumed.prompts_per_step, note) == (3, 20, 2, None)
    longer, note = config("--resume", "--steps", "30", "--threads", "1")
    assert (longer.steps, longer.threads) == (30, 1)
    assert note == f"resuming --out {run} with --steps 30 (recorded: 20), --threads 1 (recorded: None)"
    with pytest.raises(ValueError, match=r"cannot resume --out .* with --gamma 2: it was recorded with --gamma 3"):
        config("--resume", "--gamma", "2")
    with pytest.raises(ValueError, match=r"with --preset full \(--prompts\) 16.*--prompts 2"):
        config("--resume", "--preset", "full")
    assert config()[0].gamma == "auto"  # a new run (the check that --out is new comes later, in run)
    (run / "meta.json").unlink()
    assert config("--resume")[0].gamma == "auto"  # nothing recorded: the flags as for a new run
