"""Verification of γ draft tokens against the target: the step that makes speculative decoding lossless.

Given drafts ŷ_1..ŷ_γ and the target's distributions p_1..p_{γ+1} at those positions (p_{γ+1} is the
position after the last draft), each draft is accepted in turn until the first rejection. The row then
emits its accepted drafts plus one more token: the *recovered* token sampled at the rejected position, or
the *bonus* token sampled from p_{γ+1} when all γ passed. Notation: target = p, draft = q (docs/paper.md).

Why rejection sampling ("rs") is lossless. The draft ŷ ~ q is accepted with probability min(1, p(ŷ)/q(ŷ))
(u·q(ŷ) < p(ŷ) with u ~ U(0, 1)); on rejection, whose total probability is 1 - Σ_v min(p, q)(v)
= Σ_v max(0, p - q)(v), the recovered token comes from norm(max(0, p - q)). So a token v is emitted with
probability q(v)·min(1, p(v)/q(v)) + max(0, p(v) - q(v)) = min(p, q)(v) + max(0, p - q)(v) = p(v). Each
emitted token therefore has exactly its target conditional given the tokens before it; a rejection ends
the step (the next step recomputes p at the new prefix) and the bonus token is a plain draw from p_{γ+1},
so by induction the emitted sequence has exactly the law of sampling the target token by token.

Why target-only verification ("to") is lossless. The draft ŷ = argmax q is a deterministic function of the
context, so q plays no part in the probabilities: ŷ is accepted with probability p(ŷ), and on rejection
(probability 1 - p(ŷ)) a token is drawn from p with ŷ removed and renormalised, p(v)/(1 - p(ŷ)) for v ≠ ŷ.
Hence P(emit ŷ) = p(ŷ) and P(emit v) = (1 - p(ŷ))·p(v)/(1 - p(ŷ)) = p(v): again exactly p. (It is "rs"
with q replaced by a one-hot at ŷ.) Nothing from the draft needs caching beyond its tokens, but the
acceptance p(ŷ) falls as the target's entropy rises.

"greedy" is deterministic prefix matching against argmax p, what both methods reduce to when p is one-hot
(temperature 0). The two pure pieces, `acceptance_probs` and `residual_probs`, are what `verify` samples
with, so the exact law of the emitted tokens can be enumerated from them (tests/test_verify.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from bebop.checks import METHODS
from bebop.sampling import describe, sample

SUM_TOLERANCE = 1e-3  # max |Σ_v p(v) - 1| accepted by validation
_INTEGER_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


@dataclass(frozen=True)
class Verdict:
    """Outcome of one verification step for a batch of B rows.

    Row b emits draft_tokens[b, :num_accepted[b]] followed by next_token[b].
    """

    num_accepted: torch.Tensor  # [B] long in 0..γ
    next_token: torch.Tensor  # [B] long: recovered token if num_accepted < γ, else the bonus token


def verify(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    method: str = "rs",
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    validate: bool = True,
    clock=None,
) -> Verdict:
    """Accept a prefix of the drafts and pick the next token, batched over rows without a Python loop.

    draft_tokens [B, γ] long; target_probs [B, γ+1, V] (p at each draft position, then the bonus position);
    draft_probs [B, γ, V] (q, required for "rs", unused otherwise). `validate=False` skips the value checks
    that need a host sync (token range, probabilities summing to 1); shapes and dtypes are always checked.
    The randomness is `uniforms` [B, γ+1] float64 in [0, 1) if given (the first γ decide acceptance, the last
    draws the next token: compiled callers pass their random numbers in), else drawn from `generator`. `clock`
    (a `bebop.engine.phases.PhaseClock`, profiling only) is told when the acceptance tests are done ("decide").
    """
    gamma = _check(draft_tokens, target_probs, draft_probs, method, validate)
    if uniforms is None and method != "greedy":
        uniforms = torch.rand(draft_tokens.shape[0], gamma + 1, dtype=torch.float64, device=draft_tokens.device,
                              generator=generator)  # [B, γ+1]
    elif uniforms is not None and uniforms.shape != (draft_tokens.shape[0], gamma + 1):
        raise ValueError(f"uniforms must have shape [B, γ+1] = {[draft_tokens.shape[0], gamma + 1]}, "
                         f"got {list(uniforms.shape)}")
    tokens = draft_tokens.long()  # [B, γ]
    alpha = _acceptance(tokens, target_probs[:, :gamma], draft_probs, method)  # [B, γ]
    if method == "greedy":
        accepted = alpha > 0  # [B, γ]
    else:
        accepted = uniforms[:, :gamma] < alpha  # [B, γ]
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # [B] length of the all-accepted prefix
    if clock is not None:
        clock.mark("decide")
    rows = torch.arange(tokens.shape[0], device=tokens.device)  # [B]
    target_next = target_probs[rows, num_accepted]  # [B, V] p at the first rejection, or p_{γ+1}
    if method == "greedy":
        return Verdict(num_accepted, target_next.argmax(-1))
    # Only the one position per row that decides the next token gets a residual.
    at = num_accepted.clamp(max=gamma - 1)  # [B]
    draft_next = draft_probs[rows, at] if method == "rs" else None  # [B, V]
    residual = _residual_weights(target_next, draft_next, tokens[rows, at], method)  # [B, V] unused if all passed
    rejected = (num_accepted < gamma)[:, None]  # [B, 1]
    next_token = sample(torch.where(rejected, residual, target_next), uniform=uniforms[:, gamma])  # [B] (no norm)
    return Verdict(num_accepted, next_token)


@dataclass(frozen=True)
class Drafts:
    """A step's drafts as `verify_scores` reads them: each row's own depth, its q kept where it was drafted.

    q of a row is either a distribution over the draft vocabulary S (K ids; S = the whole vocabulary when `draft_ids`
    is None), the one its drafts were sampled from ("rs" with a head), or a one-hot at each draft (`one_hot`: "to",
    whose draft is argmax q, and prompt lookup). A one-hot q makes rejection sampling's test p(ŷ) and its residual p
    with ŷ taken out: exactly "to" (the module docstring), so one rule serves both.
    """

    tokens: torch.Tensor  # [B, G] long target ids; row b verifies the first depths[b] of them
    draft_hat: torch.Tensor  # [B, G] q(ŷ) at each draft (1 where q is one-hot)
    depths: torch.Tensor  # [B] long in 0..G: 0 decodes the row plainly (the target's draw at its pending position)
    one_hot: torch.Tensor  # [B] bool: the row's q is a one-hot at its drafts
    draft_probs: torch.Tensor | None = None  # [B, G, K] q over S of the rows that are not one-hot (None: none is)
    draft_ids: torch.Tensor | None = None  # [K] long target ids of S, increasing (None: K = V, the identity)


def acceptance_from_logp(target_logp_hat: torch.Tensor, draft_hat: torch.Tensor) -> torch.Tensor:
    """[B, G] probability that each draft is accepted given every earlier one was: min(1, p(ŷ)/q(ŷ)), 1[p(ŷ) > 0]
    where q(ŷ) = 0, from log p(ŷ) [B, G] (a log-normaliser away from the target's scores) and q(ŷ) [B, G]."""
    target_hat = target_logp_hat.exp()
    draft_hat = draft_hat.to(target_hat.dtype)
    return torch.where(draft_hat > 0, (target_hat / draft_hat).clamp(max=1), (target_hat > 0).to(target_hat.dtype))


def residual_from_probs(target: torch.Tensor, draft_probs: torch.Tensor | None, draft_ids: torch.Tensor | None,
                        draft_token: torch.Tensor, one_hot: torch.Tensor,
                        rejected: torch.Tensor | None = None) -> torch.Tensor:
    """[..., V] unnormalised law of the recovered token where the draft draft_token [...] was rejected: max(0, p - q)
    from p [..., V] and q, over S [..., K] spread onto draft_ids (None: q is over V), or a one-hot at the draft
    where one_hot [...] (draft_probs may then hold anything, and is ignored). Falls back to p where the residual has
    (numerically) no mass, as `residual_probs` does. Only the deciding positions need it: one per row. With
    `rejected` [...] bool, p itself where it is False (the bonus draw of a row that accepted every draft)."""
    take = ~one_hot if rejected is None else rejected & ~one_hot  # [...] rows that subtract q over S
    hot = one_hot if rejected is None else rejected & one_hot  # [...] rows that subtract their one-hot
    rest = target.clone()
    if draft_probs is not None:
        draft = draft_probs.to(target.dtype) * take[..., None]  # [..., K]
        if draft_ids is None:
            rest.sub_(draft)
        else:
            rest.index_add_(-1, draft_ids, draft, alpha=-1)
    rest.scatter_add_(-1, draft_token[..., None], -hot[..., None].to(target.dtype)).clamp_min_(0)
    mass = rest.sum(-1, keepdim=True)  # [..., 1]
    return torch.where(mass > 10 * torch.finfo(target.dtype).eps, rest, target)


def verify_scores(scores: torch.Tensor, log_normaliser: torch.Tensor, index: torch.Tensor, drafts: Drafts,
                  uniforms: torch.Tensor, method: str = "rs", *, clock=None) -> Verdict:
    """`verify` from the target's scores (scaled logits) at the positions a step computed, each row to its own depth.

    scores [N, V] and their log-normalisers [N] (log p = scores - log_normaliser: no softmax over V at any draft
    position); index [B, G+1] long, the row of `scores` at each row's position i (its pending token's at 0; past
    depths[b] anything valid: never read); uniforms [B, G+1] as in `verify`. Row b accepts a prefix of its first
    depths[b] drafts; the next token is its residual at the first rejection (`residual_from_probs`), or a draw from p
    at position depths[b] (the bonus; at depth 0 the row's plain draw). method "rs" or "to" (the q of `drafts`
    decides the rule: a one-hot q is "to"'s) or "greedy" (prefix matching against argmax p). No host sync. `clock`
    as in `verify`."""
    batch, gamma = drafts.tokens.shape
    assert scores.ndim == 2 and index.shape == (batch, gamma + 1) and uniforms.shape == (batch, gamma + 1)
    rows = torch.arange(batch, device=scores.device)  # [B]
    drafted = index[:, :gamma]  # [B, G]
    logp_hat = scores.flatten()[drafted * scores.shape[1] + drafts.tokens] - log_normaliser[drafted]  # [B, G]
    if method == "greedy":
        accepted = drafts.tokens == scores.argmax(-1)[drafted]  # [B, G]
    else:
        accepted = uniforms[:, :gamma] < acceptance_from_logp(logp_hat, drafts.draft_hat)  # [B, G]
    accepted &= torch.arange(gamma, device=scores.device) < drafts.depths[:, None]
    num_accepted = accepted.long().cumprod(-1).sum(-1)  # [B]
    if clock is not None:
        clock.mark("decide")
    at = index[rows, num_accepted]  # [B] the deciding position's row of scores
    if method == "greedy":
        return Verdict(num_accepted, scores[at].argmax(-1))
    target_next = scores[at].sub_(log_normaliser[at, None]).exp_()  # [B, V] p there: the one softmax of the step
    if gamma == 0:
        return Verdict(num_accepted, sample(target_next, uniform=uniforms[:, 0]))
    j = num_accepted.clamp(max=gamma - 1)  # [B]
    draft_next = None if drafts.draft_probs is None else drafts.draft_probs[rows, j]  # [B, K]
    weights = residual_from_probs(target_next, draft_next, drafts.draft_ids, drafts.tokens[rows, j], drafts.one_hot,
                                  rejected=num_accepted < drafts.depths)  # [B, V]: p where every draft passed
    return Verdict(num_accepted, sample(weights, uniform=uniforms[:, gamma]))


def acceptance_probs(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    method: str = "rs",
) -> torch.Tensor:
    """[B, γ] probability that each draft is accepted, given every earlier draft was.

    "rs": min(1, p_i(ŷ_i)/q_i(ŷ_i)) (1[p_i(ŷ_i) > 0] where q_i(ŷ_i) = 0, the limit of u·q < p);
    "to": p_i(ŷ_i); "greedy": 1[ŷ_i = argmax p_i]. Shapes as in `verify`.
    """
    gamma = _check(draft_tokens, target_probs, draft_probs, method, validate=False)
    return _acceptance(draft_tokens.long(), target_probs[:, :gamma], draft_probs, method)


def residual_probs(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    method: str = "rs",
) -> torch.Tensor:
    """[B, γ, V] law of the recovered token if draft i is the first rejected one.

    "rs": norm(max(0, p_i - q_i)); "to": p_i with ŷ_i removed, renormalised; "greedy": one-hot argmax p_i.
    A residual with (numerically) no mass falls back to p_i: rejection there has about that probability.
    """
    gamma = _check(draft_tokens, target_probs, draft_probs, method, validate=False)
    weights = _residual_weights(target_probs[:, :gamma], draft_probs, draft_tokens.long(), method)  # [B, γ, V]
    return weights / weights.sum(-1, keepdim=True)


def _acceptance(
    tokens: torch.Tensor, target: torch.Tensor, draft: torch.Tensor | None, method: str
) -> torch.Tensor:
    """tokens [B, γ], target [B, γ, V], draft [B, γ, V] | None -> [B, γ] acceptance probabilities."""
    dtype = _work_dtype(target, draft)
    target_hat = target.gather(-1, tokens[..., None])[..., 0].to(dtype)  # [B, γ] p_i(ŷ_i)
    if method == "greedy":
        return (tokens == target.argmax(-1)).to(dtype)
    if method == "to":
        return target_hat.clamp(0, 1)
    draft_hat = draft.gather(-1, tokens[..., None])[..., 0].to(dtype)  # [B, γ] q_i(ŷ_i)
    ratio = (target_hat / draft_hat).clamp(max=1)
    return torch.where(draft_hat > 0, ratio, (target_hat > 0).to(dtype))


def _residual_weights(
    target: torch.Tensor, draft: torch.Tensor | None, tokens: torch.Tensor, method: str
) -> torch.Tensor:
    """target [..., V], draft [..., V] | None, tokens [...] -> [..., V] unnormalised law of the recovered token."""
    dtype = _work_dtype(target, draft)
    target = target.to(dtype)
    if method == "greedy":
        return torch.nn.functional.one_hot(target.argmax(-1), target.shape[-1]).to(dtype)
    if method == "to":
        rest = target.scatter(-1, tokens[..., None], 0.0)  # [..., V]
    else:
        rest = (target - draft.to(dtype)).clamp_min(0)  # [..., V]
    mass = rest.sum(-1, keepdim=True)  # [..., 1]
    # Below a few ulps the residual is rounding noise (p ≈ q): p is then the better law, and the rejection
    # it replaces has probability about `mass`, so the emitted law moves by at most that much.
    tiny = 10 * torch.finfo(dtype).eps
    return torch.where(mass > tiny, rest, target)


def _work_dtype(target: torch.Tensor, draft: torch.Tensor | None) -> torch.dtype:
    # At least float32: half-precision probabilities cannot resolve acceptance ratios near 1.
    dtype = torch.promote_types(target.dtype, torch.float32)
    return dtype if draft is None else torch.promote_types(dtype, draft.dtype)


def _check(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    method: str,
    validate: bool,
) -> int:
    """Raise ValueError naming the bad argument; return γ. Value checks (host sync) only if `validate`."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype not in _INTEGER_DTYPES:
        raise ValueError(f"draft_tokens must be an integer tensor [B, γ], got {describe(draft_tokens)}")
    if draft_tokens.ndim != 2:
        raise ValueError(f"draft_tokens must have shape [B, γ], got {tuple(draft_tokens.shape)}")
    batch, gamma = draft_tokens.shape
    if gamma == 0:
        raise ValueError("draft_tokens has γ = 0 draft positions: verification needs at least one draft")
    _check_probs("target_probs", target_probs, (batch, gamma + 1, None), draft_tokens.device)
    vocab = target_probs.shape[-1]
    if method == "rs":
        if draft_probs is None:
            raise ValueError("draft_probs [B, γ, V] is required for method 'rs'")
        _check_probs("draft_probs", draft_probs, (batch, gamma, vocab), draft_tokens.device)
    if validate:
        used = {"target_probs": target_probs, **({"draft_probs": draft_probs} if method == "rs" else {})}
        _check_values(draft_tokens, vocab, used)
    return gamma


def _check_probs(name: str, probs: torch.Tensor, shape: tuple[int, int, int | None], device: torch.device) -> None:
    """`shape` is the expected [B, positions, V]; V = None accepts any vocabulary size >= 1."""
    if not isinstance(probs, torch.Tensor) or not probs.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {describe(probs)}")
    mismatch = any(want is not None and got != want for got, want in zip(probs.shape, shape))
    if probs.ndim != 3 or probs.shape[-1] == 0 or mismatch:
        want = ", ".join("V" if size is None else str(size) for size in shape)
        raise ValueError(f"{name} must have shape [{want}] to match draft_tokens, got {tuple(probs.shape)}")
    if probs.device != device:
        raise ValueError(f"{name} is on {probs.device} but draft_tokens is on {device}")


def _check_values(draft_tokens: torch.Tensor, vocab: int, probs: dict[str, torch.Tensor]) -> None:
    if ((draft_tokens < 0) | (draft_tokens >= vocab)).any():
        raise ValueError(f"draft_tokens has token ids outside [0, {vocab})")
    for name, tensor in probs.items():
        if not torch.isfinite(tensor).all() or (tensor < 0).any():
            raise ValueError(f"{name} has negative or non-finite probabilities")
        error = float((tensor.sum(-1, dtype=torch.float64) - 1).abs().max()) if tensor.numel() else 0.0
        if error > SUM_TOLERANCE:
            raise ValueError(f"{name} rows must sum to 1 within {SUM_TOLERANCE}, worst row is off by {error:.3g}")
