"""The exact law of a policy's first three sampled tokens (by enumeration) and a chi-square test against it, shared by
the tests of drafts that are not an MTP head's own (tests/test_draft_vocab.py, tests/test_lookup.py)."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from bebop.models.config import ModelConfig
from bebop.models.selfdraft import self_draft_pair
from bebop.sampling import scaled_logits


def first_three_law(model, prompt: list[int], vocab: int, *, top_k: int | None = None,
                    top_p: float | None = None) -> torch.Tensor:
    """[V³] float64: P(y1, y2, y3 | prompt) under plain sampling at T = 1 after top-k / top-p, by enumeration."""
    prefixes = torch.tensor([prompt + [a, b] for a in range(vocab) for b in range(vocab)])  # [V², P+2]
    with torch.no_grad():
        probs = scaled_logits(model(prefixes)[0], 1.0, top_k, top_p).double().softmax(-1)  # [V², P+2, V]
    p1 = probs[0, len(prompt) - 1]  # [V]
    p2 = probs[:, len(prompt)].view(vocab, vocab, vocab)[:, 0]  # [a, b]
    p3 = probs[:, len(prompt) + 1].view(vocab, vocab, vocab)  # [a, b, c]
    return (p1[:, None, None] * p2[:, :, None] * p3).flatten()


def check_first_three(rows: list[list[int]], law: torch.Tensor, vocab: int) -> None:
    """Assert that `rows`' first three tokens pass a chi-square test against `law` (p > 1e-3) and that the same
    counts fail it against a wrong law (the first token's marginal shifted: p < 1e-6). Cells expected under 5 are
    pooled into one, kept only when it has the mass a chi-square cell needs."""
    n = len(rows)
    keep = law * n >= 5
    pooled = [] if law[~keep].sum() * n < 5 else [~keep]

    def cells(counts: torch.Tensor) -> torch.Tensor:
        return torch.cat([counts[keep], *[counts[m].sum()[None] for m in pooled]])
    codes = torch.tensor([t[0] * vocab * vocab + t[1] * vocab + t[2] for t in rows])
    observed = cells(torch.bincount(codes, minlength=vocab**3).double())
    assert int(observed.sum()) == n, "a row drew a token its law gives no mass"
    expected = cells(law)
    wrong = cells(law.view(vocab, -1)[torch.roll(torch.arange(vocab), 1)].flatten())
    assert chisquare(observed.numpy(), (expected * n / expected.sum()).numpy()).pvalue > 1e-3
    assert chisquare(observed.numpy(), (wrong * n / wrong.sum()).numpy()).pvalue < 1e-6


def near_draft_pair(vocab: int):
    """A one-layer policy and a draft close to it but not equal, so accepts, rejections and bonuses all occur. The
    noise has its own generator: how far acceptance falls depends on the draw (0.04-0.46 for TO at γ=1 across
    draws), so it must not hang on whatever the global generator holds after other tests."""
    config = ModelConfig.tiny(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=32)
    model, head = self_draft_pair(config, seed=3)
    noise = torch.randn(config.hidden_size, config.hidden_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        head.fc.weight[:, : config.hidden_size].add_(noise * 0.4)
    return model, head
