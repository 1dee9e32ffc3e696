"""What the engine is asked for (`GenerationConfig`) and what it gives back (`Rollout`).

A `Rollout` carries everything RL needs from generation (tokens, the behaviour policy's log-probs) and
everything the paper's analysis needs (target entropy per token, where each token came from, and the
speculative counters of `bebop.metrics`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from bebop.verify import METHODS

# Where each token of a completion came from. "plain": sampled straight from the target (plain decoding, and the
# first token after a prompt or an environment reply); "accepted" / "recovered" / "bonus": the outcomes of a
# verification step; "env": an environment's reply in a multi-turn rollout (not the policy's: masked from RL).
ORIGINS = ("plain", "accepted", "recovered", "bonus", "env")

# env(row, tokens_so_far) -> reply token ids to append and continue from, or None to end the row.
Env = Callable[[int, list[int]], "list[int] | None"]


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    gamma: int = 3  # draft depth; 0 = plain decoding
    method: str = "rs"  # "rs" (draft ~ q, rejection sampling) | "to" (draft = argmax q) | "greedy"
    stop_tokens: tuple[int, ...] = ()
    seed: int | None = None  # None: drawn from torch's global generator, so torch.manual_seed still makes it repeat
    profile: bool = False  # synchronise the device around each phase so per-phase timings are exact (CUDA)

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] or None, got {self.top_p}")
        if self.gamma < 0:
            raise ValueError(f"gamma must be >= 0 (0 = plain decoding), got {self.gamma}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Rollout:
    tokens: list[list[int]]  # generated tokens per prompt (the stop token included when one ended the row)
    logprobs: list[list[float]]  # log p(token) under the processed target distribution: RL's old log-probs
    entropy: list[list[float]]  # H(p) in nats at each generated position
    origin: list[list[str]]  # one of ORIGINS per token
    finish_reason: list[str]  # "stop" | "length"
    stats: dict[str, Any] = field(default_factory=dict)  # counters, derived rates, timings, tokens/s

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)

    @property
    def policy_mask(self) -> list[list[bool]]:
        """True where the policy generated the token (what the RL loss may use), False for environment replies."""
        return [[o != "env" for o in row] for row in self.origin]


class RolloutBuilder:
    """Host-side per-prompt results, appended once per engine step; applies stop tokens, budgets and `env`."""

    def __init__(self, n: int, config: GenerationConfig, env: Env | None = None, vocab_size: int | None = None):
        self.config, self.env, self.vocab_size = config, env, vocab_size
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.logprobs: list[list[float]] = [[] for _ in range(n)]
        self.entropy: list[list[float]] = [[] for _ in range(n)]
        self.origin: list[list[str]] = [[] for _ in range(n)]
        self.finish: list[str] = ["length"] * n

    def append(self, row: int, tokens: list[int], logprobs: list[float], entropy: list[float],
               origins: list[str]) -> tuple[str, int, list[int]]:
        """Append one step's emitted tokens to prompt `row`.

        Returns (state, j, reply): "run" (keep going), "done" (finished), or "park": token j of `tokens` was a
        stop token and `env` replied with `reply` (already appended), so the engine must feed it and continue.
        """
        stops, budget = self.config.stop_tokens, self.config.max_new_tokens - len(self.tokens[row])
        take, stop_at = min(len(tokens), budget), None
        for j in range(take):
            if tokens[j] in stops:
                take, stop_at = j + 1, j
                break
        self._extend(row, tokens[:take], logprobs[:take], entropy[:take], origins[:take])
        if stop_at is not None:
            reply = self._reply(row)
            if reply:
                return ("park", stop_at, reply) if len(self.tokens[row]) < self.config.max_new_tokens else ("done", 0, [])
            self.finish[row] = "stop"
            return "done", 0, []
        return ("done" if len(self.tokens[row]) >= self.config.max_new_tokens else "run"), 0, []

    def _reply(self, row: int) -> list[int]:
        """Ask the environment; append what fits in the budget. [] when there is no env or it ends the row."""
        if self.env is None:
            return []
        reply = self.env(row, list(self.tokens[row]))
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
        return Rollout(self.tokens, self.logprobs, self.entropy, self.origin, self.finish, stats)
