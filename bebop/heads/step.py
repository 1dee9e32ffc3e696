"""One optimiser step of the draft loss on a cached batch, the held-out evaluation, and the head to train."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from bebop import distributed
from bebop.draft_vocab import coverage, target_logp
from bebop.heads.config import TrainMTPConfig
from bebop.heads.data import features
from bebop.losses import expected_accepted
from bebop.losses_from_hidden import acceptance_alpha_from_hidden, draft_loss_and_alpha_from_hidden
from bebop.models.checkpoint import HEAD_CONFIG, load_head
from bebop.models.mtp import MTPHead, chain_targets
from bebop.models.transformer import Transformer

EVAL_GAMMA = 3


def lm_head_weight(model: Transformer, use_bf16: bool, rows: int | None = None) -> torch.Tensor:
    """The frozen LM head [V, d] in the compute dtype, cast once per run (under autocast every matmul would
    cast the [V, d] weight again). `rows` keeps the tokenizer's ids only: padding rows are never sampled
    (`bebop.data.prompts.vocab_limit`), so target and draft are the distributions over the rest."""
    return model.lm_head.weight.detach()[:rows].to(torch.bfloat16 if use_bf16 else torch.float32)


@dataclass
class Chain:
    """A batch through the head's teacher-forced chain, beside what each (anchor, step) is trained to match."""

    draft: torch.Tensor  # [B, T, depth, d] the head's outputs
    target: torch.Tensor  # [B, T, depth, d] the backbone's hidden states behind the target distributions
    labels: torch.Tensor  # [B, T, depth] the data tokens
    mask: torch.Tensor  # [B, T] anchors whose whole chain is the policy's
    target_lse: torch.Tensor | None  # [B, T, depth] the targets' log-normalisers (a batch made with them)


def chain_outputs(head: MTPHead, model: Transformer, batch: dict, depth: int, use_bf16: bool) -> Chain:
    with torch.autocast(batch["hidden"].device.type, dtype=torch.bfloat16, enabled=use_bf16):
        draft = head.chain_hidden(model, features(batch), batch["tokens"], depth)
    # chain_targets aligns any per-position tensor: the hidden states behind the target logits, and their lse.
    target, labels, _ = chain_targets(batch["hidden"], batch["tokens"], depth)
    lse = None if "lse" not in batch else chain_targets(batch["lse"][..., None], batch["tokens"], depth)[0][..., 0]
    return Chain(draft, target, labels, batch["mask"], lse)


def readout(head: MTPHead, chain: Chain) -> dict:
    """How the losses read the chain out: through the head's draft vocabulary when it has one."""
    if head.draft_ids is None:
        return {}
    if chain.target_lse is None:
        raise ValueError("a head with a draft vocabulary trains on batches made with the LM head (their lse)")
    return {"draft_ids": head.draft_ids, "target_lse": chain.target_lse}


def train_step(head, model, batch, optimizer, lr: float, config: TrainMTPConfig, use_bf16: bool,
               weight: torch.Tensor) -> tuple[float, float, float]:
    """One AdamW step of the draft loss through the LM head `weight` [V, d] (`lm_head_weight`); returns (loss,
    mean d_TV over the trained (anchor, step), the gradient norm before clipping).

    Under torchrun every rank holds the same `batch` and trains on its block of rows: its loss (a mean over its
    anchors) weighted by its share of the batch's anchors, the gradients summed over the ranks, which is the
    single-process step on the whole batch (one process: the block is the batch, the sums are no-ops)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    B = batch["tokens"].shape[0]
    start, stop = (B * r // distributed.world() for r in (distributed.rank(), distributed.rank() + 1))
    part = {k: v[start:stop] for k, v in batch.items()}  # [b, ...] this rank's rows
    count = int(part["mask"].sum())  # HOST SYNC (as every step's logged loss is)
    total = int(distributed.all_reduce(part["mask"].sum()))
    if total == 0:
        raise ValueError("the batch has no anchor with a whole draft chain inside its rows")
    device = batch["tokens"].device
    optimizer.zero_grad(set_to_none=True)
    loss_sum = d_tv_sum = torch.zeros((), dtype=torch.float64, device=device)
    if count:  # a rank without anchors adds nothing (its gradients count as zeros)
        chain = chain_outputs(head, model, part, config.depth, use_bf16)
        loss, alpha = draft_loss_and_alpha_from_hidden(chain.draft, chain.target, weight, objective=config.objective,
                                                       labels=chain.labels, mask=chain.mask,
                                                       temperature=config.temperature,
                                                       **readout(head, chain))  # [], [M, depth]
        (loss * (count / total)).backward()
        loss_sum, d_tv_sum = loss.detach().double() * count, (1.0 - alpha.double()).mean(-1).sum()
    distributed.all_reduce_grads(head.parameters())
    grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), config.grad_clip)  # before clipping
    optimizer.step()
    return (float(distributed.all_reduce(loss_sum)) / total, float(distributed.all_reduce(d_tv_sum)) / total,
            float(grad_norm))


@torch.no_grad()
def evaluate(head, model, batches: Sequence[dict], config: TrainMTPConfig, use_bf16: bool,
             weight: torch.Tensor) -> dict[str, float]:
    """Held-out d_TV per draft step, the teacher-forced RS accept length at γ = 3, and with a draft vocabulary its
    coverage p(S) at the first step's targets (the most any head over S could accept there)."""
    alphas, covered = [], []
    for batch in batches:
        chain = chain_outputs(head, model, batch, config.depth, use_bf16)
        alphas.append(acceptance_alpha_from_hidden(chain.draft, chain.target, weight, mask=chain.mask,
                                                   temperature=config.temperature,
                                                   **readout(head, chain)))  # [M, depth]
        if head.draft_ids is not None:
            rows = chain.target[:, :, 0][chain.mask]  # [M, d]
            lse = chain.target_lse[:, :, 0][chain.mask]  # [M]
            covered.append(coverage(target_logp(rows, weight[head.draft_ids], lse, config.temperature)))
    alpha = torch.cat(alphas)  # [N, depth]
    out = {"mtp/eval/d_tv_mean": float(1 - alpha.mean())}
    if covered:
        out["mtp/eval/coverage"] = float(torch.cat(covered).mean())
    out.update({f"mtp/eval/d_tv_pos/{k}": float(1 - alpha[:, k].mean()) for k in range(config.depth)})
    gamma = min(EVAL_GAMMA, config.depth)
    out["mtp/eval/accept_length_tf"] = float(1 + expected_accepted(alpha[:, :gamma]).mean())
    return out


def new_head(model: Transformer, config: TrainMTPConfig) -> MTPHead:
    """The head to train: a copy of `init_head` (adaptation, its draft vocabulary, feature layers and decoder layers
    kept; a top-layer head given `feature_layers` grows a fuse, and a shallower one given `head_layers` grows layers,
    each starting as the identity), else fresh (layers copied from the backbone's last). A draft vocabulary of
    `config.draft_vocab` ids is chosen later, from the batches."""
    if config.init_head is not None:
        head = load_head(config.init_head, model.config, dtype=torch.float32)
        if config.draft_vocab is not None and head.draft_size != config.draft_vocab:
            raise ValueError(f"--init {config.init_head} drafts over {head.draft_size} ids, not --draft-vocab "
                             f"{config.draft_vocab}: adapt it with its own vocabulary (leave --draft-vocab out)")
        if config.feature_layers and head.feature_layers != config.feature_layers:
            if head.feature_layers:
                raise ValueError(f"--init {config.init_head} reads feature layers {list(head.feature_layers)}, not "
                                 f"--feature-layers {list(config.feature_layers)}: leave --feature-layers out")
            head = head.with_features(config.feature_layers)  # a top-layer head grows a fuse, starting as itself
        check_init_layers(config, len(head.layers))
        if config.head_layers is not None and config.head_layers != len(head.layers):
            torch.manual_seed(config.seed)  # the added layers' initialisation only
            head = head.with_layers(config.head_layers)  # added layers pass their input through: it starts as itself
        head.trained_depth, head.objective = config.depth, config.objective
        return head.train()
    torch.manual_seed(config.seed)  # the head's initialisation only
    head = MTPHead(model.config, trained_depth=config.depth, objective=config.objective,
                   feature_layers=config.feature_layers, num_layers=config.head_layers or 1)
    if config.init_from_backbone:  # the head's layers start as the backbone's last ones, in order
        for layer, source in zip(head.layers, model.model.layers[-len(head.layers):]):
            layer.load_state_dict(source.state_dict())
    return head.float().train()


def check_init_layers(config: TrainMTPConfig, init_layers: int | None = None) -> None:
    """Refuse a `head_layers` below the decoder layers of the head `init_head` (`init_layers`, else read from its
    head.json, so a job refuses before any work): a head grows, it is never cut."""
    if config.init_head is None or config.head_layers is None:
        return
    meta = Path(config.init_head) / HEAD_CONFIG
    if init_layers is None and meta.is_file():
        init_layers = json.loads(meta.read_text()).get("num_hidden_layers", 1)
    if init_layers is not None and config.head_layers < init_layers:
        raise ValueError(f"--init {config.init_head} stacks {init_layers} decoder layers, more than --head-layers "
                         f"{config.head_layers}: leave --head-layers out")


def bf16_copy(head: MTPHead, model: Transformer) -> MTPHead:
    copy = MTPHead(model.config, trained_depth=head.trained_depth, objective=head.objective,
                   draft_ids=head.draft_ids, feature_layers=head.feature_layers, num_layers=len(head.layers))
    copy.load_state_dict(head.state_dict())
    return copy.to(torch.bfloat16)
