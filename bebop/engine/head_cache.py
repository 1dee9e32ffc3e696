"""`HeadCache`: how the engine keeps the MTP head's cache fed (an object `bebop.engine.generate.Engine` owns).

The head's entry at position i pairs the target's h_i with token i+1; the last entry of a row is the step-1 draft
query of its next step. Two ways in besides a decoding step's own catch-up (bebop.engine.step.catch_up):

  * `feed`      with a feed (the prefill, or an env reply): the run's entries, then each row's last;
  * `catch_up`  under gamma="auto", before a step drafts again: the entries plain steps left behind.

Of all the entries written at once only the last one's output is read, so the others are written as keys and values
alone (`MTPHead.write_keys`: the layer's first matmul, not its attention, output projection and MLP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from bebop.engine.batch import Batch, rows_of
from bebop.engine.buckets import Buckets


@dataclass(frozen=True)
class FeedRows:
    """The rows a feed writes (`Engine._feed`): each feed's slot, and the runs that were computed once per prompt."""

    slots: torch.Tensor  # [F] long: each feed's row slot
    run_slots: torch.Tensor  # [U] long: the slots of the runs computed (a prompt several feeds share, once)
    whole_run: bool  # the runs are the whole batch in order (no sub-cache)
    whole_feed: bool  # the feeds are the whole batch in order
    copies: tuple[torch.Tensor, torch.Tensor] | None  # (slots that copy, the slots they copy), [F - U] each


class HeadCache:
    """The head's cache upkeep, with the head's cached forwards (`step`: `mtp.forward_cached`; `keys_step`:
    `mtp.write_keys`; compiled or not, as the engine wraps them)."""

    def __init__(self, model: torch.nn.Module, mtp: torch.nn.Module, step: Callable, keys_step: Callable,
                 buckets: Buckets):
        self.model, self.mtp, self.step, self.keys_step, self.buckets = model, mtp, step, keys_step, buckets

    def feed(self, batch: Batch, rows: FeedRows, hidden, hidden_last, tokens, token, starts, last, kv_len: int) -> None:
        """The head's part of a feed: its entry at position i pairs h_i with token i+1, the last one (the step-1 draft
        query) the row's sampled token. The runs' entries are written (keys and values only: no output of theirs is
        read) and copied to the rows sharing them; the last entry runs again per row, in full, with the row's own
        token. hidden [U, W, d], hidden_last [F, d], tokens [U, W], token [F], starts and last [U]."""
        next_tokens = torch.cat([tokens[:, 1:], tokens[:, :1]], 1)  # [U, W]: the last entries' are placeholders
        with rows_of(batch.draft_cache, rows.run_slots, rows.whole_run) as draft_cache:
            draft_cache.lengths.copy_(starts)
            self.keys_step(self.model, hidden, next_tokens, draft_cache, kv_len=kv_len)
            draft_cache.lengths += last + 1
        if rows.copies is not None:
            batch.draft_cache.copy_rows(rows.copies[1], rows.copies[0])
        with rows_of(batch.draft_cache, rows.slots, rows.whole_feed) as draft_cache:
            draft_cache.lengths -= 1
            _, out = self.step(self.model, hidden_last[:, None], token[:, None], draft_cache, kv_len=kv_len,
                               compute_logits=False)  # [F, 1, d]
            draft_cache.lengths += 1
        batch.draft_hidden[rows.slots] = out  # [F, 1, d]
        batch.draft_logits[rows.slots] = self.mtp.logits(self.model, out)[:, 0]  # [F, K]

    def catch_up(self, batch: Batch) -> None:
        """Catch the head's cache up on the S positions plain steps decoded without it (`Batch.head_lag`): entry L+s
        pairs the target's h_{L+s} with the token it emitted, as S steps' catch-ups would have written them. Only the
        last entry's output is read (the next step-1 draft query): the others get their keys and values alone."""
        hidden = torch.cat([h for h, _ in batch.head_lag], 1)  # [P, S, d]
        tokens = torch.cat([t for _, t in batch.head_lag], 1)  # [P, S]
        batch.head_lag = []
        cache = batch.draft_cache
        cache.lengths.clamp_(max=cache.max_len - tokens.shape[1])  # padding rows only: live rows are S behind
        kv_len = self.buckets.kv_len(max(batch.lengths) + 1, cache.max_len)
        if tokens.shape[1] > 1:
            self.keys_step(self.model, hidden[:, :-1], tokens[:, :-1], cache, kv_len=kv_len)
            cache.lengths += tokens.shape[1] - 1
        _, out = self.step(self.model, hidden[:, -1:], tokens[:, -1:], cache, kv_len=kv_len,
                           compute_logits=False)  # [P, 1, d]
        cache.lengths += 1
        batch.draft_hidden = out  # [P, 1, d]: the next step-1 draft query
        batch.draft_logits = self.mtp.logits(self.model, out)[:, 0]  # [P, K]
