"""The policy's shape: `ModelConfig`, its presets, and its translation to and from a Hugging Face
config.json, for the three supported families (Qwen3, Qwen2/Qwen2.5, Llama-3.x)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """What a family changes in the decoder layer, and the transformers class that reads its config.json."""

    architecture: str
    attention_bias: bool  # q/k/v projections carry a bias (o_proj never does in these families)
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE


FAMILIES = {
    "qwen3": Family("Qwen3ForCausalLM", attention_bias=False, qk_norm=True),
    "qwen2": Family("Qwen2ForCausalLM", attention_bias=True, qk_norm=False),
    "llama": Family("LlamaForCausalLM", attention_bias=False, qk_norm=False),
}
ROPE_TYPES = ("default", "llama3")


def _positive(owner: str, name: str, value: Any, kind: type | tuple[type, ...]) -> None:
    if not isinstance(value, kind) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"{owner}.{name} must be a positive {'int' if kind is int else 'number'}, got {value!r}")


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama 3.1's RoPE frequency scaling (`rope_type: "llama3"`): wavelengths longer than
    original_max_position_embeddings / low_freq_factor are stretched by `factor`, shorter than
    original_max_position_embeddings / high_freq_factor kept, and those between interpolated smoothly."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int

    def __post_init__(self):
        for name in ("factor", "low_freq_factor", "high_freq_factor"):
            _positive("Llama3RopeScaling", name, getattr(self, name), (int, float))
        _positive("Llama3RopeScaling", "original_max_position_embeddings", self.original_max_position_embeddings, int)
        if not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(f"Llama3RopeScaling.high_freq_factor={self.high_freq_factor} must exceed "
                             f"low_freq_factor={self.low_freq_factor}")

    def to_hf_dict(self) -> dict[str, Any]:
        return {"rope_type": "llama3", **dataclasses.asdict(self)}


@dataclass(frozen=True)
class ModelConfig:
    """Decoder hyper-parameters, with the field names of `transformers.Qwen3Config` / `Qwen2Config` / `LlamaConfig`.

    `model_type` picks the family (`FAMILIES`); the family fixes `attention_bias` and `qk_norm`."""

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
    model_type: str = "qwen3"
    rope_scaling: Llama3RopeScaling | None = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            _positive("ModelConfig", name, getattr(self, name), int)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"ModelConfig.num_attention_heads={self.num_attention_heads} must be a multiple of "
                             f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention)")
        if self.head_dim % 2:
            raise ValueError(f"ModelConfig.head_dim must be even for rotary embeddings, got {self.head_dim}")
        for name in ("rope_theta", "rms_norm_eps"):
            _positive("ModelConfig", name, getattr(self, name), (int, float))
        if not isinstance(self.tie_word_embeddings, bool):
            raise ValueError(f"ModelConfig.tie_word_embeddings must be a bool, got {self.tie_word_embeddings!r}")
        if self.model_type not in FAMILIES:
            raise ValueError(f"ModelConfig.model_type={self.model_type!r} is not supported: bebop reads "
                             f"{sorted(FAMILIES)}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Llama3RopeScaling):
            raise ValueError(f"ModelConfig.rope_scaling must be a Llama3RopeScaling or None, got {self.rope_scaling!r}")

    @property
    def attention_bias(self) -> bool:
        return FAMILIES[self.model_type].attention_bias

    @property
    def qk_norm(self) -> bool:
        return FAMILIES[self.model_type].qk_norm

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
        """A `config.json` body that transformers' class for this family (`FAMILIES`) reads as this architecture."""
        fields = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("model_type", "rope_scaling")}
        rope = self.rope_scaling.to_hf_dict() if self.rope_scaling else {"rope_type": "default"}
        d = {
            "architectures": [FAMILIES[self.model_type].architecture],
            "model_type": self.model_type,
            **fields,
            "rope_parameters": {**rope, "rope_theta": self.rope_theta},
            "rope_scaling": self.rope_scaling.to_hf_dict() if self.rope_scaling else None,
            "hidden_act": "silu",
            "attention_dropout": 0.0,
            "initializer_range": 0.02,
            "use_cache": True,
        }
        if self.model_type == "llama":
            return {**d, "attention_bias": False, "mlp_bias": False}
        window = {"use_sliding_window": False, "sliding_window": None, "max_window_layers": self.num_hidden_layers}
        return {**d, **window, **({"attention_bias": False} if self.model_type == "qwen3" else {})}

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Read a Qwen3, Qwen2 or Llama `config.json` dict; unknown keys are ignored, unsupported variants raise."""
        model_type = d.get("model_type", "qwen3")
        if model_type not in FAMILIES:
            raise ValueError(f"config model_type={model_type!r} is not supported: bebop reads {sorted(FAMILIES)}")
        _check_variant(model_type, d)
        heads = d["num_attention_heads"]
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        return cls(
            vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
            num_hidden_layers=d["num_hidden_layers"], num_attention_heads=heads,
            num_key_value_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10_000.0))),
            rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            max_position_embeddings=d.get("max_position_embeddings", 32768),
            model_type=model_type,
            rope_scaling=_rope_scaling(rope, d),
        )


def _check_variant(model_type: str, d: dict[str, Any]) -> None:
    """Raise on what the family's config may ask for but bebop's decoder does not implement."""
    missing = [k for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                           "num_attention_heads") if k not in d]
    if missing:
        raise ValueError(f"config ({model_type}) is missing required fields: {missing}")
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"config hidden_act={d['hidden_act']!r} is not supported (only 'silu')")
    if model_type in ("qwen3", "llama") and d.get("attention_bias", False):
        raise ValueError(f"config attention_bias=true is not supported for model_type={model_type!r}")
    if model_type == "llama" and d.get("mlp_bias", False):
        raise ValueError("config mlp_bias=true is not supported for model_type='llama'")
    if d.get("use_sliding_window", False) or "sliding_attention" in (d.get("layer_types") or ()):
        raise ValueError(f"config use_sliding_window=true is not supported ({model_type}: full attention only)")


def _rope_scaling(rope: dict[str, Any], d: dict[str, Any]) -> Llama3RopeScaling | None:
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"config rope type {rope_type!r} is not supported (bebop reads {list(ROPE_TYPES)})")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"config partial_rotary_factor={rope['partial_rotary_factor']} is not supported")
    if rope_type == "default":
        return None
    keys = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in keys if k not in rope]
    if missing:
        raise ValueError(f"config rope type 'llama3' is missing {missing}")
    return Llama3RopeScaling(**{k: rope[k] for k in keys})
