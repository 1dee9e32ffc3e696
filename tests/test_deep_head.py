"""A deeper head (`num_layers` > 1, `train-mtp --head-layers`): a stack of decoder layers in the block, grown from a
shallower head as itself, trained and decoded by the paths that take heads (train-mtp, the eager and compiled engines,
eval-mtp's teacher forcing, RL's online and shadow heads; greedy identity with plain decoding: tests/test_engine.py),
saved and loaded, refused in one line by the HF and vLLM writers and by a --head-layers that would cut an --init
head."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from bebop.data.tokenizer import CharTokenizer
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig, RolloutBuilder
from bebop.heads.config import TrainMTPConfig
from bebop.heads.corpus import CorpusSource
from bebop.heads.evaluate import teacher_forced
from bebop.heads.train import train_mtp
from bebop.models.checkpoint import load_head, save_head, save_pretrained
from bebop.models.config import ModelConfig
from bebop.models.hf_mtp import save_for_transformers
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.play import Completion
from char_policy import char_policy

VOCAB = 64
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15]]


def deep_pair(seed: int = 0) -> tuple[Transformer, MTPHead]:
    """A 3-layer model and a two-layer head whose second layer is random (not the identity a grown head starts as)."""
    torch.manual_seed(seed)
    config = ModelConfig.tiny(vocab_size=VOCAB, num_hidden_layers=3)
    return Transformer(config).eval(), MTPHead(config, trained_depth=3, num_layers=2).eval()


@torch.no_grad()
def test_a_head_grown_by_layers_starts_as_it_and_its_added_layer_then_counts():
    model, head = deep_pair()
    one = MTPHead(model.config, trained_depth=3).eval()
    grown = one.with_layers(3).eval()
    assert len(grown.layers) == 3 and grown.trained_depth == 3
    x = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))
    hidden = model(x)[1]
    torch.testing.assert_close(grown.chain(model, hidden, x, 3), one.chain(model, hidden, x, 3), atol=0, rtol=0)
    grown.layers[2].self_attn.o_proj.weight.normal_(0, 0.3)  # the added layer, once it has weights, changes the draft
    assert (grown.chain(model, hidden, x, 3) - one.chain(model, hidden, x, 3)).abs().max() > 1e-3
    for fewer in (1, 0):
        with pytest.raises(ValueError, match="a head of 2 layers grows to at least as many"):
            head.with_layers(fewer)


@pytest.mark.compile  # `make test-compiled`: every phase of a step, minutes on 2 cores from an empty cache
def test_the_compiled_engine_decodes_a_two_layer_head_over_a_draft_vocabulary_as_the_eager_one_does():
    """Both of the head's departures from the one-layer, full-vocabulary head at once (one compile, not two, on CI's
    two cores): its stack of layers and its draft vocabulary S (q kept over S, drafts mapped to target ids), for RS
    and for TO, whose drafts take other graphs. tests/test_engine.py compiles the plain one-layer head."""
    model, head = deep_pair()
    head.use_draft_vocab(torch.arange(0, VOCAB, 3))  # S: every third id, so some of the target's tokens lie outside
    eager_engine, compiled_engine = Engine(model, head), Engine(model, head, compile=True)
    for method in ("rs", "to"):
        config = GenerationConfig(max_new_tokens=10, gamma=2, method=method, seed=3)
        eager, compiled = eager_engine.generate(PROMPTS, config), compiled_engine.generate(PROMPTS, config)
        assert compiled.tokens == eager.tokens, method
        assert compiled.stats["spec/num_accepted_tokens"] == eager.stats["spec/num_accepted_tokens"], method
        assert 0 < eager.stats["spec/num_accepted_tokens"], method  # drafts over S were accepted: both paths ran


@torch.no_grad()
def test_the_engine_s_draft_is_the_teacher_forced_chain_s():
    """The engine's step-1 draft logits after a prompt (its head cache made by the prefill's key writes through both
    layers) equal the training chain's at the prompt's last position: the engine decodes the head train-mtp trains."""
    model, head = deep_pair()
    engine = Engine(model, head)
    config = GenerationConfig(max_new_tokens=1, gamma=1, method="rs", seed=0)
    batch = engine._new_batch(PROMPTS, config)
    out = RolloutBuilder(len(PROMPTS), config, prompts=PROMPTS)
    engine._settle(batch, [(i, 0, list(p)) for i, p in enumerate(PROMPTS)], config, torch.Generator().manual_seed(0),
                   out)
    for slot, row in zip(batch.slots, batch.rows):
        tokens = torch.tensor([out.history(row)])  # the prompt and the first token (pending: not cached yet)
        hidden = model(tokens)[1]
        want = head.logits(model, head.chain_hidden(model, hidden, tokens, 1)[0, -2, 0])
        torch.testing.assert_close(batch.draft_logits[slot], want, atol=1e-4, rtol=0)


def test_save_load_keeps_the_layers_and_the_writers_that_cannot_serve_them_refuse(tmp_path):
    model, head = deep_pair()
    save_head(head, tmp_path / "h")
    assert json.loads((tmp_path / "h" / "head.json").read_text())["num_hidden_layers"] == 2
    loaded = load_head(tmp_path / "h", model.config)
    assert len(loaded.layers) == 2 and torch.equal(loaded.layers[1].mlp.down_proj.weight, head.layers[1].mlp.down_proj.weight)
    with pytest.raises(ValueError, match="the head stacks 2 decoder layers, which transformers'"):
        save_for_transformers(model, head, tmp_path / "hf")
    save_pretrained(model, tmp_path / "p", mtp=head)
    from bebop.vllm_plugin.draft import write_draft

    with pytest.raises(ValueError, match="this head stacks 2 decoder layers, which bebop's vLLM draft model"):
        write_draft(tmp_path / "p", head, tmp_path / "draft")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "draft").exists()


def test_train_mtp_grows_an_init_head_and_trains_its_added_layer(tmp_path):
    model, tokenizer = char_policy(2)
    config = model.config
    train = TrainMTPConfig.tiny("e2e_tv")
    data = CorpusSource(tmp_path / "d")
    one = train_mtp(model, tokenizer, train, tmp_path / "one", data=data, out=tmp_path / "one-head")
    assert len(one.layers) == 1
    grow = TrainMTPConfig(**{**vars(train), "init_head": str(tmp_path / "one-head"), "head_layers": 2})
    deep = train_mtp(model, tokenizer, grow, tmp_path / "deep", data=data, out=tmp_path / "deep-head")
    assert len(deep.layers) == 2 and len(load_head(tmp_path / "deep-head", config).layers) == 2
    assert deep.layers[1].self_attn.o_proj.weight.abs().sum() > 0  # grown at zero, then trained
    meta = json.loads((tmp_path / "deep" / "meta.json").read_text())
    assert meta["config"]["head_layers"] == 2
    fresh = train_mtp(model, tokenizer, TrainMTPConfig(**{**vars(train), "head_layers": 2}), tmp_path / "fresh",
                      data=data)
    assert len(fresh.layers) == 2
    prompts = [tokenizer.encode("1+2=")]
    completion = Completion(tokens=tokenizer.encode("3 ok"), policy=[True] * 4, text="", entropy=[], origin=[])
    dtv, share = teacher_forced(model, deep.eval(), prompts, [completion], gamma=2, temperature=1.0)
    assert len(dtv) == 2 and all(0 <= v <= 1 for v in dtv) and share == 1.0
    with pytest.raises(ValueError, match="stacks 2 decoder layers, more than --head-layers 1"):
        train_mtp(model, tokenizer, TrainMTPConfig(**{**vars(train), "init_head": str(tmp_path / "deep-head"),
                                                      "head_layers": 1}), tmp_path / "cut", data=data)
    assert not (tmp_path / "cut").exists()  # refused before any work
    for bad in (0, True, 1.5):
        with pytest.raises(ValueError, match="head_layers must be a positive int or None"):
            TrainMTPConfig(head_layers=bad)


def test_the_cli_refuses_cutting_an_init_head_in_one_line(tmp_path):
    model, head = deep_pair()
    save_head(head, tmp_path / "h")
    done = subprocess.run([sys.executable, "-m", "bebop", "train-mtp", "--tiny", "--init", str(tmp_path / "h"),
                           "--head-layers", "1", "--run-dir", str(tmp_path / "run"), "--data", str(tmp_path / "d")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1].endswith("stacks 2 decoder layers, more than --head-layers 1: leave "
                                                          "--head-layers out")
    assert not (tmp_path / "run").exists() and not (tmp_path / "d").exists()


def test_an_rl_run_drafts_with_trains_and_scores_a_two_layer_head(tmp_path):
    """GRPO with a two-layer rollout head trained online and a frozen copy of it as a shadow: the online head's added
    layer learns, and the frozen copy scores as the rollout head before any head step."""
    from test_rl import MODEL, Digits

    from bebop.rl import RLConfig, prepare_run
    from bebop.runlog import load_run

    tokenizer = CharTokenizer()
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tokenizer.vocab_size, **MODEL)
    model, head = Transformer(config), MTPHead(config, num_layers=2)
    start = head.layers[1].mlp.down_proj.weight.clone()
    rl = RLConfig.tiny(steps=2, prompts_per_step=4, group_size=2, max_new_tokens=12, mtp="online-tv", mtp_lr=3e-2,
                       shadow_heads=("frozen",))
    run = prepare_run(rl, tmp_path / "run", task=Digits()).trainer(model, tokenizer, head=head,
                                                                   shadow_heads={"frozen": head})
    run.run()
    shadow = load_run(tmp_path / "run").streams["shadow"]
    rs = shadow[shadow["rule"] == "rs"].set_index(["step", "head"])["accept_length"]
    assert rs[0, "frozen"] == rs[0, "rollout"]
    assert len(run.head.layers) == 2 and not torch.equal(run.head.layers[1].mlp.down_proj.weight, start)
