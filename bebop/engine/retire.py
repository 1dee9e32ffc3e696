"""The host side of a decoding step after its verification: the step's one device-to-host copy read back as each
row's `StepRow` (`host_rows`), and each row's tokens appended to the rollout, finished rows told apart (`retire`)."""

from __future__ import annotations

import torch

from bebop.engine.batch import Batch
from bebop.engine.phases import PhaseClock, tick
from bebop.engine.rollout import RolloutBuilder
from bebop.engine.step import StepRow, unpack_host_row
from bebop.engine.transfer import host_copy


def host_rows(host: torch.Tensor, batch: Batch, depths: list[int], verdicts: dict,
              clock: PhaseClock | None = None) -> list[StepRow]:
    """The step's host table, copied once (the step's HOST SYNC), as each live row's `StepRow`; each drafting row's
    verdict goes to `verdicts` under its own depth ({γ: [[num_accepted, H(p_1..p_γ)], ...]})."""
    table = host_copy(host).tolist()  # HOST SYNC
    tick(clock, "host_sync")
    deepest = max(depths, default=0)  # once: inside the comprehension it made the step quadratic in the rows
    results = [unpack_host_row(table[slot], deepest, d) for slot, d in zip(batch.slots, depths)]
    for r, d in zip(results, depths):
        if d > 0:
            verdicts.setdefault(d, []).append([r.num_accepted, *r.verified_entropies])
    return results


def retire(batch: Batch, results: list[StepRow], depths: list[int],
           out: RolloutBuilder) -> tuple[list[int], list[tuple[int, int, list[int]]]]:
    """Append each row's emitted tokens to `out`. Returns the rows that go on (indices into the batch) and the parked
    rows' feeds for the engine's `_settle`: (index among the kept rows, start position, [stop token, env reply...])."""
    keep, parked = [], []
    for i, (r, depth) in enumerate(zip(results, depths)):
        n = r.num_accepted
        origins = ["plain"] if depth == 0 else ["accepted"] * n + ["recovered" if n < depth else "bonus"]
        state, stop_at, reply = out.append(batch.rows[i], r.tokens, r.logprobs, r.entropies, origins)
        if state != "done":
            keep.append(i)
        if state == "park":  # cache through the token before the stop; feed [stop, reply...] from there
            parked.append((len(keep) - 1, batch.lengths[i] + stop_at + 1, [r.tokens[stop_at], *reply]))
    return keep, parked
