"""Data-parallel GRPO under torchrun (bebop.distributed): what each rank rolls out, and how the ranks' pieces make
the single-process step.

    global batch = prompts_per_step x group_size rows, drawn from step_seed(seed, step) exactly as one process draws
    them; rank r keeps the r-th contiguous block of prompt groups, so the ranks' blocks in rank order are the
    single-process batch. Advantages are normalised within a group, so ranks never exchange rollouts.

The update: the GRPO loss is a token sum over the global policy-token count (all-reduced), and FSDP2 sums the ranks'
gradients (`bebop.distributed.shard`), so the gradient is the single-process one. Every rank must issue the same
collectives, so a rank with fewer micro-batches than another runs empty ones (mask all False: no gradient).

Logging: rank 0 alone writes (the others hold a `bebop.runlog.null.NullWriter`); the record it logs is the ranks' records combined
(`combine_records`): counters and the actor's token-weighted stats summed, rewards pooled, entropy weighted by tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from bebop import distributed

# actor/* stats are token sums over the global count: summing the ranks' gives the batch's. Not the clipped norm, nor
# the entropy bonus's coefficient (the same on every rank).
_SUMMED_PREFIXES = ("spec/num_", "spec/by_entropy/", "engine/", "actor/")
_SUMMED_EXCEPT = ("actor/grad_norm", "actor/entropy", "actor/entropy_coef", "actor/entropy_coef_next")
_RANK_SEED = 104_729


def check_world(prompts_per_step: int, world: int) -> None:
    """One ValueError line, before any model loads, when the prompts do not split evenly over the ranks."""
    if prompts_per_step % world:
        raise ValueError(f"prompts_per_step {prompts_per_step} does not split over {world} ranks: "
                         "use a multiple of the number of processes (torchrun --nproc-per-node)")


def rank_block(rows: list, rank: int, world: int) -> list:
    """The rank's contiguous block of `rows` (whole prompt groups when the prompts split evenly)."""
    size = len(rows) // world
    return rows[rank * size:(rank + 1) * size]


def rank_seed(seed: int, rank: int) -> int:
    """The rank's sampling seed: rank 0 samples with the step's own seed (one process's), the others with their own,
    so no two ranks draw the same random numbers."""
    return (seed + rank * _RANK_SEED) % (2**31 - 1)


def empty_micro_batches(count: int) -> int:
    """How many empty micro-batches this rank runs so that every rank runs as many as the busiest one."""
    return int(distributed.all_reduce(count, "max")) - count


def combine_records(record: dict, rewards: torch.Tensor, entropy_tokens: int) -> dict:
    """The global step record from every rank's (record, rewards [n], number of tokens behind actor/entropy)."""
    parts = distributed.all_gather_object((record, rewards.tolist(), entropy_tokens))
    if len(parts) == 1:
        return record
    records = [p[0] for p in parts]
    pooled = torch.tensor([r for p in parts for r in p[1]], dtype=torch.float32)  # [N]
    weights = [p[2] for p in parts]
    out: dict[str, Any] = {}
    # A rank logs only the entropy bins it filled and the depths its engine chose (γ auto): a counter another rank
    # lacks counted 0 there, and a key only a later rank has is kept.
    for key in dict.fromkeys(k for r in records for k in r):
        values = [r[key] for r in records if key in r]
        value = values[0]
        if not isinstance(value, (int, float)) or isinstance(value, bool) or key in ("step", "policy_version"):
            out[key] = value
        elif (key.startswith(_SUMMED_PREFIXES) and key not in _SUMMED_EXCEPT) or key == "perf/throughput":
            out[key] = sum(values)
        elif key == "actor/entropy":
            out[key] = sum(v * w for v, w in zip(values, weights)) / max(sum(weights), 1)  # every rank has it
        elif key.startswith("timing_s/"):
            out[key] = max(values)  # the step waits for the slowest rank
        else:  # per-row means over equal row counts (lengths, stop fraction), and values equal on every rank
            out[key] = sum(values) / len(values)
    out["critic/score/mean"] = float(pooled.mean())
    out["critic/score/std"] = float(pooled.std(unbiased=False))
    return out
