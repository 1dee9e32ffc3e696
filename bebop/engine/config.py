"""What the engine is asked for: `GenerationConfig`, checked without torch so that a job's config (`RLConfig.generation`)
is validated by building one before anything heavy loads.

The draft depth γ: an int (0 = plain decoding), "auto", where the engine chooses each step's depth in 0..max_gamma
(`bebop.engine.depth`), or "rows", where it chooses each row's own depth in 0..max_gamma per step under a
verify-token budget (`bebop.engine.depth.rows`); `deepest` is the one rule for how deep a draft may go under each.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bebop.checks import METHODS, check_choice, check_ints, check_number

ADAPTIVE = ("auto", "rows")  # the gamma values under which the engine chooses depths as it runs


def deepest(gamma: int | str, max_gamma: int) -> int:
    """The deepest draft a step may take: `gamma`, or `max_gamma` under "auto" or "rows" (what caches are sized for,
    and the depth RL scores and trains heads at)."""
    return max_gamma if gamma in ADAPTIVE else gamma


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    # draft depth; 0 = plain decoding; "auto": one chosen per step for all rows (bebop.engine.depth); "rows": each
    # row its own per step, under a verify-token budget (bebop.engine.depth.rows)
    gamma: int | str = 3
    method: str = "rs"  # "rs" (draft ~ q, rejection sampling) | "to" (draft = argmax q) | "greedy"
    stop_tokens: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()  # matched on decoded text (module docstring); needs generate(decode=...)
    vocab_limit: int | None = None  # ids >= vocab_limit are never sampled (the tokenizer's size; bebop.sampling)
    seed: int | None = None  # None: drawn from torch's global generator, so torch.manual_seed still makes it repeat
    profile: bool = False  # synchronise the device around each phase so per-phase timings are exact (CUDA)
    max_gamma: int = 5  # with gamma="auto" or "rows": the deepest draft a step (a row) may take

    def __post_init__(self) -> None:
        check_ints(self, ("max_new_tokens", "max_gamma"), low=1)
        check_ints(self, ("top_k", "vocab_limit"), low=1, also=(None,))
        check_ints(self, ("gamma",), low=0, also=ADAPTIVE)  # 0 = plain decoding
        check_number(self, "temperature", low=0)
        if self.top_p is not None:
            check_number(self, "top_p", low=0, high=1, open_low=True)
        check_choice(self, "method", METHODS)
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            raise ValueError(f"stop_strings must be non-empty strings, got {self.stop_strings!r}")
        object.__setattr__(self, "stop_tokens", tuple(int(t) for t in self.stop_tokens))
        object.__setattr__(self, "stop_strings", tuple(self.stop_strings))

    @property
    def auto(self) -> bool:
        """True when the engine chooses each step's depth (gamma="auto", or "rows": each row's)."""
        return self.gamma in ADAPTIVE

    @property
    def per_row(self) -> bool:
        """True when each row gets its own depth per step (gamma="rows")."""
        return self.gamma == "rows"

    @property
    def depth(self) -> int:
        """The deepest draft a step may take: gamma, or max_gamma under "auto" (what caches are sized for)."""
        return deepest(self.gamma, self.max_gamma)

    @property
    def sampling(self) -> tuple[float, int | None, float | None, int | None]:
        """(temperature, top_k, top_p, vocab_limit): the arguments of `bebop.sampling.scaled_logits`."""
        return self.temperature, self.top_k, self.top_p, self.vocab_limit

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
