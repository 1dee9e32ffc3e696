"""The entropy bonus's coefficient during a GRPO run: a constant, or TRL's adaptive rule toward a target entropy.

    static     entropy_coef = c every step (0, the default: no bonus, the loss of a run without one bit for bit)
    adaptive   entropy_target = H*: TRL's `use_adaptive_entropy` (huggingface/trl#6140, after Skywork-OR1). The
               coefficient c_t is state. After the update of step t measured the policy's mean token entropy H_t:

                   c_{t+1} = min(c_t + δ, c_max)   if H_t ≤ H*
                   c_{t+1} = max(c_t - δ, c_min)   otherwise

               and step t+1 applies c_{t+1} only while H_t ≤ H* (0 above the target: the bonus never pushes an
               entropy that is already high). The first step applies nothing, as nothing has been measured yet.

TRL's defaults are kept: c_min = 0, c_max = 1, δ = 0.005 per step, and c_0 = entropy_coef. The rule is a floor,
not a two-sided controller: it raises the entropy toward H* from below and lets go above it (a negative
coefficient would be an entropy penalty, which only a static entropy_coef < 0 asks for).

H_t is the token-mean entropy of the policy being updated over the step's policy tokens (the `grpo_loss` stat
`entropy_current`, summed over micro-batches and ranks), so every rank applies the same coefficient; a resumed run
reads c and H_t back from the checkpoint (`state_dict`) and applies what the uninterrupted run would have.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# TRL's defaults for its adaptive entropy control (GRPOConfig.entropy_coef_min / _max / _delta)
COEF_MIN, COEF_MAX, COEF_DELTA = 0.0, 1.0, 0.005


def adapt_coefficient(coef: float, entropy: float, target: float, *, low: float = COEF_MIN, high: float = COEF_MAX,
                      delta: float = COEF_DELTA) -> float:
    """The next coefficient: up by `delta` (to at most `high`) when `entropy` ≤ `target`, else down (to at least
    `low`)."""
    if entropy <= target:
        return min(coef + delta, high)
    return max(coef - delta, low)


@dataclass
class EntropyControl:
    """The coefficient a step applies (`coefficient`), and what the step's measured entropy does to the next
    (`observe`). `target` None: the static coefficient `coef`."""

    coef: float = 0.0
    target: float | None = None
    low: float = COEF_MIN
    high: float = COEF_MAX
    delta: float = COEF_DELTA
    last_entropy: float = math.inf  # H_{t-1}; inf before any step, so the first step applies no adaptive bonus

    @classmethod
    def from_config(cls, config) -> EntropyControl:
        """From an `RLConfig`'s entropy_* fields."""
        return cls(config.entropy_coef, config.entropy_target, config.entropy_coef_min, config.entropy_coef_max,
                   config.entropy_coef_delta)

    @property
    def active(self) -> bool:
        """Whether the loss carries the entropy term at all (a static 0 leaves the run as it was without one)."""
        return self.coef != 0 or self.target is not None

    @property
    def adaptive(self) -> bool:
        return self.target is not None

    @property
    def coefficient(self) -> float:
        """The coefficient this step's loss applies."""
        if self.adaptive and not self.last_entropy <= self.target:
            return 0.0
        return self.coef

    def observe(self, entropy: float) -> None:
        """The step's measured mean entropy H_t: the adaptive rule steps the coefficient for the next step."""
        if self.adaptive:
            self.coef = adapt_coefficient(self.coef, entropy, self.target, low=self.low, high=self.high,
                                          delta=self.delta)
            self.last_entropy = float(entropy)

    def state_dict(self) -> dict[str, float]:
        return {"coef": float(self.coef), "last_entropy": float(self.last_entropy)}

    def load_state_dict(self, state: dict[str, float] | None) -> None:
        """A checkpoint's state (None: a checkpoint written before the knob existed, which ran without it)."""
        if state is not None:
            self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])
