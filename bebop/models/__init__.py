"""The models: the policy (a Qwen3-family decoder), its MTP draft head, their KV cache and checkpoints."""

from bebop.models.checkpoint import load_head, load_pretrained, save_head, save_pretrained
from bebop.models.config import ModelConfig
from bebop.models.hf_mtp import save_for_transformers
from bebop.models.kvcache import KVCache
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer

__all__ = ["KVCache", "MTPHead", "ModelConfig", "Transformer", "load_head", "load_pretrained", "save_for_transformers",
           "save_head", "save_pretrained"]
