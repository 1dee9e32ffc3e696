"""Shadow heads (bebop.rl.shadow): every head scored exactly on each RL step's rollouts, both rules, online ones trained
on the same rollouts; the specs, the stream, resume, the command line.

The exactness checks compare with the dense computation on a vocabulary small enough to hold [N, L, γ, V]."""

import argparse
import math

import pytest
import torch
from test_rl import MODEL, Digits

from bebop.commands.rl import add_arguments, config_from_args
from bebop.data.tokenizer import CharTokenizer
from bebop.engine.rollout import Rollout
from bebop.engine.stops import Stop
from bebop.losses_from_hidden import acceptance_alpha_from_hidden, acceptances_from_hidden
from bebop.metrics import ENTROPY_BIN_EDGES
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead, chain_targets
from bebop.models.selfdraft import self_draft_pair
from bebop.models.transformer import Transformer
from bebop.rl import RLConfig, prepare_run
from bebop.rl.batch import RolloutBatch, align
from bebop.rl.shadow import ShadowHeads
from bebop.rl.shadow_score import scored_anchors
from bebop.rl.shadow_spec import ShadowSpec, parse_shadow_spec, parse_shadow_specs
from bebop.runlog import load_run


@pytest.fixture(scope="module")
def tok():
    return CharTokenizer()


@pytest.fixture(scope="module")
def pair(tok):
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tok.vocab_size, **MODEL)
    return Transformer(config), MTPHead(config)


def trainer(config, model, tok, run_dir, *, head, shadow_heads, resume=False):
    """The trainer of a run on the toy task with these shadow heads (HEAD spec -> head)."""
    return prepare_run(config, run_dir, resume=resume, task=Digits()).trainer(model, tok, head=head,
                                                                               shadow_heads=shadow_heads)


# ------------------------------------------------------------------------------------------------- the math
@pytest.mark.parametrize("vocab", ["full", "draft"])
def test_both_rules_from_hidden_equal_the_dense_acceptances(vocab):
    g = torch.Generator().manual_seed(0)
    draft_hidden, target_hidden = torch.randn(2, 5, 3, 8, generator=g), torch.randn(2, 5, 3, 8, generator=g)
    weight = torch.randn(23, 8, generator=g)
    mask = torch.tensor([[True, False, True, True, False], [False, True, True, False, True]])
    ids = torch.tensor([0, 2, 3, 5, 7, 8, 11, 13, 17, 19, 22]) if vocab == "draft" else None
    rs, to = acceptances_from_hidden(draft_hidden, target_hidden, weight, mask=mask, temperature=0.7, chunk_rows=4,
                                     draft_ids=ids)  # [M, γ] each
    p = torch.softmax(target_hidden[mask] @ weight.T / 0.7, -1)  # [M, γ, V]
    draft_logits = draft_hidden[mask] @ (weight if ids is None else weight[ids]).T  # [M, γ, V | K]
    q = torch.softmax(draft_logits / 0.7, -1)
    if ids is not None:  # q over S, 0 elsewhere
        q = torch.zeros_like(p).index_copy_(-1, ids, q)
    greedy = draft_logits.argmax(-1) if ids is None else ids[draft_logits.argmax(-1)]  # [M, γ] token ids
    torch.testing.assert_close(rs, torch.minimum(p, q).sum(-1))
    torch.testing.assert_close(to, p.gather(-1, greedy[..., None])[..., 0])
    torch.testing.assert_close(rs, acceptance_alpha_from_hidden(draft_hidden, target_hidden, weight, mask=mask,
                                                                temperature=0.7, draft_ids=ids))


def test_scored_anchors_are_completion_positions_whose_drafts_are_all_the_policys():
    """Anchor t drafts tokens t+2..t+γ+1 (targets t+1..t+γ of policy_mask): t >= prompt - 1, t + γ + 1 < length."""
    tokens = torch.zeros(2, 10, dtype=torch.long)
    lengths, prompt_lengths = torch.tensor([10, 8]), torch.tensor([3, 4])
    policy_mask = torch.zeros(2, 9, dtype=torch.bool)
    policy_mask[0, 2:9] = True  # row 0: tokens 3..9 the policy's
    policy_mask[1, [3, 5, 6]] = True  # row 1: tokens 4, 6, 7 the policy's; token 5 an environment's reply
    got = scored_anchors(tokens, lengths, prompt_lengths, policy_mask, depth=2)
    want = torch.zeros(2, 10, dtype=torch.bool)
    want[0, 2:7] = True  # t in 2..6
    want[1, 4] = True  # t in 3..4, and t = 3 would draft token 5
    torch.testing.assert_close(got, want)


def _batch(tok, depth_rows=(9, 6, 11, 4), prompt=(5, 7)):
    """A fixed RolloutBatch: two groups of two rows, token ids drawn from a seeded generator."""
    g = torch.Generator().manual_seed(3)
    prompts, tokens = [], []
    for i, length in enumerate(depth_rows):
        if i % 2 == 0:
            p = torch.randint(3, tok.vocab_size, (prompt[i // 2],), generator=g).tolist()
        prompts.append(p)
        tokens.append(torch.randint(3, tok.vocab_size, (length,), generator=g).tolist())
    rollout = Rollout(tokens=tokens, logprobs=[[-1.0] * len(t) for t in tokens],
                      entropy=[[0.5] * len(t) for t in tokens], origin=[["plain"] * len(t) for t in tokens],
                      finish_reason=["stop"] * 4, stops=[Stop()] * 4)
    return RolloutBatch([None] * 4, prompts, rollout, ["x"] * 4, torch.zeros(4), *align(prompts, rollout, 0),
                        policy_version=0, gen_time_s=0.0, gen_interval=(0.0, 0.0))


def _dense_expectation(model, head, batch, depth, temperature):
    """Per rule: (Σ_t Π_{j≤i} α_j [γ], Σ_t Π_{j<i} α_j [γ], per-bin reached, accepted) the dense way."""
    with torch.no_grad():
        logits, hidden = model(batch.tokens)  # [N, L, V], [N, L, d]
        target_logits, _, _ = chain_targets(logits, batch.tokens, depth)  # [N, L, γ, V]
        draft_logits = head.chain(model, hidden, batch.tokens, depth)  # [N, L, γ, V]
    mask = scored_anchors(batch.tokens, batch.lengths, batch.prompt_lengths, batch.policy_mask, depth)
    p, q = (torch.softmax(x[mask].double() / temperature, -1) for x in (target_logits, draft_logits))  # [M, γ, V]
    entropy = -(p * p.log()).sum(-1)  # [M, γ]
    bins = torch.bucketize(entropy.float(), torch.tensor(ENTROPY_BIN_EDGES[1:-1]), right=True)
    out = {}
    for rule, alpha in (("rs", torch.minimum(p, q).sum(-1)), ("to", p.gather(-1, q.argmax(-1, keepdim=True))[..., 0])):
        accepted = alpha.cumprod(-1)
        reached = torch.cat([torch.ones_like(accepted[:, :1]), accepted[:, :-1]], -1)
        per_bin = {int(k): (float(reached[bins == k].sum()), float(accepted[bins == k].sum())) for k in bins.unique()}
        accept_length = 1 + float(accepted.sum(-1).mean())
        out[rule] = (accepted.sum(0), reached.sum(0), per_bin, accept_length, float(entropy.mean()))
    return out, int(mask.sum())


def test_shadow_scores_are_the_dense_expectations_per_position_and_bin(pair, tok):
    model, head = pair
    config = RLConfig.tiny(gamma=3, temperature=0.8, shadow_heads=("a",))
    shadow = ShadowHeads(config, {"a": head}, rollout_head=None, policy_config=model.config, vocab_limit=None,
                         device=torch.device("cpu"), micro_batch_rows=3)
    batch = _batch(tok)
    with torch.no_grad():
        _, hidden = model(batch.tokens)
    records, seconds = shadow.score(model, hidden, batch)
    want, anchors = _dense_expectation(model, head, batch, 3, 0.8)
    assert [(r["head"], r["rule"], r["strategy"]) for r in records] == [("a", "rs", "frozen"), ("a", "to", "frozen")]
    assert seconds > 0 and anchors > 10
    for record in records:
        accepted, reached, per_bin, accept_length, entropy = want[record["rule"]]
        assert record["spec/num_drafts"] == anchors and record["spec/gamma"] == 3
        for i in range(3):
            assert record[f"spec/num_accepted_tokens_per_pos/{i}"] == pytest.approx(float(accepted[i]), rel=1e-5)
            assert record[f"spec/num_reached_tokens_per_pos/{i}"] == pytest.approx(float(reached[i]), rel=1e-5)
            assert record[f"alpha_pos/{i}"] == pytest.approx(float(accepted[i] / reached[i]), rel=1e-5)
        assert record["accept_length"] == pytest.approx(accept_length, rel=1e-5)
        assert record["entropy_mean"] == pytest.approx(entropy, rel=1e-5)
        for k, (bin_reached, bin_accepted) in per_bin.items():
            assert record[f"spec/by_entropy/{k}/num_draft_tokens"] == pytest.approx(bin_reached, rel=1e-5)
            assert record[f"spec/by_entropy/{k}/num_accepted_tokens"] == pytest.approx(bin_accepted, rel=1e-5)
    assert records[0]["accept_length"] > records[1]["accept_length"]  # RS accepts at least what TO does, here more


# --------------------------------------------------------------------------------------------- through a run
def test_a_self_drafting_head_is_always_accepted_under_rs(tok, tmp_path):
    """q = p exactly (bebop.models.selfdraft): the shadow RS acceptance is 1 at every depth, through the trainer's
    own alignment of hidden states, anchors and LM head; TO's is max p < 1. lr 0 keeps the pair exact."""
    model, head = self_draft_pair(ModelConfig.tiny(vocab_size=tok.vocab_size, **MODEL), logit_std=3.0)
    config = RLConfig.tiny(steps=2, lr=0.0, gamma=3, shadow_heads=("self",), method="to")
    trainer(config, model, tok, tmp_path / "run", head=head, shadow_heads={"self": head}).run()
    shadow = load_run(tmp_path / "run").streams["shadow"]
    for _, record in shadow.iterrows():
        if record["rule"] == "rs":
            assert record["accept_length"] == pytest.approx(4.0, abs=1e-4)
        else:
            assert 1.0 < record["accept_length"] < 3.9 and record["alpha_pos/0"] < 0.97
    assert sorted(set(shadow["head"])) == ["rollout", "self"] and len(shadow) == 2 * 2 * 2  # steps x heads x rules


def test_online_shadow_heads_train_on_the_rollouts_and_are_scored_before_their_step(pair, tok, tmp_path):
    model, head = pair
    before = {k: v.clone() for k, v in head.state_dict().items()}
    config = RLConfig.tiny(steps=3, prompts_per_step=4, group_size=2, max_new_tokens=16, lr=1e-2, mtp_lr=3e-2,
                           shadow_heads=("a", "online-tv:a", "ce=online-ce:a"))
    run = trainer(config, model, tok, tmp_path / "run", head=head, shadow_heads={"a": head})
    records = run.run()
    shadow = load_run(tmp_path / "run").streams["shadow"]
    assert shadow.groupby("step").size().tolist() == [8, 8, 8]  # (rollout + 3 shadows) x (rs, to)
    assert dict(zip(shadow["head"], shadow["strategy"])) == {"rollout": "frozen", "a": "frozen",
                                                              "online-tv:a": "online-tv", "ce": "online-ce"}
    rs = shadow[shadow["rule"] == "rs"].set_index(["step", "head"])["accept_length"]
    assert rs[0, "a"] == rs[0, "online-tv:a"] == rs[0, "ce"] == rs[0, "rollout"]  # before any update: one head
    assert rs[2, "online-tv:a"] != rs[2, "a"] and rs[2, "ce"] != rs[2, "a"]  # then the online copies moved
    assert all(r["timing_s/shadow/online-tv:a"] > 0 and r["timing_s/shadow/ce"] > 0 and r["timing_s/shadow_score"] > 0
               for r in records)
    frozen = {entry.label: entry.head for entry in run.shadow.heads}["a"]
    for name, value in head.state_dict().items():  # the caller's head, and the frozen shadow's copy, never move
        assert torch.equal(value, before[name]) and torch.equal(frozen.state_dict()[name], before[name])


def test_resume_restores_the_online_shadow_heads(pair, tok, tmp_path):
    """Stopped after 2 of 4 steps and resumed, the run logs the shadow records of the uninterrupted one."""
    model, head = pair
    config = RLConfig.tiny(steps=4, prompts_per_step=2, group_size=2, mode="sync", lr=1e-2, mtp_lr=3e-2,
                           shadow_heads=("online-tv:a",))
    kwargs = dict(head=head, shadow_heads={"a": head})
    trainer(config, model, tok, tmp_path / "whole", **kwargs).run()
    trainer(config.replace(steps=2), model, tok, tmp_path / "split", **kwargs).run()
    trainer(config, model, tok, tmp_path / "split", resume=True, **kwargs).run()
    whole, split = (load_run(tmp_path / name).streams["shadow"] for name in ("whole", "split"))
    assert split["step"].tolist() == whole["step"].tolist() == [s for s in range(4) for _ in range(4)]
    later = whole["step"] >= 2
    for column in ("accept_length", "alpha_pos/0", "entropy_mean"):
        torch.testing.assert_close(torch.tensor(split[column][later].to_numpy()),
                                   torch.tensor(whole[column][later].to_numpy()), rtol=1e-5, atol=1e-7)
    assert not math.isclose(whole["accept_length"].iloc[-2], whole["accept_length"].iloc[2])  # the head did move


# ------------------------------------------------------------------------------------------ specs and flags
@pytest.mark.parametrize("text, want", [
    ("ce", ShadowSpec("ce", "frozen", "ce")),
    ("online-tv:e2e_tv", ShadowSpec("online-tv:e2e_tv", "online-tv", "e2e_tv")),
    ("tv2=online-ce:/x/heads/tv", ShadowSpec("tv2", "online-ce", "/x/heads/tv")),
    ("frozen:/x/y", ShadowSpec("y", "frozen", "/x/y")),
    ("C:/heads/z", ShadowSpec("z", "frozen", "C:/heads/z")),  # a prefix that is no strategy is part of the path
])
def test_shadow_specs_read_label_strategy_and_head(text, want):
    assert parse_shadow_spec(text) == want


@pytest.mark.parametrize("texts, match", [(["ce", "frozen:ce"], "more than once"), (["rollout=ce"], "'rollout'"),
                                          (["x="], "expected"), (["online-tv:"], "expected")])
def test_bad_shadow_specs_are_one_line_each(texts, match):
    with pytest.raises(ValueError, match=match):
        parse_shadow_specs(texts)
    with pytest.raises(ValueError, match=match):
        RLConfig.tiny(shadow_heads=texts)


def test_cli_shadow_heads_reach_the_config_and_a_run_needs_each_head(pair):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--out", "x", "--shadow-heads", "ce", "online-tv:e2e_tv", "--gamma", "auto"])
    config = config_from_args(args)
    assert config.shadow_heads == ("ce", "online-tv:e2e_tv") and config.draft_depth == config.max_gamma
    assert RLConfig.from_dict({**config.to_dict(), "shadow_heads": ["ce", "online-tv:e2e_tv"]}) == config
    model, head = pair
    with pytest.raises(ValueError, match="were not handed in"):
        ShadowHeads(config, {"ce": head}, rollout_head=None, policy_config=model.config, vocab_limit=None,
                    device=torch.device("cpu"))


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


def test_cli_runs_shadow_heads_and_an_entropy_target_and_resumes(policy_dir, tmp_path):
    from bebop.commands import rl as cli

    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    argv = ["--policy", str(policy_dir), "--out", str(tmp_path / "run"), "--steps", "2", "--threads", "1",
            "--no-progress", "--gamma", "2", "--shadow-heads", "ce", "tv=online-tv:e2e_tv", "--entropy-target", "9"]
    assert cli.run(parser.parse_args(argv)) == 0
    argv[5] = "3"
    assert cli.run(parser.parse_args([*argv, "--resume"])) == 0
    run = load_run(tmp_path / "run")
    shadow = run.streams["shadow"]
    assert shadow["step"].tolist() == [s for s in range(3) for _ in range(6)]
    assert set(zip(shadow["head"], shadow["strategy"])) == {("rollout", "frozen"), ("ce", "frozen"),
                                                            ("tv", "online-tv")}
    assert run.streams["train"]["actor/entropy_coef"].tolist() == pytest.approx([0.0, 0.005, 0.01])
    assert run.meta["config"]["shadow_heads"] == ["ce", "tv=online-tv:e2e_tv"]
