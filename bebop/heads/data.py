"""The head's training batches: the corpus (bebop.heads.corpus) padded into fixed batches carrying what the frozen
backbone gives each position, computed once per corpus and kept on disk (`bebop.heads.feature_store`): its hidden
state [B, T, d] and, for a head with a draft vocabulary, the log-normaliser of its logits at the training temperature
[B, T] and the probability mass its next-token distributions put on each id [V]
(`bebop.draft_vocab.probability_mass`: one pass through the whole LM head, after which a training step needs only
S's rows of it). Logits are never kept: at a real vocabulary they are V/d times larger than the hidden states. A
fused head's extra layers (`taps`) are kept beside the hidden state in bf16 ("taps" [B, T, n d]): they only feed its
learned projection, while the top hidden behind the target's probabilities keeps the compute dtype.

Each batch's length is rounded up to a multiple of `length_bucket` (its padding masked out): a few shapes recur over
the run instead of one per batch, so the allocator reuses the steps' blocks instead of fragmenting the heap with
blocks of ever new sizes, which is what held train-mtp's peak memory above 4 GiB (docs/real-model.md)."""

from __future__ import annotations

from typing import Iterator

import torch

from bebop.data.batches import pad
from bebop.device import to_device
from bebop.draft_vocab import choose, probability_mass
from bebop.heads.config import TrainMTPConfig
from bebop.heads.feature_store import StoredBatches
from bebop.models.transformer import Transformer


def anchor_mask(trainable: torch.Tensor, lengths: torch.Tensor, depth: int) -> torch.Tensor:
    """[B, T] bool: anchors t whose chain inputs and targets t+1..t+depth+1 are all policy-written."""
    _, T = trainable.shape
    padded = torch.nn.functional.pad(trainable, (0, depth + 2), value=False)  # [B, T + depth + 2]
    window = padded.unfold(1, depth + 1, 1)[:, 1 : T + 1]  # [B, T, depth+1]: positions t+1..t+depth+1
    inside = torch.arange(T)[None, :] + depth + 1 < lengths[:, None]  # [B, T]
    return window.all(-1) & inside


@torch.no_grad()
def make_batches(model: Transformer, data: dict, config: TrainMTPConfig, use_bf16: bool,
                 weight: torch.Tensor | None = None, taps: tuple[int, ...] = ()) -> Iterator[dict]:
    """Fixed batches (sorted by length), yielded one at a time as the backbone makes them (`feature_store` keeps each
    on disk before the next is made): {"tokens", "mask" (anchor_mask), "hidden" [B, T, d]}, and with `weight` (the
    LM head [V, d] the head trains through, `bebop.heads.step.lm_head_weight`) also "lse" [B, T] float32 at the
    config's temperature and "mass" [V] float64 over the positions whose next token the policy wrote. With `taps`
    (a fused head's feature layers) "hidden" is the backbone's features [B, T, (1 + n) d], the top hidden first."""
    order = sorted(range(len(data["tokens"])), key=lambda i: len(data["tokens"][i]))
    device, d = model.lm_head.weight.device, model.config.hidden_size
    for start in range(0, len(order), config.batch_size):
        idx = order[start : start + config.batch_size]
        tokens, lengths = bucketed(pad([data["tokens"][i] for i in idx], 0), config.length_bucket)
        trainable, _ = bucketed(pad([[int(m) for m in data["trainable"][i]] for i in idx], 0), config.length_bucket)
        mask = anchor_mask(trainable.bool(), lengths, config.depth)
        if not bool(mask.any()):
            continue
        tokens, mask = to_device(tokens, device), to_device(mask, device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            _, hidden = model(tokens, compute_logits=False, taps=taps)  # [B, T, (1 + n) d]
        batch = {"tokens": tokens, "mask": mask, "hidden": hidden[..., :d].clone() if taps else hidden}  # [B, T, d]
        if taps:
            batch["taps"] = hidden[..., d:].to(torch.bfloat16)  # [B, T, n d]
        if weight is not None:
            batch.update(_targets(batch["hidden"], to_device(trainable.bool(), device), weight, config.temperature))
        yield batch


def bucketed(padded: tuple[torch.Tensor, torch.Tensor], bucket: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B, T'], lengths [B]) of `pad`'s output with T' = T rounded up to a multiple of `bucket` (zeros)."""
    tokens, lengths = padded
    extra = -tokens.shape[1] % bucket
    return torch.nn.functional.pad(tokens, (0, extra)), lengths


def features(batch: dict) -> torch.Tensor:
    """What the head reads of a batch: the hidden state [B, T, d], or with taps the features [B, T, (1 + n) d]."""
    if "taps" not in batch:
        return batch["hidden"]
    return torch.cat([batch["hidden"], batch["taps"].to(batch["hidden"].dtype)], -1)


def _targets(hidden: torch.Tensor, written: torch.Tensor, weight: torch.Tensor, temperature: float) -> dict:
    """{"lse" [B, T], "mass" [V]} of one batch: each position's log-normaliser, and the mass of the positions whose
    next token the policy wrote (those are the targets a head drafts for)."""
    B, T, d = hidden.shape
    next_written = torch.nn.functional.pad(written[:, 1:], (0, 1), value=False)  # [B, T]
    mass, lse = probability_mass(hidden.reshape(-1, d), weight, temperature, counted=next_written.reshape(-1))
    return {"lse": lse.reshape(B, T), "mass": mass}  # [B, T], [V]


def choose_draft_vocab(batches: StoredBatches, size: int, required: tuple[int, ...]) -> torch.Tensor:
    """The draft vocabulary [K] of `size` ids carrying the most of the policy's probability over `batches` (their
    "mass", `make_batches`, read alone), every `required` id included."""
    return choose(sum(batches.tensors("mass")), size, required)


def split_heldout(batches: StoredBatches, fraction: float) -> tuple[StoredBatches, StoredBatches]:
    """Every k-th batch is held out (batches are sorted by length, so both sides span all lengths)."""
    if len(batches) < 2:
        raise ValueError(f"need at least 2 batches of self-generated data to hold one out, got {len(batches)}")
    every = min(len(batches), max(2, round(1 / fraction)))
    held = [i for i in range(len(batches)) if i % every == every - 1]
    return batches.select(i for i in range(len(batches)) if i not in held), batches.select(held)
