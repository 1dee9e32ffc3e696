"""The decoder of the Qwen3, Qwen2 and Llama-3 families: the policy (target) that bebop samples, trains and
speculates against.

Architecture (identical to `transformers`' Qwen3 / Qwen2 / Llama in fp32, same checkpoint names, so checkpoints
move both ways):

    x = embed_tokens(tokens)
    for each layer:  x = x + o_proj(attn(rope(q_norm(q_proj(n))), rope(k_norm(k_proj(n))), v_proj(n)))
                         with n = input_layernorm(x);  grouped-query attention, Hkv | H
                         (Qwen3 has the q/k norms; Qwen2 has none but biases on q/k/v_proj; Llama has neither)
                     x = x + down_proj(silu(gate_proj(m)) * up_proj(m)),  m = post_attention_layernorm(x)
    hidden = norm(x);  logits = lm_head(hidden)      (lm_head tied to embed_tokens when configured)

q/k/v and gate/up each run as one matmul (`qkv_proj`, `gate_up_proj`, as vLLM and gpt-fast fuse them); checkpoints
still read and write the separate q_proj / k_proj / v_proj, gate_proj / up_proj names (see
`fuse_checkpoint_names`).

`forward` returns (logits, hidden) where `hidden` is the final hidden state AFTER the final norm, i.e. what
the LM head reads. That is the h_0 the MTP head takes (vLLM's deepseek_mtp / qwen3_next_mtp feed the
backbone's normed output to the MTP block), and it lets a caller gather the rows it needs first and
project only those with `lm_logits(hidden)`.

Two attention paths share the same layers (bebop/models/attention.py): a plain causal forward without a cache
(training), and a cached one in which every row has its own length.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from bebop.models.attention import (
    Attend,
    additive_bias,
    apply_rope,
    cached_attend,
    cached_attention_setup,
    causal_attend,
    prefix_attend,
    rope_tables,
)
from bebop.models.config import ModelConfig
from bebop.models.kvcache import KVCache
from bebop.models.prepack import Linear

# --------------------------------------------------------------------------------------------------
# Pieces


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / rms(x) over the last dim, times `weight` (broadcast), normalised in fp32 and scaled in x's dtype as
    Qwen3 does; one fused op where that is exact, since per-op dispatch dominates a batch-1 decode step."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.dim() == 1:
        return F.rms_norm(x, weight.shape, weight, eps)
    return weight * F.rms_norm(x.float(), x.shape[-1:], eps=eps).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def _save_fused(fused: str, parts: dict[str, int], module, state, prefix, local_metadata) -> None:
    for kind in ("weight", "bias"):
        if f"{prefix}{fused}.{kind}" in state:
            tensor = state.pop(f"{prefix}{fused}.{kind}")
            for name, block in zip(parts, tensor.split(list(parts.values()))):
                state[f"{prefix}{name}.{kind}"] = block


def _load_fused(fused: str, parts: dict[str, int], module, state, prefix, *args) -> None:
    for kind in ("weight", "bias"):
        names = [f"{prefix}{name}.{kind}" for name in parts]
        if all(name in state for name in names):
            state[f"{prefix}{fused}.{kind}"] = torch.cat([state.pop(name) for name in names])


def fuse_checkpoint_names(module: nn.Module, fused: str, parts: dict[str, int]) -> None:
    """Let `module.<fused>` (a Linear whose output rows are the `parts`, in order, with these row counts) read and
    write checkpoints as separate `module.<part>.weight` (and `.bias`, when it has one) tensors: `state_dict` gives
    row views under the part names (so copying into them writes the fused weight), `load_state_dict` concatenates
    them. The hooks are module-level partials, so the module still pickles."""
    module.register_state_dict_post_hook(partial(_save_fused, fused, parts))
    module.register_load_state_dict_pre_hook(partial(_load_fused, fused, parts))


class Attention(nn.Module):
    """Grouped-query self-attention, with per-head q/k RMSNorm (Qwen3) or q/k/v biases (Qwen2) as the family
    says; the attention pattern comes from `attend`.

    q, k and v come from one matmul (`qkv_proj`, as vLLM and gpt-fast fuse them): a decode step is a chain of
    small GEMMs whose fixed cost dominates on CPU, and the weights still load and save as q_proj/k_proj/v_proj."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        d, D = config.hidden_size, config.head_dim
        self.head_dim = D
        self.split = [config.num_attention_heads, config.num_key_value_heads, config.num_key_value_heads]
        self.qkv_proj = Linear(d, sum(self.split) * D, bias=config.attention_bias)
        self.o_proj = Linear(config.num_attention_heads * D, d, bias=False)
        self.qk_norm = config.qk_norm
        if config.qk_norm:
            self.q_norm = RMSNorm(D, config.rms_norm_eps)
            self.k_norm = RMSNorm(D, config.rms_norm_eps)
        parts = {name: n * D for name, n in zip(("q_proj", "k_proj", "v_proj"), self.split)}  # checkpoint rows
        fuse_checkpoint_names(self, "qkv_proj", parts)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        B, S, _ = x.shape
        out = attend(*self.project(x, cos, sin))  # [B, H, S, D]
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))

    def project(self, x: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, H, S, D], k and v [B, Hkv, S, D] of x [B, S, d]: normed (Qwen3) and rotated."""
        B, S, _ = x.shape
        H, Hkv, _ = self.split
        qkv = self.qkv_proj(x).view(B, S, -1, self.head_dim)  # [B, S, H + 2*Hkv, D]
        # q and k heads are normed and rotated as one tensor: the same math in half the ops.
        qk = qkv[:, :, : H + Hkv]  # [B, S, H+Hkv, D]
        if self.qk_norm:
            qk_weight = torch.cat([self.q_norm.weight.expand(H, -1), self.k_norm.weight.expand(Hkv, -1)])  # [H+Hkv, D]
            qk = rms_norm(qk, qk_weight, self.q_norm.eps)
        q, k = apply_rope(qk.transpose(1, 2), cos, sin).split([H, Hkv], 1)  # [B, H, S, D], [B, Hkv, S, D]
        return q, k, qkv[:, :, H + Hkv :].transpose(1, 2)


class MLP(nn.Module):
    """SwiGLU with gate and up projections in one matmul (`gate_up_proj`), saved as gate_proj / up_proj."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        n = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * n, bias=False)
        self.down_proj = Linear(n, config.hidden_size, bias=False)
        fuse_checkpoint_names(self, "gate_up_proj", {"gate_proj": n, "up_proj": n})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, -1)  # [..., n] each
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    """Pre-norm attention + SwiGLU block (Qwen3DecoderLayer); also the MTP head's single layer."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, attend)
        return x + self.mlp(self.post_attention_layernorm(x))


# --------------------------------------------------------------------------------------------------
# The model


class Backbone(nn.Module):
    """Holds the `model.*` parameters (embed_tokens, layers, norm) under the names all three families share."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


Qwen3Backbone = Backbone  # its earlier name, from when Qwen3 was the only family


def init_weights(module: nn.Module, std: float = 0.02) -> None:
    """transformers' initialisation: N(0, 0.02) for linear and embedding weights, zero biases, ones for norms."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=std)
        if getattr(module, "bias", None) is not None:
            nn.init.zeros_(module.bias)
    elif isinstance(module, RMSNorm):
        nn.init.ones_(module.weight)


def check_taps(taps: tuple[int, ...], num_layers: int) -> None:
    """Taps are decoder layer indices in increasing order, each below the last layer (whose output the final-normed
    hidden already carries): one ValueError naming what is wrong."""
    if not isinstance(taps, tuple) or any(isinstance(t, bool) or not isinstance(t, int) for t in taps) \
            or list(taps) != sorted(set(taps)) or any(not 0 <= t < num_layers - 1 for t in taps):
        raise ValueError(f"taps must be increasing decoder layer indices in [0, {num_layers - 2}] (the last layer is "
                         f"the final hidden's), got {taps!r}")


class Transformer(nn.Module):
    """The policy model: `forward(tokens, cache=None, *, kv_len=None, compute_logits=True) -> (logits, hidden)`."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        if not isinstance(config, ModelConfig):
            raise ValueError(f"config must be a ModelConfig, got {type(config).__name__}")
        self.config = config
        # Where it came from, for the runs it makes (bebop.policy.run_meta); None for a model built in memory: the name
        # or path it was loaded by (Hugging Face's `name_or_path`) and the sha256 of the weights it was read from
        # (`bebop.models.checkpoint.weights_hash`), both set by `load_pretrained`.
        self.name_or_path: str | None = None
        self.weights_hash: str | None = None
        self.model = Backbone(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        self.apply(init_weights)
        self.tie_weights()
        cos, sin = rope_tables(config)
        # Not persistent: derived from the config, and absent from HF checkpoints. They follow .to(dtype),
        # which rounds them exactly as HF rounds its fp32 cos/sin to the activation dtype.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin_signed", sin, persistent=False)

    def tie_weights(self) -> None:
        """Make the LM head the embedding matrix, when the config ties them (also after assigning a new embedding)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_rope(self, dtype: torch.dtype, device: torch.device | str | None = None) -> None:
        """(Re)compute the RoPE tables on `device` in `dtype`: for a model built on the meta device, whose weights
        come from a checkpoint that does not hold these derived tables."""
        cos, sin = rope_tables(self.config, device)
        self.rope_cos, self.rope_sin_signed = cos.to(dtype), sin.to(dtype)

    def forward(self, tokens: torch.Tensor, cache: KVCache | None = None, *, kv_len: int | None = None,
                compute_logits: bool = True, taps: tuple[int, ...] = ()) -> tuple[torch.Tensor | None, torch.Tensor]:
        """tokens [B, S] long -> (logits [B, S, V] or None, hidden [B, S, d] after the final norm).

        With `cache`, row b's tokens sit at positions cache.lengths[b] + s; see the module docstring. With `taps`
        (decoder layer indices), hidden is the features a fused draft head reads, [B, S, (1 + len(taps)) d]: the
        final-normed hidden first, then the residual stream after each tapped layer (`_layers`)."""
        if tokens.dim() != 2 or tokens.dtype != torch.long:
            raise ValueError(f"tokens must be a [B, S] long tensor, got {tuple(tokens.shape)} {tokens.dtype}")
        B, S = tokens.shape
        if cache is None:
            if S > self.config.max_position_embeddings:
                raise ValueError(f"sequence length {S} exceeds max_position_embeddings="
                                 f"{self.config.max_position_embeddings}")
            cos, sin = self.rope_cos[:S], self.rope_sin_signed[:S]  # [S, D]
            attends = [causal_attend] * len(self.model.layers)
        else:
            if cache.batch != B or cache.num_layers != len(self.model.layers):
                raise ValueError(f"cache has batch={cache.batch}, layers={cache.num_layers}; tokens have "
                                 f"batch={B} and the model {len(self.model.layers)} layers")
            cos, sin, shared = cached_attention_setup(cache, S, kv_len, self.rope_cos, self.rope_sin_signed)
            attends = [partial(cached_attend, k_cache=cache.k, v_cache=cache.v, layer=i, **shared)
                       for i in range(cache.num_layers)]
        hidden = self._layers(tokens, cos, sin, attends, taps)  # [B, S, d] or [B, S, (1 + len(taps)) d]
        return (self.lm_logits(hidden) if compute_logits else None), hidden

    def forward_layers(self, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                       attends: list[Attend], taps: tuple[int, ...] = ()) -> torch.Tensor:
        """Hidden states [B, S, d] after the final norm of tokens [B, S] under the caller's RoPE tables (broadcastable
        to [B, H, S, D]) and attention per layer, which `forward` builds itself: for a caller that lays its tokens
        out otherwise (the engine's ragged verification, bebop.engine.ragged); with `taps`, the features as `_layers`."""
        return self._layers(tokens, cos, sin, attends, taps)

    def _layers(self, tokens: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attends: list[Attend],
                taps: tuple[int, ...] = ()) -> torch.Tensor:
        """The final-normed hidden [B, S, d], followed along the last dim by the residual stream after each decoder
        layer in `taps`, in order ([B, S, (1 + len(taps)) d]: a fused head's features; `check_taps`)."""
        check_taps(taps, len(self.model.layers))
        x, tapped = self.model.embed_tokens(tokens), []  # [B, S, d]
        for index, (layer, attend) in enumerate(zip(self.model.layers, attends, strict=True)):
            x = layer(x, cos, sin, attend)
            if index in taps:
                tapped.append(x)
        hidden = self.model.norm(x)  # [B, S, d]
        return torch.cat([hidden, *tapped], -1) if taps else hidden

    def forward_shared_prefix(self, prefix: torch.Tensor, prefix_lengths: torch.Tensor, suffix: torch.Tensor,
                              group: torch.Tensor, taps: tuple[int, ...] = ()
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rows that share prompts, each prompt computed once (training; no cache).

        prefix [G, P] long, right-padded to real lengths prefix_lengths [G]; suffix [N, S] long; row n is
        prefix[group[n], :prefix_lengths[group[n]]] followed by suffix[n]. Returns (prefix_logits [G, P, V],
        prefix_hidden [G, P, d], suffix_logits [N, S, V], suffix_hidden [N, S, d]), what `forward` gives on each
        concatenated row at the same positions; gradients from all rows of a prompt meet in its one copy. `taps`:
        the hidden states are a fused head's features, as `forward`'s."""
        (G, P), (N, S) = prefix.shape, suffix.shape
        if prefix_lengths.shape != (G,) or group.shape != (N,):
            raise ValueError(f"prefix_lengths must be [G]={G} and group [N]={N}; got {tuple(prefix_lengths.shape)}, "
                             f"{tuple(group.shape)}")
        if P + S > self.config.max_position_embeddings:
            raise ValueError(f"prefix + suffix length {P + S} exceeds max_position_embeddings="
                             f"{self.config.max_position_embeddings}")
        prefix_kv: list[tuple[torch.Tensor, torch.Tensor]] = []

        def keep_kv(q, k, v):  # the prompt's keys/values per layer, for its rows' suffixes to attend over
            prefix_kv.append((k, v))
            return causal_attend(q, k, v)

        layers = len(self.model.layers)
        prefix_hidden = self._layers(prefix, self.rope_cos[:P], self.rope_sin_signed[:P], [keep_kv] * layers, taps)
        start = prefix_lengths.to(suffix.device)[group]  # [N] where each suffix begins
        pos = start[:, None] + torch.arange(S, device=suffix.device)  # [N, S]
        slot = torch.arange(P + S, device=suffix.device)  # [P + S]: prefix slots, then suffix slots
        query = torch.arange(S, device=suffix.device)[:, None]  # [S, 1]
        visible = torch.where(slot < P, slot < start[:, None, None],  # a prompt's real positions ...
                              slot - P <= query)  # ... then its own suffix, causally: [N, S, P + S]
        bias = additive_bias(visible)[:, None]  # [N, 1, S, P + S]
        attends = [partial(prefix_attend, prefix_k=k[group], prefix_v=v[group], bias=bias)
                   for k, v in prefix_kv]
        suffix_hidden = self._layers(suffix, self.rope_cos[pos][:, None], self.rope_sin_signed[pos][:, None], attends,
                                     taps)
        return self.lm_logits(prefix_hidden), prefix_hidden, self.lm_logits(suffix_hidden), suffix_hidden

    def lm_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Project final hidden states [..., d] (as returned by forward; of features with taps, their first d) to
        logits [..., V]."""
        return self.lm_head(hidden[..., : self.config.hidden_size])

    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> KVCache:
        """An empty ragged KV cache for `batch` rows of up to `max_len` positions each."""
        if max_len > self.config.max_position_embeddings:
            raise ValueError(f"max_len={max_len} exceeds max_position_embeddings="
                             f"{self.config.max_position_embeddings}")
        weight = self.model.embed_tokens.weight
        c = self.config
        return KVCache(c.num_hidden_layers, batch, c.num_key_value_heads, max_len, c.head_dim,
                       dtype or weight.dtype, device or weight.device)

    def num_parameters(self) -> int:
        """Distinct parameters (a tied LM head counts once)."""
        return sum(p.numel() for p in self.parameters())
