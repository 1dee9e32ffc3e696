"""Fused features (EAGLE-3's): a head that reads a learned projection of several backbone layers, trained and decoded
on the same features by every path that takes heads (train-mtp, the eager engine, eval-mtp's teacher forcing, the
policy positions, RL's online and shadow heads), saved and loaded, and refused in one line by the compiled engine
and the HF and vLLM writers."""

from __future__ import annotations

import json

import pytest
import torch

from bebop.data.tokenizer import CharTokenizer
from bebop.engine import Engine
from bebop.engine.generate import TIMING
from bebop.engine.rollout import GenerationConfig, RolloutBuilder
from bebop.engine.sources import Histories
from bebop.heads.config import TrainMTPConfig
from bebop.heads.corpus import CorpusSource
from bebop.heads.evaluate import teacher_forced
from bebop.heads.train import train_mtp
from bebop.models.checkpoint import load_head, load_pretrained, save_head, save_pretrained
from bebop.models.config import ModelConfig
from bebop.models.hf_mtp import save_for_transformers
from bebop.models.mtp import MTPHead, shared_taps
from bebop.models.transformer import Transformer
from bebop.play import Completion
from char_policy import char_policy

VOCAB, TAPS = 64, (0, 2)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15]]


def fused_pair(seed: int = 0, scale: float = 0.3) -> tuple[Transformer, MTPHead]:
    """A 4-layer model and a head reading layers 0 and 2 beside the top, its fuse perturbed off the identity (so
    the tapped layers change what it drafts)."""
    torch.manual_seed(seed)
    config = ModelConfig.tiny(vocab_size=VOCAB, num_hidden_layers=4)
    model, head = Transformer(config).eval(), MTPHead(config, trained_depth=3, feature_layers=TAPS).eval()
    with torch.no_grad():
        head.fuse.weight.add_(scale * torch.randn_like(head.fuse.weight))
    return model, head


def test_the_backbone_hands_the_top_hidden_then_each_tapped_layer():
    model, _ = fused_pair()
    tokens = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    seen = {}
    hooks = [model.model.layers[i].register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(i, out))
             for i in TAPS]
    with torch.no_grad():
        logits, hidden = model(tokens)
        tapped_logits, features = model(tokens, taps=TAPS)
    for hook in hooks:
        hook.remove()
    d = model.config.hidden_size
    assert features.shape == (2, 9, 3 * d)
    torch.testing.assert_close(features[..., :d], hidden)
    torch.testing.assert_close(features[..., d:2 * d], seen[0])
    torch.testing.assert_close(features[..., 2 * d:], seen[2])
    torch.testing.assert_close(tapped_logits, logits)  # the logits read the top hidden
    torch.testing.assert_close(model.lm_logits(features), logits)
    for bad in ((2, 0), (0, 0), (3,), (-1,)):  # unsorted, repeated, the last layer (the top's), out of range
        with pytest.raises(ValueError, match="taps must be increasing"):
            model(tokens, taps=bad)


@torch.no_grad()
def test_a_head_grown_from_a_top_layer_head_starts_as_it_and_the_taps_then_count():
    model, _ = fused_pair()
    torch.manual_seed(3)
    top = MTPHead(model.config, trained_depth=3).eval()
    fused = top.with_features(TAPS).eval()
    tokens = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(2))
    _, hidden = model(tokens)
    _, features = model(tokens, taps=TAPS)
    torch.testing.assert_close(fused.chain(model, features, tokens, 3), top.chain(model, hidden, tokens, 3))
    fused.fuse.weight.add_(0.3 * torch.randn_like(fused.fuse.weight))
    assert (fused.chain(model, features, tokens, 3) - top.chain(model, hidden, tokens, 3)).abs().max() > 1e-3
    # a top-layer head handed features reads their top hidden
    torch.testing.assert_close(top.chain(model, features, tokens, 3), top.chain(model, hidden, tokens, 3))
    with pytest.raises(ValueError, match="features of width"):
        fused.chain(model, hidden[..., :-1], tokens, 3)


@torch.no_grad()
def test_the_engine_drafts_from_the_features_the_head_trains_on():
    """After a prefill and speculative steps, the engine's next step-1 draft logits (its head cache kept up by the
    catch-ups) equal the teacher-forced chain's over the emitted sequence's features: the engine feeds the head
    what train-mtp and eval-mtp feed it."""
    model, head = fused_pair()
    config = GenerationConfig(max_new_tokens=12, gamma=2, method="rs", seed=0)
    engine, generator = Engine(model, head), torch.Generator().manual_seed(0)
    out = RolloutBuilder(len(PROMPTS), config, prompts=PROMPTS)
    batch = engine._new_batch(PROMPTS, config)
    engine._settle(batch, [(i, 0, list(p)) for i, p in enumerate(PROMPTS)], config, generator, out)
    histories = Histories(engine.lookup or engine.row_lookup, out)
    for _ in range(3):
        engine._step(batch, engine.depth_for(config).decide(len(batch.rows)), config, generator, (out, histories), {},
                     dict.fromkeys(TIMING, 0.0))
    for slot, row in zip(batch.slots, batch.rows):
        tokens = torch.tensor([out.history(row)])  # prompt and tokens so far, the last one pending (not cached)
        _, features = model(tokens, taps=TAPS)
        # the draft query pairs the last cached position's features with the pending token
        want = head.logits(model, head.chain_hidden(model, features, tokens, 1)[0, -2, 0])
        torch.testing.assert_close(batch.draft_logits[slot], want, atol=1e-4, rtol=0)


def test_greedy_speculation_with_a_fused_head_is_plain_decoding():
    model, head = fused_pair()
    engine = Engine(model, head)
    plain = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=12, temperature=0, gamma=0))
    for method in ("rs", "to"):
        spec = engine.generate(PROMPTS, GenerationConfig(max_new_tokens=12, temperature=0, gamma=3, method=method))
        assert spec.tokens == plain.tokens and spec.stats["spec/num_drafts"] > 0


def test_the_compiled_engine_refuses_a_fused_head_in_one_line():
    """Compiled, a fused head's RS draws left the eager engine's after the first verification (the tokens of one
    prompt differed from the sixth on, same seed): until that is found, compile=True refuses a fused head before
    anything is compiled, and a top-layer head still compiles."""
    model, head = fused_pair()
    with pytest.raises(ValueError, match=r"compiled engine does not decode a head with fused features \(feature "
                                         r"layers \[0, 2\]\) yet"):
        Engine(model, head, compile=True)
    assert Engine(model, MTPHead(model.config), compile=True).compiled


def test_save_load_keeps_the_feature_layers_and_the_writers_that_cannot_serve_them_refuse(tmp_path):
    model, head = fused_pair()
    save_head(head, tmp_path / "h")
    assert json.loads((tmp_path / "h" / "head.json").read_text())["feature_layers"] == list(TAPS)
    loaded = load_head(tmp_path / "h", model.config)
    assert loaded.feature_layers == TAPS and torch.equal(loaded.fuse.weight, head.fuse.weight)
    save_pretrained(model, tmp_path / "p", mtp=head)
    _, embedded = load_pretrained(tmp_path / "p")
    assert embedded.feature_layers == TAPS and torch.equal(embedded.fuse_norms[1].weight, head.fuse_norms[1].weight)
    with pytest.raises(ValueError, match="fused features of layers \\[0, 2\\]"):
        save_for_transformers(model, head, tmp_path / "hf")
    from bebop.vllm_plugin.draft import write_draft

    with pytest.raises(ValueError, match="fused features of layers \\[0, 2\\]"):
        write_draft(tmp_path / "p", head, tmp_path / "draft")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "draft").exists()


def test_one_backbone_pass_serves_heads_that_agree_on_their_layers():
    model, head = fused_pair()
    top = MTPHead(model.config)
    assert shared_taps([None, top]) == () and shared_taps([head, top, None]) == TAPS
    other = MTPHead(model.config, feature_layers=(1,))
    with pytest.raises(ValueError, match="different feature layers"):
        shared_taps([head, other])


def test_train_mtp_trains_the_fuse_and_eval_reads_the_features(tmp_path, monkeypatch):
    """train-mtp trains a fused head's projection; the backbone's pass it kept beside the corpus (the top hidden with
    the tapped layers) serves a top-layer run on the same corpus, and a run that needs other layers makes its own."""
    import bebop.heads.train as heads_train

    made = []
    real = heads_train.make_batches
    monkeypatch.setattr(heads_train, "make_batches", lambda *a, **k: made.append(a[5]) or real(*a, **k))
    model, tokenizer = char_policy(3)
    config = model.config
    train = TrainMTPConfig.tiny("e2e_tv")
    fused = train_mtp(model, tokenizer, TrainMTPConfig(**{**vars(train), "feature_layers": (0,)}), tmp_path / "f",
                      data=CorpusSource(tmp_path / "d"), out=tmp_path / "head")
    assert fused.feature_layers == (0,)
    start = torch.eye(32, 64)
    assert not torch.equal(fused.fuse.weight, start)  # the projection learned
    assert load_head(tmp_path / "head", config).feature_layers == (0,)
    # adapting a top-layer head with --feature-layers grows its fuse
    top = train_mtp(model, tokenizer, train, tmp_path / "t", data=CorpusSource(tmp_path / "d"), out=tmp_path / "top")
    grown = train_mtp(model, tokenizer, TrainMTPConfig(**{**vars(train), "feature_layers": (1,),
                                                          "init_head": str(tmp_path / "top")}),
                      tmp_path / "g", data=CorpusSource(tmp_path / "d"))
    assert grown.feature_layers == (1,) and top.feature_layers == ()
    assert made == [(0,), (1,)]  # the top-layer run read the fused run's pass
    with pytest.raises(ValueError, match="taps must be increasing decoder layer indices in \\[0, 1\\]"):
        train_mtp(model, tokenizer, TrainMTPConfig(**{**vars(train), "feature_layers": (2,)}), tmp_path / "bad",
                  data=CorpusSource(tmp_path / "bad-data"))
    assert not (tmp_path / "bad").exists() and not (tmp_path / "bad-data").exists()  # refused before any work
    prompts = [tokenizer.encode("1+2=")]
    completion = Completion(tokens=tokenizer.encode("3 ok"), policy=[True] * 4, text="", entropy=[], origin=[])
    dtv, share = teacher_forced(model, fused.eval(), prompts, [completion], gamma=2, temperature=1.0)
    assert len(dtv) == 2 and all(0 <= v <= 1 for v in dtv) and share == 1.0


def test_an_rl_run_trains_and_scores_fused_heads_on_the_update_s_features(tmp_path):
    """GRPO with a fused rollout head trained online, a frozen fused shadow and a top-layer one: the update's forward
    keeps the features (one pass for all), the online head's projection learns, every head is scored, and the
    frozen fused copy scores as the rollout head before any head step (both read the same features)."""
    from test_rl import MODEL, Digits

    from bebop.rl import RLConfig, prepare_run
    from bebop.runlog import load_run

    tokenizer = CharTokenizer()
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, **{**MODEL, "num_hidden_layers": 3})
    model = Transformer(config)
    head, top = MTPHead(config, feature_layers=(0,)), MTPHead(config)
    with torch.no_grad():
        head.fuse.weight.add_(0.3 * torch.randn_like(head.fuse.weight))
    start = head.fuse.weight.clone()
    rl = RLConfig.tiny(steps=2, prompts_per_step=4, group_size=2, max_new_tokens=12, mtp="online-tv", mtp_lr=3e-2,
                       shadow_heads=("a", "b"))
    run = prepare_run(rl, tmp_path / "run", task=Digits()).trainer(model, tokenizer, head=head,
                                                                   shadow_heads={"a": head, "b": top})
    assert run.taps == (0,)
    run.run()
    shadow = load_run(tmp_path / "run").streams["shadow"]
    assert sorted(set(shadow["head"])) == ["a", "b", "rollout"]
    rs = shadow[shadow["rule"] == "rs"].set_index(["step", "head"])["accept_length"]
    assert rs[0, "a"] == rs[0, "rollout"] and rs[0, "b"] != rs[0, "a"]
    assert not torch.equal(run.head.fuse.weight, start)


def test_the_backbone_pass_kept_beside_the_corpus_reads_back_as_made_fresh(tmp_path):
    """backbone_batches keeps the pass it made; a later run with the same key reads it back equal to a fresh pass
    (without running the backbone), a top-layer run reads a fused pass's files as the plain pass, and other taps or
    another key make the pass again (other taps replacing the kept pass)."""
    from bebop.heads.corpus import load_corpus
    from bebop.heads.data import make_batches
    from bebop.heads.feature_store import backbone_batches
    from bebop.heads.step import lm_head_weight

    model, _ = fused_pair()
    config = TrainMTPConfig.tiny()
    tokenizer = CharTokenizer()
    data = load_corpus(None, model, tokenizer, config, {"math": _Digits()})
    weight = lm_head_weight(model, False)

    def make(taps):
        return lambda: make_batches(model, data, config, False, weight, taps)

    def never():
        raise AssertionError("the pass was made again where the kept one serves")

    said: list[str] = []
    fresh = {taps: list(make(taps)()) for taps in ((), TAPS, (1,))}
    assert "taps" in fresh[TAPS][0] and "taps" not in fresh[()][0]
    backbone_batches(tmp_path, "k", TAPS, make(TAPS), said.append)
    for taps in (TAPS, ()):  # the fused pass serves its own taps and a top-layer run
        _assert_same(backbone_batches(tmp_path, "k", taps, never, said.append), fresh[taps])
    assert sum("read from" in line for line in said) == 2
    _assert_same(backbone_batches(tmp_path, "k", (1,), make((1,)), said.append), fresh[(1,)])
    _assert_same(backbone_batches(tmp_path, "other", (), make(()), said.append), fresh[()])
    assert sum("read from" in line for line in said) == 2 and len(list(tmp_path.glob("features-*"))) == 2
    assert not list(tmp_path.glob(".*")), "a pass's temporary folder was left behind"


def _assert_same(got, want: list[dict]) -> None:
    got = list(got)
    assert len(got) == len(want) and all(a.keys() == b.keys() for a, b in zip(got, want))
    for a, b in zip(got, want):
        for key in a:
            assert torch.equal(a[key], b[key]), key


class _Digits:
    """Prompts of digits (the model's vocabulary is 64 ids: the character tokenizer's first ones)."""

    name, stop_strings, verifiable = "math", ("<eos>",), True

    def sample(self, n, seed):
        from bebop.data.tasks import Example

        return [Example(prompt=str(1000 + 37 * i), answer=0, level=1, task=self.name) for i in range(n)]


@torch.no_grad()
def test_the_policy_positions_read_a_fused_head_on_its_own_features():
    """bebop.heads.positions gives a fused head its layers' features: grown from a top-layer head it drafts as that
    head at every position the policy wrote, and its taps then change its q."""
    from bebop.heads.positions import policy_positions

    model, _ = fused_pair()
    torch.manual_seed(3)
    top = MTPHead(model.config, trained_depth=3).eval()
    fused = top.with_features(TAPS).eval()
    tokenizer, task = CharTokenizer(), _Digits()
    examples, answers = task.sample(3, 0), GenerationConfig(max_new_tokens=6, gamma=0, seed=0)
    p, qs = policy_positions(model, tokenizer, {"top": top, "fused": fused}, task, examples, answers)
    assert p.shape[0] > 0 and qs["fused"].shape == qs["top"].shape == p.shape
    torch.testing.assert_close(qs["fused"], qs["top"])
    fused.fuse.weight.add_(0.3 * torch.randn_like(fused.fuse.weight))
    _, moved = policy_positions(model, tokenizer, {"fused": fused}, task, examples, answers)
    assert (moved["fused"] - qs["top"]).abs().max() > 1e-3
