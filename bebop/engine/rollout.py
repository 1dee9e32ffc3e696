"""What the engine gives back (`Rollout`) for what it is asked (`GenerationConfig`, `bebop.engine.config`).

A `Rollout` carries everything RL needs from generation (tokens, the behaviour policy's log-probs) and
everything the paper's analysis needs (target entropy per token, where each token came from, and the
speculative counters of `bebop.metrics`).

Stops (`stop_tokens` ids, `stop_strings` text) are decided once, as a row's tokens arrive, by
`bebop.engine.stops`; the row keeps its tokens through the one that completes the stop, and `Rollout.stops` records
what it was, so the texts an environment and a reward read are cut from that record.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from bebop.engine.config import GenerationConfig
from bebop.engine.depth.choice import Choice
from bebop.engine.depth.counters import depth_counters
from bebop.engine.stops import Decode, Stop, StopMatcher
from bebop.metrics import SpecCounters, derive

# Where each token of a completion came from. "plain": sampled straight from the target (plain decoding, and the
# first token after a prompt or an environment reply); "accepted" / "recovered" / "bonus": the outcomes of a
# verification step; "env": an environment's reply in a multi-turn rollout (not the policy's: masked from RL).
ORIGINS = ("plain", "accepted", "recovered", "bonus", "env")

# env(row, tokens_so_far, stop) -> reply token ids to append and continue from, or None to end the row. `stop` is
# the one the row just made (`bebop.engine.stops.text_through` gives the transcript an environment reads).
Env = Callable[[int, list[int], Stop], "list[int] | None"]


def check_prompts(prompts: list[list[int]], vocab: int) -> None:
    """One line naming the first bad prompt: none at all, an empty one, or token ids outside [0, vocab)."""
    if not prompts:
        raise ValueError("prompts is empty: pass at least one prompt")
    for i, prompt in enumerate(prompts):
        if len(prompt) == 0:
            raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token")
        bad = [t for t in prompt if not 0 <= int(t) < vocab]
        if bad:
            raise ValueError(f"prompts[{i}] has token ids out of range [0, {vocab}): {bad[:5]}")


def check_request(prompts: list[list[int]], config: GenerationConfig, model_config, head) -> None:
    """What `Engine.generate` refuses before any work: bad prompts, ids past the model's vocabulary, a request
    longer than its positions, drafts without a head; a depth past the head's trained one only warns."""
    vocab = model_config.vocab_size
    check_prompts(prompts, vocab)
    if config.vocab_limit is not None and config.vocab_limit > vocab:
        raise ValueError(f"vocab_limit={config.vocab_limit} exceeds the model's vocabulary of {vocab} ids")
    if any(not 0 <= t < vocab for t in config.stop_tokens):
        raise ValueError(f"stop_tokens has ids out of range [0, {vocab}): {config.stop_tokens}")
    need = max(len(p) for p in prompts) + config.max_new_tokens + config.depth + 1
    if need > model_config.max_position_embeddings:
        raise ValueError(f"longest prompt + max_new_tokens + gamma + 1 = {need} exceeds the model's "
                         f"max_position_embeddings={model_config.max_position_embeddings}")
    if config.depth > 0 and head is None:
        raise ValueError(f"method {config.method!r} with gamma={config.gamma!r} needs a draft: pass Engine(model, mtp) "
                         "or Engine(model, PromptLookup()), or use gamma=0 for plain decoding")
    draft_ids = getattr(head, "draft_ids", None)
    if config.depth > 0 and draft_ids is not None and int(draft_ids[-1]) >= (config.vocab_limit or vocab):
        raise ValueError(f"the head's draft vocabulary holds id {int(draft_ids[-1])}, past the "
                         f"{config.vocab_limit or vocab} ids this generation may sample")
    depth = getattr(head, "trained_depth", None)
    # under "auto" a depth past the trained one is priced by the acceptance measured there, never taken blindly
    if not config.auto and config.depth > 0 and depth is not None and config.depth > depth:
        warnings.warn(f"gamma={config.depth} exceeds the head's trained depth {depth}: "
                      "acceptance at the extra positions is untrained", stacklevel=4)


@dataclass
class Rollout:
    tokens: list[list[int]]  # generated tokens per prompt (the stop token included when one ended the row)
    logprobs: list[list[float]]  # log p(token) under the processed target distribution: RL's old log-probs
    entropy: list[list[float]]  # H(p) in nats at each generated position
    origin: list[list[str]]  # one of ORIGINS per token
    finish_reason: list[str]  # "stop" | "length"
    stops: list[Stop | None]  # the stop that ended each row (finish_reason "stop"), else None
    stats: dict[str, Any] = field(default_factory=dict)  # counters, derived rates, timings, tokens/s

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def policy_mask(self) -> list[list[bool]]:
        """True where the policy generated the token (what the RL loss may use), False for environment replies."""
        return [[o != "env" for o in row] for row in self.origin]


class RolloutBuilder:
    """Host-side per-prompt results, appended once per engine step; applies stops, budgets and `env`."""

    def __init__(self, n: int, config: GenerationConfig, env: Env | None = None, vocab_size: int | None = None,
                 decode: Decode | None = None, *, prompts: list[list[int]] | None = None):
        self.matcher = StopMatcher(config.stop_tokens, config.stop_strings, decode)
        self.config, self.env, self.vocab_size = config, env, vocab_size
        self.prompts = prompts  # what `history` starts from (a prompt-lookup draft reads it)
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.entropy: list[list[float]] = [[] for _ in range(n)]
        self.origin: list[list[str]] = [[] for _ in range(n)]
        self.finish: list[str] = ["length"] * n
        self.stops: list[Stop | None] = [None] * n

    def history(self, row: int) -> list[int]:
        """Row `row`'s tokens so far: its prompt, then everything emitted (environment replies included; the last is
        the pending token, sampled but not yet verified)."""
        return [*(self.prompts[row] if self.prompts is not None else ()), *self.tokens[row]]

    def append(self, row: int, tokens: list[int], logprobs: list[float], entropy: list[float],
               origins: list[str]) -> tuple[str, int, list[int]]:
        """Append one step's emitted tokens to prompt `row`.

        Returns (state, j, reply): "run" (keep going), "done" (finished), or "park": token j of `tokens` was a
        stop token or completed a stop string, and `env` replied with `reply` (already appended; tokens after j
        were dropped), so the engine must feed it and continue.
        """
        take = min(len(tokens), self.config.max_new_tokens - len(self.tokens[row]))
        found = self.matcher.first(self.tokens[row], tokens[:take])
        if found is not None:
            take = found[0] + 1
        self._extend(row, tokens[:take], logprobs[:take], entropy[:take], origins[:take])
        if found is not None:
            stop_at, stop = found
            reply = self._reply(row, stop)
            if reply:
                return ("park", stop_at, reply) if len(self.tokens[row]) < self.config.max_new_tokens else ("done", 0, [])
            self.finish[row], self.stops[row] = "stop", stop
            return "done", 0, []
        return ("done" if len(self.tokens[row]) >= self.config.max_new_tokens else "run"), 0, []

    def _reply(self, row: int, stop: Stop) -> list[int]:
        """Ask the environment; append what fits in the budget. [] when there is no env or it ends the row."""
        if self.env is None:
            return []
        reply = self.env(row, list(self.tokens[row]), stop)
        if not reply:
            return []
        reply = [int(t) for t in reply]
        if self.vocab_size is not None and any(not 0 <= t < self.vocab_size for t in reply):
            raise ValueError(f"env reply for row {row} has token ids out of range [0, {self.vocab_size}): {reply}")
        fits = reply[: self.config.max_new_tokens - len(self.tokens[row])]
        self._extend(row, fits, [0.0] * len(fits), [0.0] * len(fits), ["env"] * len(fits))
        return fits

    def _extend(self, row: int, tokens, logprobs, entropy, origins) -> None:
        self.tokens[row] += tokens
        self.logprobs[row] += logprobs
        self.entropy[row] += entropy
        self.origin[row] += origins

    def build(self, stats: dict[str, Any]) -> Rollout:
        return Rollout(self.tokens, self.logprobs, self.entropy, self.origin, self.finish, self.stops, stats)


def decode_stats(out: RolloutBuilder, verdicts: dict, timing: dict, wall: float,
                 choices: list[tuple[Choice, float, int]], config: GenerationConfig) -> dict:
    """A generate() call's stats: counts, wall time, the decode loop's counters and, where it drafted, the
    verification counters (`SpecCounters`) of its verdicts {γ: [[num_accepted, H(p_1..p_γ)] per verified row]};
    under gamma="auto" also the depth controller's decisions, from each step's (Choice, seconds, accepted drafts)."""
    steps, row_steps = len(choices), sum(choice.rows for choice, *_ in choices)
    generated = sum(o != "env" for row in out.origin for o in row)  # the policy's tokens, not env replies
    stats = {
        "num_prompts": len(out.tokens),
        "num_generated_tokens": generated,
        "num_steps": steps,
        "wall_time_s": wall,
        "tokens_per_s": generated / wall if wall > 0 else 0.0,
        # Counters of the decode loop (sums, so they pool over rollouts and steps): what the Speed page's
        # bound divides by, per verify step, instead of assumed costs.
        "engine/num_steps": steps,
        **{f"engine/{k}_s": v for k, v in timing.items()},
        # Rows decoded per step, summed: tokens per row-step = 1 + accepted / this, whatever depths ran.
        "engine/num_row_steps": row_steps,
    }
    if config.depth > 0:
        counts = [spec_counts(verdicts.get(g, []), g, config.method) for g in sorted({config.depth, *verdicts})]
        counts = pool_depths(counts) if config.auto else counts[0]
        stats.update(counts)
        stats.update(derive(counts))
    if config.auto:
        stats.update(depth_counters(choices, config.max_gamma))
    return stats


def spec_counts(verdicts: list[list[float]], gamma: int, method: str) -> dict:
    """`SpecCounters` of verify steps at depth γ from their rows' [num_accepted, H(p_1..p_γ)]."""
    counters = SpecCounters(gamma=gamma, method=method)
    if verdicts:
        table = torch.tensor(verdicts, dtype=torch.float64)  # [N, 1+γ]
        counters.update(table[:, 0].long(), table[:, 1:], validate=False)
    return counters.to_dict()


def pool_depths(counts: Sequence[Mapping]) -> dict[str, float | int | str]:
    """Counters of verify steps at several depths (one `SpecCounters.to_dict()` per γ, one method) as one counter
    dict at the deepest γ: sums, a position a depth never drafted counting 0, plus the drafts that reached each
    position, `spec/num_reached_tokens_per_pos/{i}` (which `derive` then divides by: with mixed depths a draft that
    accepted i-1 reached i only if its step drafted that deep)."""
    if not counts:
        raise ValueError("counts is empty: pass at least one SpecCounters.to_dict()")
    methods = {str(c["spec/method"]) for c in counts}
    if len(methods) > 1:
        raise ValueError(f"cannot pool counters of different methods: {sorted(methods)}")
    depth = max(int(c["spec/gamma"]) for c in counts)
    out: dict[str, float | int | str] = {"spec/gamma": depth, "spec/method": methods.pop()}
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        out[f"spec/{key}"] = sum(c[f"spec/{key}"] for c in counts)
    for i in range(depth):
        out[f"spec/num_accepted_tokens_per_pos/{i}"] = sum(c.get(f"spec/num_accepted_tokens_per_pos/{i}", 0)
                                                          for c in counts)
        out[f"spec/num_reached_tokens_per_pos/{i}"] = sum(
            (c["spec/num_drafts"] if i == 0 else c[f"spec/num_accepted_tokens_per_pos/{i - 1}"])
            for c in counts if i < int(c["spec/gamma"]))
    for c in counts:
        for key, value in c.items():
            if key.startswith("spec/by_entropy/"):
                out[key] = out.get(key, 0) + value
    return out
