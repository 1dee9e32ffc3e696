"""The policy's shape: `ModelConfig`, its presets, and its translation to and from a Hugging Face
config.json."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelConfig:
    """Qwen3 hyper-parameters, with the field names of `transformers.Qwen3Config`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 32768

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"ModelConfig.num_attention_heads={self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention)")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        for name in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"ModelConfig.{name} must be a positive number, got {value!r}")
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"ModelConfig.tie_word_embeddings must be a bool, got {self.tie_word_embeddings!r}")

    @classmethod
    def tiny(cls, vocab_size: int = 128, **overrides: Any) -> "ModelConfig":
        """The embedded default's shape: about 3.5M parameters at vocab 128."""
        base = dict(vocab_size=vocab_size, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=10_000.0,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=2048)
        return cls(**{**base, **overrides})

    @classmethod
    def deep(cls, vocab_size: int = 128, **overrides: Any) -> "ModelConfig":
        """About the tiny model's parameters (3.2M at vocab 128) in 16 narrow layers. A one-layer MTP head then
        costs about a tenth of a target step, as on real checkpoints (one MTP layer over 28-64), where on the
        4-layer tiny shape it costs a third: that ratio caps the speculative speedup as much as acceptance."""
        base = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=16, head_dim=32)
        return cls.tiny(vocab_size=vocab_size, **{**base, **overrides})

    @classmethod
    def small(cls, vocab_size: int = 151936, num_hidden_layers: int = 3, **overrides: Any) -> "ModelConfig":
        """Qwen3-0.6B's shape (real vocabulary, tied head) with fewer layers: ~203M parameters, of which
        156M are the embedding. For benchmarks with random weights."""
        base = dict(vocab_size=vocab_size, hidden_size=1024, intermediate_size=3072,
                    num_hidden_layers=num_hidden_layers, num_attention_heads=16, num_key_value_heads=8,
                    head_dim=128, rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                    max_position_embeddings=40960)
        return cls(**{**base, **overrides})

    def to_hf_dict(self) -> dict[str, Any]:
        """A `config.json` body that `transformers.Qwen3Config` reads as this architecture."""
        fields = dataclasses.asdict(self)
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            **fields,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "rope_scaling": None,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": self.num_hidden_layers,
            "initializer_range": 0.02,
            "use_cache": True,
        }

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Read a Qwen3 `config.json` dict; unknown keys are ignored, unsupported variants raise."""
        if d.get("model_type", "qwen3") != "qwen3":
            raise ValueError(f"config model_type={d['model_type']!r} is not supported: bebop reads 'qwen3' only")
        missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads") if k not in d]
        if missing:
            raise ValueError(f"config is missing required Qwen3 fields: {missing}")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config hidden_act={d['hidden_act']!r} is not supported (Qwen3 uses 'silu')")
        if d.get("attention_bias", False):
            raise ValueError("config attention_bias=true is not supported (Qwen3 has no attention bias)")
        if d.get("use_sliding_window", False):
            raise ValueError("config use_sliding_window=true is not supported")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise ValueError(f"config rope type {rope_type!r} is not supported (default RoPE only)")
        heads = d["num_attention_heads"]
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10_000.0))),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=d.get("max_position_embeddings", 32768),
        )
