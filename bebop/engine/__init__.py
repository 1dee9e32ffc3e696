"""Generation: plain and speculative decoding over a ragged batch (`Engine.generate(prompts, config) -> Rollout`).

`generate` holds the engine's loop, `step` the device work of one step, `config` what a generation is asked for
(`GenerationConfig`, no torch), `rollout` what it returns. The names below are imported on first use, so a job's
config can be checked against `GenerationConfig` before torch loads.
"""

from __future__ import annotations

import importlib

_EXPORTS = {"Engine": "bebop.engine.generate", "Env": "bebop.engine.rollout",
            "GenerationConfig": "bebop.engine.config", "Rollout": "bebop.engine.rollout"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bebop.engine' has no attribute {name!r}")
