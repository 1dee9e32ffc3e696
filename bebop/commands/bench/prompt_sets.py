"""What each `bebop bench engine` cell decodes: `--prompt-sets K` sets of `--batch` prompts, one call after another,
timed over all of them, so that a few rows are measured on more than one prompt (at one row a set is one prompt and
one sample path, whose acceptance, and so every depth's speed, is that path's luck); the calls' stats pooled as one
call's (the counters summed, the rates derived again: `bebop.metrics.derive`). With `--stop`, rows end at the task's
stops as a rollout's do (`bebop.play.for_task`) instead of writing past the answer for a fixed count: a cell's
seconds then count per generated token, each round's scaled to the tokens the fixed count would have made."""

from __future__ import annotations

import re
from dataclasses import replace

import torch

from bebop.commands.bench.costs import bench_prompts, left_padded
from bebop.engine.rollout import GenerationConfig, Rollout
from bebop.metrics import derive, pool

# The keys of a rollout's stats that are sums over its steps and rows beside the verification counters
# `bebop.metrics.pool` sums (the call's totals, the engine's timings, the depth controller's counts); every other key
# is a rate derived from them.
ADDITIVE = re.compile(r"wall_time_s|num_prompts|num_generated_tokens|num_steps|engine/.+|spec/num_.+")

PromptSet = tuple[list[list[int]], torch.Tensor, torch.Tensor]  # bench_prompts' (lists, left-padded [B, P], mask)


def prompt_sets(args, vocab_size: int, batch: int, generator: torch.Generator, tokenizer=None) -> list[PromptSet]:
    """`args.prompt_sets` sets of `batch` prompts: a task's first batch x K held-out examples, in turn
    (K = 1: exactly `bench_prompts`'), or random tokens."""
    count = args.prompt_sets
    lists, padded, mask = bench_prompts(args, vocab_size, batch * count, generator, tokenizer)
    if count == 1:
        return [(lists, padded, mask)]
    return [(part, *left_padded(part)) for part in (lists[i * batch:(i + 1) * batch] for i in range(count))]


def generate_sets(engine, sets: list[PromptSet], config: GenerationConfig, decode=None) -> Rollout:
    """Every set through `engine.generate`, in turn: the last call's rollout with the calls' stats pooled."""
    rollouts = [engine.generate(lists, config, decode=decode) for lists, _, _ in sets]
    if len(rollouts) == 1:
        return rollouts[0]
    return replace(rollouts[-1], stats=pooled_stats([r.stats for r in rollouts]))


class SetsCell:
    """A timed cell: every set through `engine` under `config` (`decode`: the tokenizer's, where the config has stop
    strings), counting the tokens each call generated in `tokens` (the warm-up's, then each round's)."""

    def __init__(self, engine, sets: list[PromptSet], config: GenerationConfig, decode=None):
        self.engine, self.sets, self.config, self.decode = engine, sets, config, decode
        self.tokens: list[int] = []

    def __call__(self) -> Rollout:
        rollout = generate_sets(self.engine, self.sets, self.config, self.decode)
        self.tokens.append(rollout.stats["num_generated_tokens"])
        return rollout


def with_stops(args, config: GenerationConfig, tokenizer, vocab_size: int) -> tuple[GenerationConfig, object]:
    """(config, decode): with `--stop`, the config plus the task's stops and the tokenizer's decode; else as given."""
    if not args.stop:
        return config, None
    from bebop.data.tasks import get as get_task
    from bebop.play import for_task

    config = for_task(config, get_task(args.task), tokenizer, vocab_size)
    return config, tokenizer.decode if config.stop_strings else None


def per_generated_token(timed: dict, cells: dict, tokens: int) -> dict:
    """`interleaved`'s {key: (seconds per round, result)} with the rounds of each cell that counts its tokens
    (`SetsCell`, the HF peer's `HFCell`: a `tokens` list) scaled to `tokens` generated tokens (rows that stop make
    fewer, and differ from cell to cell by their sample paths); other cells (the step-cost probes) as timed."""
    out = dict(timed)
    for key, cell in cells.items():
        if getattr(cell, "tokens", None) is not None:
            seconds, result = timed[key]
            out[key] = ([s * tokens / n for s, n in zip(seconds, cell.tokens[1:], strict=True)], result)
    return out


def pooled_stats(stats: list[dict]) -> dict:
    """Several calls' stats as one call's: the verification counters pooled (`bebop.metrics.pool`) and each other
    additive key summed (0 where a call lacks it: a depth or a rows bucket only some calls ran), the other keys of
    the last call, then the rates derived again."""
    keys = {key for s in stats for key in s if ADDITIVE.fullmatch(key)}
    out = {**stats[-1], **{key: sum(s.get(key, 0) for s in stats) for key in keys}, **pool(stats)}
    if "spec/num_drafts" in out:
        out.update(derive(out))
    out["tokens_per_s"] = out["num_generated_tokens"] / out["wall_time_s"] if out["wall_time_s"] > 0 else 0.0
    return out
