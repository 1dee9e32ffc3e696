"""`bebop bench engine`'s inputs beside its timed generations: the prompts (random tokens, or a task's examples in
the policy's chat format) and the step-cost micro-benchmarks behind each row's theoretical speedup.

A step's costs are in units of a one-token target forward: the verification forward over γ + 1 tokens, and a draft
position (the head's catch-up pass plus γ - 1 single steps, over γ). For a head with a draft vocabulary the draft
position is also timed with the same head drafting over the whole vocabulary (`draft_cost_full_vocab`), so a row
shows what the draft vocabulary saves; prompt lookup has no head to time (its draft is host work inside the step).
"""

from __future__ import annotations

import copy

import torch

from bebop.commands.bench.rounds import round_ratio
from bebop.engine import Engine

COST_PARTS = ("catch_up", "single", "target_1", "target_verify")
EXAMPLE_SEED = 3_000_017  # held-out examples, as eval-mtp draws them


def bench_prompts(args, vocab_size: int, batch: int, generator: torch.Generator, tokenizer=None
                  ) -> tuple[list[list[int]], torch.Tensor, torch.Tensor]:
    """(prompts as lists for bebop, the same left-padded [B, P] for HF, their attention mask [B, P]): `--task`'s
    held-out examples in the policy's chat format, else random tokens of `--prompt-len`."""
    if args.task is None:
        prompts = torch.randint(1, vocab_size, (batch, args.prompt_len), generator=generator)
        return prompts.tolist(), prompts, torch.ones_like(prompts)
    from bebop.data.prompts import prompt_format, prompt_ids
    from bebop.data.tasks import get as get_task

    lists = prompt_ids(tokenizer, get_task(args.task).sample(batch, seed=EXAMPLE_SEED), prompt_format("auto", tokenizer))
    return lists, *left_padded(lists)


def left_padded(lists: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of any lengths as HF takes them: left-padded with 0 to the longest [B, P], and their mask [B, P]."""
    width = max(len(p) for p in lists)
    padded = torch.tensor([[0] * (width - len(p)) + p for p in lists])  # [B, P]
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in lists])  # [B, P]
    return padded, mask


def cost_cells(engines: dict, gammas: list[int], batch: int, context: int) -> dict:
    """The micro-benchmark cells of every engine (key: compiled or not) that drafts with a head, per static γ:
    {("cost", part, γ, compiled): fn}, and ("cost_full", ...) for a head over a draft vocabulary."""
    cells = {}
    for compiled, engine in engines.items():
        if engine.mtp is None:
            continue
        full = None
        if engine.mtp.draft_ids is not None:
            full = Engine(engine.model, copy.deepcopy(engine.mtp).use_draft_vocab(None), compile=compiled)
        for gamma in gammas:
            cells.update({("cost", part, gamma, compiled): fn
                          for part, fn in step_cost_cells(engine, batch, gamma, context).items()})
            if full is not None:
                cells.update({("cost_full", part, gamma, compiled): fn
                              for part, fn in step_cost_cells(full, batch, gamma, context).items()})
    return cells


def record_costs(timed: dict, gamma: int, compiled: bool) -> dict:
    """A row's costs from the timed cells: {verify_cost, draft_cost[, draft_cost_full_vocab]}, {} when the engine
    drafts without a head."""
    if ("cost", "target_1", gamma, compiled) not in timed:
        return {}
    costs = step_costs({part: timed[("cost", part, gamma, compiled)][0] for part in COST_PARTS}, gamma)
    if ("cost_full", "target_1", gamma, compiled) in timed:
        full = step_costs({part: timed[("cost_full", part, gamma, compiled)][0] for part in COST_PARTS}, gamma)
        costs["draft_cost_full_vocab"] = full["draft_cost"]
    return costs


@torch.inference_mode()  # the caches are inference tensors, as in generate(): the same compiled graphs
def step_cost_cells(engine: Engine, batch: int, gamma: int, context: int, calls: int = 20) -> dict:
    """Zero-argument callables, each running `calls` calls at `context` of: a one-token target forward
    ("target_1"), a (γ+1)-token one (verification, "target_verify"), the head's catch-up pass over γ+1 tokens
    ("catch_up") and one single head step ("single"), through the engine's own (compiled or eager) forwards."""
    model, head = engine.model, engine.mtp
    cache, draft_cache = model.new_cache(batch, context + gamma + 2), head.new_cache(batch, context + gamma + 2)
    cache.lengths.fill_(context)
    draft_cache.lengths.fill_(context)
    one = torch.zeros(batch, 1, dtype=torch.long, device=cache.device)
    many = torch.zeros(batch, gamma + 1, dtype=torch.long, device=cache.device)
    hidden = torch.zeros(batch, 1, model.config.hidden_size, dtype=cache.dtype, device=cache.device)
    hidden_many = hidden.expand(batch, gamma + 1, -1).contiguous()  # contiguous as in the engine: its graph
    kv = context + gamma + 1

    def head_step(tokens, h):
        _, out = engine.head_cache.step(model, h, tokens, draft_cache, kv_len=kv, compute_logits=False)
        return head.logits(model, out[:, -1:])

    def repeated(fn, *args):
        def run():
            with torch.inference_mode(), engine.packed_weights():  # as inside generate()
                return [fn(*args) for _ in range(calls)][-1]
        return run

    return {"catch_up": repeated(head_step, many, hidden_many), "single": repeated(head_step, one, hidden),
            "target_1": repeated(lambda t: engine.target_step(t, cache, kv_len=kv), one),
            "target_verify": repeated(lambda t: engine.target_step(t, cache, kv_len=kv), many)}


def step_costs(round_seconds: dict[str, list[float]], gamma: int) -> dict[str, float]:
    """From the per-round seconds of `step_cost_cells`: the verification forward and the head's share per draft
    token (one catch-up pass plus γ-1 single steps, divided by γ), each in one-token target forwards."""
    target_1 = round_seconds["target_1"]
    draft = [(c + (gamma - 1) * s) / gamma for c, s in zip(round_seconds["catch_up"], round_seconds["single"])]
    return {"verify_cost": round_ratio(round_seconds["target_verify"], target_1),
            "draft_cost": round_ratio(draft, target_1)}
