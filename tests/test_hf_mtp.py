"""transformers runs bebop's head: `save_for_transformers` writes a directory that `AutoModelForCausalLM` loads and
whose `generate(use_mtp=True)` drafts with the head, each draft's logits equal to bebop's depth-1 draft."""

from __future__ import annotations

import json

import pytest
import torch

from bebop.models import ModelConfig, MTPHead, Transformer, save_for_transformers
from bebop.models.hf_mtp import transformers_mtp_config

transformers = pytest.importorskip("transformers")
modeling_layers = pytest.importorskip("transformers.modeling_layers")

VOCAB = 97
ATOL = 1e-4
NEW_TOKENS = 24


def randomise(module: torch.nn.Module, generator: torch.Generator) -> None:
    """Norm weights far from 1, so a norm read as (1 + w) or skipped shows in the logits; weights larger than
    the init's, so a random policy's greedy continuation does not collapse into one repeated token (logits stay
    under about 20, where fp32 rounding is far below ATOL)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_((0.25 if "embed_tokens" in name else 0.1) * torch.randn(p.shape, generator=generator))


def make_repeating(model: Transformer, mtp: MTPHead, generator: torch.Generator) -> None:
    """A policy that repeats its last token (large tied embeddings over the init's small layers) and a head that
    drafts its input token (fc passes the embedding through), so transformers accepts every draft. Both final
    norms are scaled by 0.1, which leaves every argmax as it is and keeps the logits near 20."""
    with torch.no_grad():
        for module in (model, mtp):
            for name, p in module.named_parameters():
                if "norm" in name:
                    p.copy_(1 + 0.5 * torch.randn(p.shape, generator=generator))
        model.model.embed_tokens.weight.copy_(torch.randn(model.model.embed_tokens.weight.shape, generator=generator))
        d = model.config.hidden_size
        mtp.fc.weight[:, :d] += torch.eye(d)  # [d, 2d]: the first half reads the normed embedding
        model.model.norm.weight.mul_(0.1)
        mtp.norm.weight.mul_(0.1)


@pytest.fixture(scope="module", params=["tied", "untied", "repeating"])
def pair(request, tmp_path_factory):
    """(kind, bebop model, bebop head, transformers' model loaded from what save_for_transformers wrote). The
    random kinds' drafts are all rejected, the repeating kind's all accepted: both paths of transformers' loop."""
    generator = torch.Generator().manual_seed(7)
    torch.manual_seed(3)
    config = ModelConfig.tiny(vocab_size=VOCAB, num_hidden_layers=2, tie_word_embeddings=request.param != "untied")
    model, mtp = Transformer(config).eval(), MTPHead(config).eval()
    if request.param == "repeating":
        make_repeating(model, mtp, generator)
    else:
        randomise(model, generator)
        randomise(mtp, generator)
    path = tmp_path_factory.mktemp("hf_mtp")
    save_for_transformers(model, mtp, path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    return request.param, model, mtp, hf


def prompt(length: int = 11, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def test_transformers_backbone_equals_bebops(pair):
    _, model, _, hf = pair
    assert type(hf).__name__ == "MellumForCausalLM" and hf.config.num_mtp_layers == 1
    tokens = prompt(40)
    with torch.no_grad():
        out = hf(tokens, output_hidden_states=True)
        logits, hidden = model(tokens)
    torch.testing.assert_close(out.logits, logits, atol=ATOL, rtol=0)
    # the hidden state transformers' MTP path feeds the head: the backbone's output after its final norm
    torch.testing.assert_close(out.hidden_states[-1], hidden, atol=ATOL, rtol=0)


def mtp_generate(hf, tokens: torch.Tensor) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """generate(use_mtp=True, greedy) and, for every call of transformers' MTP module, the sequence it drafted
    after (full_input_ids [1, n]) and its draft logits [1, V]."""
    calls = []

    def record(module, args, kwargs, output):
        if isinstance(module, modeling_layers.MtpModel):
            _, candidate_logits, _ = output  # [1, num_mtp_layers=1, V]
            calls.append((kwargs["full_input_ids"].clone(), candidate_logits[:, 0].clone()))

    handle = torch.nn.modules.module.register_module_forward_hook(record, with_kwargs=True)
    try:
        with torch.no_grad():
            out = hf.generate(tokens, max_new_tokens=NEW_TOKENS, do_sample=False, use_mtp=True)
    finally:
        handle.remove()
    return out, calls


def bebop_draft_logits(model: Transformer, mtp: MTPHead, sequence: torch.Tensor) -> torch.Tensor:
    """The head's depth-1 draft logits [1, V] for the token after `sequence` [1, n]: step 1 at anchor n-2 reads the
    backbone's hidden there and the last token."""
    with torch.no_grad():
        _, hidden = model(sequence)
        return mtp.chain(model, hidden, sequence, 1)[:, -2, 0]


def test_transformers_drafts_equal_bebops_depth_1_drafts(pair):
    _, model, mtp, hf = pair
    tokens = prompt()
    _, calls = mtp_generate(hf, tokens)
    assert len(calls) >= 2, "transformers' MTP module never ran"
    first_sequence, first_logits = calls[0]
    assert first_sequence.shape[1] == tokens.shape[1] + 1  # the prompt and the backbone's first token
    torch.testing.assert_close(first_logits, bebop_draft_logits(model, mtp, first_sequence), atol=ATOL, rtol=0)
    for sequence, logits in calls[1:]:  # later drafts run from transformers' MTP cache, after rejections too
        torch.testing.assert_close(logits, bebop_draft_logits(model, mtp, sequence), atol=ATOL, rtol=0)


def test_greedy_generate_with_the_head_is_lossless(pair):
    kind, model, _, hf = pair
    for seed in range(2):
        tokens = prompt(5 + 4 * seed, seed)
        with torch.no_grad():
            plain = hf.generate(tokens, max_new_tokens=NEW_TOKENS, do_sample=False)
        drafted, calls = mtp_generate(hf, tokens)
        assert torch.equal(drafted, plain)
        # the MTP path ran: one draft per target step, NEW_TOKENS - 1 steps when every draft is rejected
        assert len(calls) >= 2
        if kind == "repeating":
            assert len(calls) < NEW_TOKENS - 1
        else:
            assert len(set(plain[0, tokens.shape[1]:].tolist())) > 3  # a continuation, not one repeated token
        # and it is bebop's greedy continuation: the backbones agree, so argmax of bebop's logits replays it
        with torch.no_grad():
            logits, _ = model(plain[:, :-1])
        assert torch.equal(logits[0, tokens.shape[1] - 1:].argmax(-1), plain[0, tokens.shape[1]:])


def test_saved_config_and_refusals(tmp_path):
    config = ModelConfig.tiny(vocab_size=VOCAB, num_hidden_layers=2)
    model, mtp = Transformer(config), MTPHead(config, trained_depth=3, objective="e2e_tv")
    save_for_transformers(model, mtp, tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == "mellum" and saved["num_nextn_predict_layers"] == 1
    assert saved["bebop_mtp"]["trained_depth"] == 3
    with pytest.raises(ValueError, match="model_type='qwen2'"):
        transformers_mtp_config({**config.to_hf_dict(), "model_type": "qwen2"})
    with pytest.raises(ValueError, match="llama3"):
        transformers_mtp_config({**config.to_hf_dict(), "rope_parameters": {"rope_type": "llama3"}})
    other = MTPHead(ModelConfig.tiny(vocab_size=VOCAB, hidden_size=128, head_dim=32))
    with pytest.raises(ValueError, match="hidden_size"):
        save_for_transformers(model, other, tmp_path / "other")
    with pytest.raises(ValueError, match="MTPHead"):
        save_for_transformers(model, model, tmp_path / "other")
