"""The draft losses of `bebop.losses` from hidden states and the frozen LM head: the path for real vocabularies.

At V = 151,936, [B, T, γ, V] float32 logits are gigabytes, so these functions take the head's outputs and the
backbone's hidden states at the aligned positions instead, and only valid anchors reach the LM head, one way or the
other:

    whole vocabulary   the rows go through all of W [V, d], `chunk_rows` at a time (default `default_chunk_rows`),
                       each chunk checkpointed: backward recomputes its logits, so the graph holds [M·γ, d] rows and
                       per-row values, never [M·γ, V] logits. Equal to `draft_loss` on the dense logits.
    draft vocabulary   `draft_ids` [K] (bebop.draft_vocab): the draft's logits are its rows of S only (W_S [K, d]),
                       and the target's probabilities on S are exact, exp(h·W_Sᵀ / T - lse), given the log-normaliser
                       of its full logits at each position (`target_lse`: cached by the data pass that ran the whole
                       LM head once; without it computed here, in chunks, with no graph). A step costs K/V of the
                       LM head's matmuls. What each loss means on S: `bebop.losses.step_values_on_vocab`.

`acceptances_from_hidden` scores instead of training: both rules' acceptance (RS's Σ min(p, q), TO's p(argmax q))
from the same chunks, with no graph (the RL run's shadow heads, `bebop.rl.shadow`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from bebop.draft_vocab import check_ids, default_chunk_rows, log_normaliser, target_logp
from bebop.losses import (OBJECTIVES, anchor_losses, check_labels, check_mask, check_temperature, step_values,
                          step_values_on_vocab)


@dataclass(frozen=True)
class Readout:
    """How rows become distributions: the LM head W [V, d] (detached), at `temperature`, `chunk_rows` rows at a
    time; over a draft vocabulary `draft_ids` [K] (with the targets' log-normalisers `target_lse` [B, T, γ], or
    None to compute them) or, without one, the whole vocabulary."""

    weight: torch.Tensor
    temperature: float = 1.0
    chunk_rows: int | None = None
    draft_ids: torch.Tensor | None = None
    target_lse: torch.Tensor | None = None


def draft_loss_from_hidden(draft_hidden: torch.Tensor, target_hidden: torch.Tensor, lm_head_weight: torch.Tensor, *,
                           objective: str, labels: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                           temperature: float = 1.0, chunk_rows: int | None = None,
                           draft_ids: torch.Tensor | None = None, target_lse: torch.Tensor | None = None
                           ) -> torch.Tensor:
    """`bebop.losses.draft_loss` of draft_logits = draft_hidden·Wᵀ against target_logits = target_hidden·Wᵀ.

    draft_hidden   [B, T, γ, d]  the head's outputs h_k (`MTPHead.chain_hidden`)
    target_hidden  [B, T, γ, d]  the backbone's hidden states at the aligned positions (`chain_targets` applied
                                 to the hidden states); detached here
    lm_head_weight [V, d]        the backbone's LM head W, frozen (detached here); logits are made in its dtype
    labels, mask, temperature    as in `draft_loss` (labels are target ids)
    draft_ids      [K] | None    a draft vocabulary: the draft is a distribution over these ids (module docstring)
    target_lse     [B, T, γ]     with `draft_ids`: logsumexp(target_hidden·Wᵀ / T) at each aligned position
    """
    readout = Readout(lm_head_weight, temperature, chunk_rows, draft_ids, target_lse)
    return _loss_from_hidden(draft_hidden, target_hidden, objective, labels, mask, readout, with_alpha=False)[0]


def draft_loss_and_alpha_from_hidden(draft_hidden: torch.Tensor, target_hidden: torch.Tensor,
                                     lm_head_weight: torch.Tensor, *, objective: str,
                                     labels: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                                     temperature: float = 1.0, chunk_rows: int | None = None,
                                     draft_ids: torch.Tensor | None = None, target_lse: torch.Tensor | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(`draft_loss_from_hidden`, `acceptance_alpha_from_hidden` detached [M, γ]) from the same chunks' logits: what
    a training step optimises and logs, for one trip of the rows through the LM head instead of two."""
    readout = Readout(lm_head_weight, temperature, chunk_rows, draft_ids, target_lse)
    return _loss_from_hidden(draft_hidden, target_hidden, objective, labels, mask, readout, with_alpha=True)


def acceptance_alpha_from_hidden(draft_hidden: torch.Tensor, target_hidden: torch.Tensor,
                                 lm_head_weight: torch.Tensor, *, mask: torch.Tensor | None = None,
                                 temperature: float = 1.0, chunk_rows: int | None = None,
                                 draft_ids: torch.Tensor | None = None, target_lse: torch.Tensor | None = None
                                 ) -> torch.Tensor:
    """The RS acceptance α = Σ min(p, q) of each valid (anchor, step), chunked like `draft_loss_from_hidden`:
    float32 [M, γ] (anchors in row-major order of the mask). With `draft_ids`, q lives on S and α ≤ p(S)."""
    readout = Readout(lm_head_weight, temperature, chunk_rows, draft_ids, target_lse)
    draft_rows, target_rows, mask = _hidden_rows(draft_hidden, target_hidden, lm_head_weight, mask)  # [M·γ, d]
    lse_rows = _lse_rows(readout, target_rows, mask, draft_hidden.shape[:3])
    alpha, _ = _chunked_step_values("tv", draft_rows, target_rows, None, readout, lse_rows)
    return alpha.reshape(-1, draft_hidden.shape[2])  # [M, γ]


def acceptances_from_hidden(draft_hidden: torch.Tensor, target_hidden: torch.Tensor, lm_head_weight: torch.Tensor, *,
                            mask: torch.Tensor | None = None, temperature: float = 1.0, chunk_rows: int | None = None,
                            draft_ids: torch.Tensor | None = None, target_lse: torch.Tensor | None = None
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Both verification rules' acceptance of each valid (anchor, step), from one trip of the rows through the LM
    head and without a graph (scoring, not training): float32 [M, γ] each,

        RS  α = Σ min(p, q)      (`acceptance_alpha_from_hidden`'s, the same chunks' values)
        TO  α = p(argmax q)      the greedy draft's chance to pass

    With `draft_ids` the argmax runs over S and p there is exact (`target_lse`, or computed here)."""
    readout = Readout(lm_head_weight, temperature, chunk_rows, draft_ids, target_lse)
    check_temperature(temperature)
    with torch.no_grad():
        draft_rows, target_rows, mask = _hidden_rows(draft_hidden, target_hidden, lm_head_weight, mask)  # [M·γ, d]
        lse_rows = _lse_rows(readout, target_rows, mask, draft_hidden.shape[:3])  # [M·γ] | None
        weight = lm_head_weight.detach() if draft_ids is None else lm_head_weight.detach()[draft_ids]  # [V | K, d]
        rows = chunk_rows or default_chunk_rows(weight.shape[0])
        parts = [_rows_acceptances(draft, target, weight, temperature,
                                   None if lse_rows is None else lse_rows[i * rows:(i + 1) * rows])
                 for i, (draft, target) in enumerate(zip(draft_rows.split(rows), target_rows.split(rows)))]
    depth = draft_hidden.shape[2]
    return tuple(torch.cat([part[rule] for part in parts]).reshape(-1, depth) for rule in (0, 1))  # [M, γ] x2


def _rows_acceptances(draft_rows: torch.Tensor, target_rows: torch.Tensor, weight: torch.Tensor, temperature: float,
                      lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk of `acceptances_from_hidden`: rows [R, d] x2 -> (α_RS [R], α_TO [R])."""
    draft_logits = F.linear(draft_rows.to(weight.dtype), weight)  # [R, V | K]
    greedy = draft_logits.argmax(-1, keepdim=True)  # [R, 1] the TO draft (the temperature does not move it)
    if lse is None:
        target = F.linear(target_rows.to(weight.dtype), weight)  # [R, V] logits
        scaled = target.float() / temperature  # [R, V]
        greedy_logp = scaled.gather(-1, greedy)[:, 0] - scaled.logsumexp(-1)  # [R]
        return step_values("tv", draft_logits, target, None, temperature), greedy_logp.exp()
    target = target_logp(target_rows, weight, lse, temperature)  # [R, K] exact log p on S
    return step_values_on_vocab("tv", draft_logits, target, None, temperature), target.gather(-1, greedy)[:, 0].exp()


def _loss_from_hidden(draft_hidden, target_hidden, objective: str, labels, mask, readout: Readout, *,
                      with_alpha: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The loss [] and, `with_alpha`, α [M, γ] (detached) of the public functions above."""
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; valid objectives: {', '.join(OBJECTIVES)}")
    weight, draft_ids = readout.weight, readout.draft_ids
    draft_rows, target_rows, mask = _hidden_rows(draft_hidden, target_hidden, weight, mask)  # [M·γ, d]
    lse_rows = _lse_rows(readout, target_rows, mask, draft_hidden.shape[:3])
    label_rows = None
    if objective == "ce":
        logits_shape = torch.Size((*draft_hidden.shape[:3], weight.shape[0]))
        label_rows = check_labels(labels, logits_shape, mask)[mask].reshape(-1)  # [M·γ] target ids
        if draft_ids is not None:  # ids -> indices into S, -1 outside
            index = torch.full((weight.shape[0],), -1, dtype=torch.long, device=label_rows.device)
            label_rows = index.index_copy_(0, draft_ids, torch.arange(draft_ids.numel(), device=index.device))[
                label_rows]
    values, alpha = _chunked_step_values(objective, draft_rows, target_rows, label_rows, readout, lse_rows,
                                         with_alpha=with_alpha)  # [M·γ] each
    depth = draft_hidden.shape[2]
    # A mean over anchors (with "ce" on S, a data token outside S adds 0): a sum over rows split anywhere, so
    # micro-batches and ranks weighted by their anchors add up to the whole batch's loss.
    loss = anchor_losses(objective, values.reshape(-1, depth)).mean()  # mean over [M]
    return loss, None if alpha is None else alpha.reshape(-1, depth)


def _hidden_rows(draft_hidden: torch.Tensor, target_hidden: torch.Tensor, lm_head_weight: torch.Tensor,
                 mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Checks the inputs; returns the valid anchors' rows [M·γ, d] (draft, detached target) and the mask [B, T]."""
    if draft_hidden.dim() != 4:
        raise ValueError(f"draft_hidden must be [B, T, γ, d], got shape {tuple(draft_hidden.shape)}")
    if draft_hidden.shape != target_hidden.shape:
        raise ValueError(
            f"draft_hidden shape {tuple(draft_hidden.shape)} != target_hidden shape {tuple(target_hidden.shape)}"
        )
    if 0 in draft_hidden.shape:
        raise ValueError(f"draft_hidden has an empty dim: shape {tuple(draft_hidden.shape)}")
    dim = draft_hidden.shape[-1]
    if lm_head_weight.dim() != 2 or lm_head_weight.shape[1] != dim or lm_head_weight.shape[0] == 0:
        raise ValueError(f"lm_head_weight must be [V, d] with d = {dim}, got shape {tuple(lm_head_weight.shape)}")
    for name, x in (("draft_hidden", draft_hidden), ("target_hidden", target_hidden), ("lm_head_weight", lm_head_weight)):
        if not x.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got {x.dtype}")
    mask = check_mask(mask, *draft_hidden.shape[:2], draft_hidden.device)
    return draft_hidden[mask].reshape(-1, dim), target_hidden.detach()[mask].reshape(-1, dim), mask


def _lse_rows(readout: Readout, target_rows: torch.Tensor, mask: torch.Tensor, shape: torch.Size
              ) -> torch.Tensor | None:
    """The target's log-normaliser per valid row [M·γ] for a draft vocabulary (None without one): the readout's
    `target_lse` [B, T, γ] at the valid anchors, else computed from the whole LM head (no graph)."""
    if readout.draft_ids is None:
        if readout.target_lse is not None:
            raise ValueError("target_lse is for a draft vocabulary: pass draft_ids with it")
        return None
    check_ids(readout.draft_ids, readout.weight.shape[0])
    if readout.target_lse is None:
        with torch.no_grad():
            return log_normaliser(target_rows, readout.weight.detach(), readout.temperature,
                                  chunk_rows=readout.chunk_rows)
    if readout.target_lse.shape != shape:
        raise ValueError(f"target_lse must be [B, T, γ] = {tuple(shape)}, got {tuple(readout.target_lse.shape)}")
    return readout.target_lse.detach()[mask].reshape(-1).float()


def _chunked_step_values(objective: str, draft_rows: torch.Tensor, target_rows: torch.Tensor,
                         label_rows: torch.Tensor | None, readout: Readout, lse_rows: torch.Tensor | None, *,
                         with_alpha: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The step values of the rows (`step_values`, or `step_values_on_vocab` with a draft vocabulary), a chunk of
    rows at a time: rows [N, d] x2, labels [N] -> [N]; and, `with_alpha`, each row's acceptance α [N] (detached)
    from the same logits (else None)."""
    temperature, chunk_rows = readout.temperature, readout.chunk_rows
    check_temperature(temperature)
    if chunk_rows is not None and not (isinstance(chunk_rows, int) and chunk_rows >= 1):
        raise ValueError(f"chunk_rows must be a positive int or None, got {chunk_rows!r}")
    weight = readout.weight.detach()  # [V, d]
    if readout.draft_ids is not None:
        weight = weight[readout.draft_ids]  # [K, d]: W_S, gathered once for every chunk
    rows = chunk_rows or default_chunk_rows(weight.shape[0])
    values, alphas = [], []
    for i, (draft, target) in enumerate(zip(draft_rows.split(rows), target_rows.split(rows))):
        part = slice(i * rows, (i + 1) * rows)
        labels = None if label_rows is None else label_rows[part]  # [R]
        lse = None if lse_rows is None else lse_rows[part]  # [R]
        # Non-reentrant checkpoint: forward frees the chunk's [R, V] logits; backward recomputes them.
        value, alpha = checkpoint(_rows_step_values, objective, draft, target, weight, labels, temperature,
                                  with_alpha, lse, use_reentrant=False)  # [R], [R] | None
        values.append(value)
        alphas.append(alpha)
    return torch.cat(values), torch.cat(alphas) if with_alpha else None  # [N], [N] | None


def _rows_step_values(objective: str, draft_rows: torch.Tensor, target_rows: torch.Tensor, weight: torch.Tensor,
                      labels: torch.Tensor | None, temperature: float, with_alpha: bool, lse: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One chunk: rows [R, d] through `weight` (all of W [V, d], or W_S [K, d] when `lse` [R] is given), then the
    step values [R], and with `with_alpha` the acceptance α [R] of the same logits."""
    draft_logits = F.linear(draft_rows.to(weight.dtype), weight)  # [R, V | K]
    if lse is None:
        target = F.linear(target_rows.to(weight.dtype), weight)  # [R, V] logits
        values_of = step_values
    else:
        target = target_logp(target_rows, weight, lse, temperature)  # [R, K] exact log p on S
        values_of = step_values_on_vocab
    values = values_of(objective, draft_logits, target, labels, temperature)
    if not with_alpha:
        return values, None
    if objective in ("tv", "e2e_tv"):
        return values, values.detach()
    with torch.no_grad():
        return values, values_of("tv", draft_logits, target, None, temperature)
