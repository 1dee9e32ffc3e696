"""Generation: plain and speculative decoding over a ragged batch (`Engine.generate(prompts, config) -> Rollout`).

`generate` holds the engine's loop, `step` the device work of one step, `rollout` what a generation returns.
"""

from bebop.engine.generate import Engine
from bebop.engine.rollout import Env, GenerationConfig, Rollout

__all__ = ["Engine", "Env", "GenerationConfig", "Rollout"]
