"""bebop: faster RL post-training with MTP speculative decoding and rejection sampling.

The top-level names are imported lazily, so `import bebop` stays cheap:

    import bebop
    default = bebop.load_default()                       # the shipped tiny policy + its MTP heads
    engine = bebop.Engine(default.model, default.heads["e2e_tv"])
    rollout = engine.generate(prompts, bebop.GenerationConfig(max_new_tokens=64, gamma=3, method="rs"))
    runs = bebop.reference_runs()                        # the real RL runs shipped with bebop: {name: run directory}
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "load_default": "bebop.default",
    "Engine": "bebop.engine",
    "GenerationConfig": "bebop.engine",
    "Rollout": "bebop.engine",
    "draft_loss": "bebop.losses",
    "ModelConfig": "bebop.models",
    "Transformer": "bebop.models",
    "load_pretrained": "bebop.models",
    "save_pretrained": "bebop.models",
    "MTPHead": "bebop.models",
    "reference_runs": "bebop.runlog.reference",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bebop' has no attribute {name!r}")
