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
`normaliser_and_entropy` gives it with the log-normaliser straight from the scaled logits, and
`scores_normaliser_entropy` all three from the logits a block of positions at a time (the engine's verification).

`sample` draws one token per distribution by inverting the CDF with one float64 uniform per row: one
cumulative sum and one binary search (over a large vocabulary on a CPU, by blocks: `draw_by_blocks`), with no
Python loop and no host sync. It is about 4x cheaper on CPU than the exponential race (argmax p/E) because it
needs one random number per row instead of one per token.
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


# A block of positions small enough that its scores and exponentials stay in a core's cache while every pass of
# `scores_normaliser_entropy` runs over them: 1 MB of float32, five rows of a 49,152-id vocabulary. Up to 16 blocks'
# worth the whole tensor is kept: there the blocks' per-call overhead ate what the cache saved (`bebop bench step
# --cuts`, "p in blocks": docs/draft-depth.md).
BLOCK_BYTES = 2**20
WHOLE_BLOCKS = 16


def scores_normaliser_entropy(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                              top_p: float | None = None, vocab_limit: int | None = None
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [N, V] -> (scaled_logits [N, V], and its `normaliser_and_entropy`: [N], [N]); on a CPU, a block of
    positions at a time (`BLOCK_BYTES`) once N spans more than `WHOLE_BLOCKS` of them: over a large vocabulary the
    whole-tensor passes (upcast, scale, max, exponentials, sums) each stream N·V floats through memory, while a
    block's stay in cache. Every value is its row's own, so the numbers are those of the whole-tensor calls, bit for
    bit (tests/test_sampling.py). A GPU and compiled graphs take the whole tensor: a GPU's bandwidth does not need
    the blocks, inductor fuses the passes itself, and a loop over a symbolic N would specialise on it."""
    if logits.ndim != 2:
        raise ValueError(f"logits must be [N, V], got {tuple(logits.shape)}")
    masked = temperature == 0 or any(x is not None for x in (top_k, top_p, vocab_limit))
    rows = max(1, BLOCK_BYTES // (4 * logits.shape[1]))
    if logits.device.type != "cpu" or torch.compiler.is_compiling() or logits.shape[0] <= WHOLE_BLOCKS * rows:
        scores = scaled_logits(logits, temperature, top_k, top_p, vocab_limit)
        return scores, *normaliser_and_entropy(scores, masked)
    scores = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)  # [N, V]
    log_normaliser, entropies = scores.new_empty(logits.shape[0]), scores.new_empty(logits.shape[0])  # [N], [N]
    for start in range(0, logits.shape[0], rows):
        block = slice(start, start + rows)
        scores[block] = scaled_logits(logits[block], temperature, top_k, top_p, vocab_limit)
        log_normaliser[block], entropies[block] = normaliser_and_entropy(scores[block], masked)
    return scores, log_normaliser, entropies


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
    if uniform is None:
        u = torch.rand(flat.shape[0], 1, dtype=torch.float64, device=probs.device, generator=generator)  # [N, 1]
    elif uniform.shape != lead:
        raise ValueError(f"uniform must have shape {tuple(lead)}, one per distribution, got {tuple(uniform.shape)}")
    else:
        u = uniform.reshape(-1, 1).double()  # [N, 1]
    by_blocks = vocab >= 8 * DRAW_BLOCK and flat.device.type == "cpu" and not torch.compiler.is_compiling()
    return (draw_by_blocks if by_blocks else draw_by_scan)(flat, u).reshape(lead)


# Tokens per block of `draw_by_blocks`, which `sample` takes on a CPU once a row has 8 blocks or more.
DRAW_BLOCK = 256


def draw_by_scan(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The inverse CDF of non-negative weights [N, V] at u [N, 1] float64 in [0, 1): [N, 1] long, the first token
    whose cumulative weight exceeds u times the row's total, from one float64 scan over the row."""
    # float64 keeps the CDF exact to ~1e-16, so even tokens far below float32 resolution of the running
    # sum keep their probability.
    cdf = weights.double().cumsum(-1)  # [N, V]
    return _first_past(cdf, weights, u * cdf[:, -1:])


def draw_by_blocks(weights: torch.Tensor, u: torch.Tensor, block: int | None = None) -> torch.Tensor:
    """`draw_by_scan`'s inverse CDF in two levels: the float64 sums of blocks of `block` tokens (`DRAW_BLOCK`) and a
    scan over them find the block u lands in, then a scan inside that block finds the token. The same law: a
    token's cumulative weight is the blocks' before it plus its block's up to it, float64 sums of the same weights
    in another order (equal to ~1e-16 of the total), and neither a block without mass nor a token without weight
    has a step to be hit (`_first_past`'s argmax stays as the fallback). It reads the weights once, in a sum, where
    the scan copies each row to float64 and runs through all of it (`bench step --cuts`, "draw":
    docs/draft-depth.md)."""
    block = DRAW_BLOCK if block is None else block
    rows, vocab = weights.shape
    blocks_per_row = -(-vocab // block)
    if vocab % block:
        weights = torch.nn.functional.pad(weights, (0, blocks_per_row * block - vocab))  # zero weight: never drawn
    blocks = weights.view(rows, blocks_per_row, block)  # [N, nb, block]
    sums = blocks.sum(-1, dtype=torch.float64)  # [N, nb]
    block_cdf = sums.cumsum(-1)  # [N, nb]
    total = block_cdf[:, -1:]  # [N, 1]
    x = torch.minimum(u * total, torch.nextafter(total, torch.zeros_like(total)))  # [N, 1] as draw_by_scan's
    j = _first_past(block_cdf, sums, x)  # [N, 1] the block x lands in
    before = torch.where(j > 0, block_cdf.gather(-1, (j - 1).clamp_min(0)), torch.zeros_like(x))  # [N, 1]
    inner = blocks.gather(1, j[:, :, None].expand(rows, 1, block))[:, 0]  # [N, block]
    # Rounding can put x - before at or past the block's own scan total: `_first_past` keeps it inside.
    return j * block + _first_past(inner.double().cumsum(-1), inner, (x - before).clamp_min(0))


def _first_past(cdf: torch.Tensor, weights: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """[N, 1] long: in each row of cdf [N, n] (the float64 scan of weights [N, n]), the first entry past x [N, 1],
    x kept strictly below the row's total (u < 1, but u * total can round up to it)."""
    total = cdf[:, -1:]  # [N, 1]
    x = torch.minimum(x, torch.nextafter(total, torch.zeros_like(total)))  # [N, 1]
    index = torch.searchsorted(cdf, x, right=True).clamp_max_(cdf.shape[-1] - 1)  # [N, 1] first cdf > x
    # Sequential sums give a zero-weight entry no CDF step, so it cannot be hit; a parallel scan (GPU) may
    # round differently, so keep the guarantee explicitly with the row's argmax as a fallback.
    zero = weights.gather(-1, index) <= 0  # [N, 1]
    return torch.where(zero, weights.argmax(-1, keepdim=True), index)
