"""What the engine is asked for (`GenerationConfig`) and what it gives back (`Rollout`).

A `Rollout` carries everything RL needs from generation (tokens, the behaviour policy's log-probs) and
everything the paper's analysis needs (target entropy per token, where each token came from, and the
speculative counters of `bebop.metrics`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

METHODS = ("rs", "to", "greedy")

# Where each generated token came from. "plain": sampled straight from the target (plain decoding, and the
# first token after the prompt); the other three are the outcomes of a verification step.
ORIGINS = ("plain", "accepted", "recovered", "bonus")


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    gamma: int = 3  # draft depth; 0 = plain decoding
    method: str = "rs"  # "rs" (draft ~ q, rejection sampling) | "to" (draft = argmax q) | "greedy"
    stop_tokens: tuple[int, ...] = ()
    seed: int | None = None
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

    @classmethod
    def tiny(cls) -> "GenerationConfig":
        return cls(max_new_tokens=16, gamma=2, seed=0)

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
