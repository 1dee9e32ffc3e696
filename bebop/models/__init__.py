"""The models: the policy (a Qwen3, Qwen2 or Llama-3 decoder), its MTP draft head, their KV cache and checkpoints."""

from bebop.models.checkpoint import load_head, load_pretrained, resolve_checkpoint_dir, save_head, save_pretrained
from bebop.models.config import FAMILIES, Llama3RopeScaling, ModelConfig
from bebop.models.hf_mtp import save_for_transformers
from bebop.models.kvcache import KVCache
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer

__all__ = ["FAMILIES", "KVCache", "Llama3RopeScaling", "MTPHead", "ModelConfig", "Transformer", "load_head",
           "load_pretrained", "resolve_checkpoint_dir", "save_for_transformers", "save_head", "save_pretrained"]
