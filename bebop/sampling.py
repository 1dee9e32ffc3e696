"""From logits to the distribution we sample from, and sampling from it.

Speculative decoding is lossless only for the distribution it is verified against, so the target p and
the draft q must go through *the same* processing (PAPER §2): temperature, then top-k, then top-p. That
processing is one function, `scaled_logits`; the engine's p and q (`probs_from_logits`), the draft losses
and the GRPO log-probs (`logprobs_from_logits`) and the tiled TV overlap (`scaled_logits` on each vocabulary
tile, temperature only: top-k and top-p need the whole row) all call it, so there is one definition of "the
policy's distribution" in the code base.

- vocab_limit: ids >= vocab_limit get -inf before anything else. A checkpoint's embedding often has more rows
  than its tokenizer has tokens (Qwen3 pads 151,669 to 151,936); those ids decode to nothing, so they must never
  be sampled, drafted or counted in a normalisation. Masking here, in the one function, applies it to p and q
  alike (verification stays lossless: both are distributions over the same ids) and to the RL log-probs.
- temperature T > 0 divides the logits, upcast to float32 first (x / T: seeded rollouts and training runs
  depend on exactly this arithmetic); T = 0 means greedy: a one-hot at the argmax (ties go to the lowest
  index, which is what `torch.argmax` returns).
- top-k keeps the tokens whose scaled logit is >= the k-th largest (ties at the k-th value are all kept, as
  in HF's and vLLM's warpers).
- top-p keeps the smallest prefix of the tokens sorted by probability (stable sort: ties in index order)
  whose mass reaches `top_p`; a token is kept iff the mass ranked strictly before it is < `top_p`, so the
  most likely token always survives.
Masked tokens get log-probability -inf and probability exactly 0.

`entropy` is H(p) of such a distribution, what the engine records per token and RL logs;
`normaliser_and_entropy` gives it with the log-normaliser straight from the scaled logits (the engine's verification).

`sample` draws one token per distribution by inverting the CDF with one float64 uniform per row: one
cumulative sum and one binary search, with no Python loop and no host sync. It is about 4x cheaper on CPU
than the exponential race (argmax p/E) because it needs one random number per row instead of one per token.
"""

from __future__ import annotations

import torch


def _check_processing(logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None,
                      vocab_limit: int | None) -> None:
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {describe(logits)}")
    if logits.ndim < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have shape [..., V] with V >= 1, got {tuple(logits.shape)}")
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a number >= 0, got {temperature!r}")
    if not 0 <= temperature < float("inf"):
        raise ValueError(f"temperature must be finite and >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an int >= 1 or None, got {top_k!r}")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")
    if vocab_limit is not None and (isinstance(vocab_limit, bool) or not isinstance(vocab_limit, int)
                                    or vocab_limit < 1):
        raise ValueError(f"vocab_limit must be an int >= 1 or None, got {vocab_limit!r}")


def describe(x: object) -> str:
    """What a caller passed instead of a tensor of the right kind, for error messages."""
    return f"tensor of dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__


def scaled_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 scaled logits, ids >= vocab_limit and the tokens outside top-k / top-p
    at -inf.

    Softmax of it is the policy's distribution. A new tensor whenever it scales or masks; at T = 1 with no
    filter on float32 logits it is `logits` itself, so never modify it in place.
    """
    _check_processing(logits, temperature, top_k, top_p, vocab_limit)
    scores = logits.float()  # [..., V] before the division: T applied to bf16 would round twice
    if vocab_limit is not None and vocab_limit < scores.shape[-1]:
        padding = torch.arange(scores.shape[-1], device=scores.device) >= vocab_limit  # [V]
        scores = scores.masked_fill(padding, float("-inf"))  # [..., V] a new tensor: `logits` is untouched
    if temperature == 0:
        best = scores.argmax(-1, keepdim=True)  # [..., 1]
        return torch.full_like(scores, float("-inf")).scatter_(-1, best, 0.0)
    if temperature != 1:
        scores = scores / temperature
    vocab = scores.shape[-1]
    if top_k is not None and top_k < vocab:
        kth = scores.topk(top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p is not None and top_p < 1:
        sorted_probs, order = scores.softmax(-1).sort(dim=-1, descending=True, stable=True)  # [..., V]
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # [..., V] mass ranked strictly ahead
        drop_sorted = mass_before >= top_p  # the top token has mass_before == 0 exactly: a row never empties
        drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores


def logprobs_from_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 log-probabilities after vocab_limit, temperature, top-k, top-p
    (-inf = masked)."""
    return scaled_logits(logits, temperature, top_k, top_p, vocab_limit).log_softmax(-1)


def probs_from_logits(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities, exactly 0 outside the kept set.

    Apply it with the same arguments to the target and the draft logits (PAPER §2).
    """
    return scaled_logits(logits, temperature, top_k, top_p, vocab_limit).softmax(-1)


def entropy(probs: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """H(p) = -Σ p log p in nats along `dim`, with 0·log 0 = 0 (one-hot rows give exactly 0)."""
    if not probs.is_floating_point():
        raise ValueError(f"probs must be a floating tensor, got {probs.dtype}")
    return -torch.special.xlogy(probs, probs).sum(dim)


def normaliser_and_entropy(scores: torch.Tensor, masked: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(log Σ exp(scores), H(softmax(scores))) [...] of scaled logits [..., V] (`scaled_logits`), from one exponential
    per token: e = exp(s - max), lse = max + log Σe, H = lse - Σ e·s / Σe. The entropy of a softmax without forming
    it or a log per token (`entropy` of the probabilities costs both). `masked`: scores may hold -inf (a vocab limit,
    top-k / top-p, T = 0), whose tokens count 0 (the dot product would read 0·-inf)."""
    top = scores.amax(-1, keepdim=True)  # [..., 1]
    weights = (scores - top).exp_()  # [..., V]
    total = weights.sum(-1)  # [...]
    finite = scores.clamp_min(torch.finfo(scores.dtype).min) if masked else scores
    log_normaliser = top[..., 0] + total.log()
    return log_normaliser, log_normaliser - torch.linalg.vecdot(weights, finite) / total


def sample(probs: torch.Tensor, generator: torch.Generator | None = None, *,
           uniform: torch.Tensor | None = None) -> torch.Tensor:
    """[..., V] non-negative weights -> [...] long: one exact draw per distribution.

    Rows need positive total mass but need not be normalised. A zero-weight token is never returned.
    `uniform` [...] float64 in [0, 1), one per distribution, is the draw's randomness when the caller drew it
    (compiled code takes its random numbers as inputs); otherwise it comes from `generator`.
    """
    if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
        raise ValueError(f"probs must be a floating-point tensor, got {describe(probs)}")
    if probs.ndim < 1 or probs.shape[-1] == 0:
        raise ValueError(f"probs must have shape [..., V] with V >= 1, got {tuple(probs.shape)}")
    lead, vocab = probs.shape[:-1], probs.shape[-1]
    flat = probs.reshape(-1, vocab)  # [N, V]
    # float64 keeps the CDF exact to ~1e-16, so even tokens far below float32 resolution of the running
    # sum keep their probability.
    cdf = flat.double().cumsum(-1)  # [N, V]
    total = cdf[:, -1:]  # [N, 1]
    if uniform is None:
        u = torch.rand(flat.shape[0], 1, dtype=torch.float64, device=probs.device, generator=generator)  # [N, 1]
    elif uniform.shape != lead:
        raise ValueError(f"uniform must have shape {tuple(lead)}, one per distribution, got {tuple(uniform.shape)}")
    else:
        u = uniform.reshape(-1, 1).double()  # [N, 1]
    # u < 1, but u * total can round up to total; nextafter keeps the target strictly inside the CDF.
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # [N, 1]
    index = torch.searchsorted(cdf, x, right=True).clamp_max_(vocab - 1)  # [N, 1] first cdf > x
    # Sequential sums give a zero-weight token no CDF step, so it cannot be hit; a parallel scan (GPU) may
    # round differently, so keep the guarantee explicitly with the row's argmax as a fallback.
    zero = flat.gather(-1, index) <= 0  # [N, 1]
    index = torch.where(zero, flat.argmax(-1, keepdim=True), index)
    return index.reshape(lead)
