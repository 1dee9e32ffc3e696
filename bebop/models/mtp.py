"""The MTP draft head: one DeepSeek-V3 / Qwen3-Next style block, applied recursively (docs/paper.md §1).

    x_k = fc([pre_fc_norm_embedding(Emb(y_{t+k})) ; pre_fc_norm_hidden(h_{k-1})])     (2d -> d)
    h_k = norm(layer(x_k))                     one decoder layer with its own KV cache
    q_k = softmax(lm_head(h_k) / T)            step k at anchor t predicts token t+k+1

h_0 is the backbone's hidden at position t AFTER its final norm (what `Transformer.forward` returns), and the
h_k fed to the next step is the head's output after its own final norm: that is how vLLM's qwen3_next_mtp
wires it (the block returns norm(layer(x)), compute_logits applies the LM head to it, and the next draft
step takes that same tensor as its hidden). The concatenation order [embedding ; hidden] is Qwen3-Next's.
Module names (fc, pre_fc_norm_embedding, pre_fc_norm_hidden, layers.0, norm) are Qwen3-Next's `mtp.*` names,
so a saved head can be read by engines that serve those checkpoints. (Qwen3-Next's RMSNorm stores weight-1;
ours is Qwen3's, weight as is, like the backbone it sits on.)

The embedding and LM head belong to the backbone and stay frozen: they are not submodules of the head
(head.parameters() holds only the head's own weights), every method takes the backbone as its first
argument, and the head reads them through `.detach()`, as it does the backbone's hidden state. A draft
loss therefore never reaches the policy, even when the policy's parameters require grad.

Inference (`forward_cached`) and training (`chain`) compute the same function, so the head trained is the
head used at rollout. In inference the head's cache holds one step-1 entry per position i, made from
(h_i, y_{i+1}); a draft step k >= 2 for anchor t sits at position t+k-1 and sees the step-1 entries at
positions <= t plus the entries of steps 2..k of the same anchor. `chain` reproduces exactly that pattern
for all anchors at once with an attention mask over the concatenated steps.

A head may draft over a draft vocabulary S (`draft_ids`, K target ids; bebop.draft_vocab): its logits are then the
LM head's rows of S only ([..., K], draft index i standing for target id draft_ids[i]), `to_target` maps a drafted
index to its id and `full_probs` spreads q over the target's vocabulary, zero off S, for verification.

Fused features (EAGLE-3's): a head with `feature_layers` (decoder layer indices, e.g. a low and a middle one) reads
at step 1 not the backbone's top hidden alone but a learned projection of it and of those layers' residual streams:

    h_0 = fuse([h_top ; norm_1(r_i) ; norm_2(r_j) ...])        ((1 + n) d -> d), then the block as above

The backbone hands them over as one tensor, its features (`Transformer.forward(..., taps=head.feature_layers)`:
[..., (1 + n) d], the top hidden first, which the target's logits read); a step k >= 2 reads the head's own output
[..., d] as before, and `_input` tells the two apart by width. `fuse` starts as [I | 0 ...], so a fused head starts
as the top-layer head it was made from (`with_features`), and each raw residual stream gets its own RMSNorm (their
scales differ by layer). A head without feature layers handed features reads their top hidden.

A deeper head (`num_layers` > 1): the block's one decoder layer becomes a stack, `layers.0 .. layers.{n-1}`, each with
its own layer of the head's cache; the recursion, the norm and the readout are unchanged. `with_layers` grows a head
by layers whose output projections (attention and MLP) start at zero, so each added layer passes its input through
and the grown head starts as the head it was made from. Qwen3-Next's and DeepSeek-V3's `mtp.layers.k` are one module
per draft step, not a stack: the vLLM and transformers writers refuse a deeper head in one line.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from bebop.draft_vocab import check_ids, scatter_probs
from bebop.models.attention import cached_attend, cached_attention_setup, write_kv
from bebop.models.config import ModelConfig
from bebop.models.kvcache import KVCache
from bebop.models.prepack import Linear, linear, linear_rows
from bebop.models.transformer import DecoderLayer, RMSNorm, Transformer, check_taps, init_weights

# What a head shares with its backbone: the token embedding and LM head (vocab_size, hidden_size), the rotary
# tables (head_dim), and the decoder layer's shape, which `MTPHead(model_config)` takes from the backbone's config.
FIT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "head_dim")


def check_head_fits(head_config: ModelConfig, model_config: ModelConfig) -> None:
    """Raise one ValueError naming every field where a head built for `head_config` differs from the policy's
    backbone `model_config`; the engine, the RL trainer, the head's own forwards and `load_head` all ask here."""
    wrong = [f"{name} {getattr(head_config, name)} (head) != {getattr(model_config, name)} (policy)"
             for name in FIT_FIELDS if getattr(head_config, name) != getattr(model_config, name)]
    if wrong:
        raise ValueError("MTP head does not match the policy's backbone: " + "; ".join(wrong))


def shared_taps(heads) -> tuple[int, ...]:
    """The feature layers the fused heads among `heads` read (None and heads without them aside), which one backbone
    pass hands them all: they must agree (a ValueError naming them otherwise); () when none is fused."""
    found = {tuple(getattr(h, "feature_layers", ())) for h in heads if h is not None} - {()}
    if len(found) > 1:
        raise ValueError(f"heads read different feature layers {sorted(found)}: one run's backbone pass hands one set "
                         "of features to all its heads")
    return found.pop() if found else ()


def chain_mask(num_anchors: int, step: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Which keys query (step, anchor t) may see, as bool [T, step*T] over the keys of steps 1..step laid
    side by side: step-1 keys at anchors t' <= t, and the keys of steps 2..step at anchor t only."""
    first = torch.ones(num_anchors, num_anchors, dtype=torch.bool, device=device).tril()  # [T, T]
    same = torch.eye(num_anchors, dtype=torch.bool, device=device)  # [T, T]
    return torch.cat([first] + [same] * (step - 1), 1)  # [T, step*T]


def chain_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, keys: list[torch.Tensor],
                 values: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Attention for step `len(keys)+1` of the chain: appends this step's k/v [B, Hkv, T, D] to the lists
    (so the next step sees them) and attends q [B, H, T, D] over all steps so far under `mask`."""
    keys.append(k)
    values.append(v)
    all_k, all_v = torch.cat(keys, 2), torch.cat(values, 2)  # [B, Hkv, step*T, D]
    return F.scaled_dot_product_attention(q, all_k, all_v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


class MTPHead(nn.Module):
    """A draft head for a backbone of `model_config`; `trained_depth`/`objective` are metadata for the engine;
    `draft_ids` [K] (a draft vocabulary, `bebop.draft_vocab`) restricts its drafts to those target ids."""

    def __init__(self, model_config: ModelConfig, *, trained_depth: int | None = None, objective: str | None = None,
                 draft_ids: torch.Tensor | None = None, feature_layers: tuple[int, ...] = (), num_layers: int = 1):
        super().__init__()
        if not isinstance(model_config, ModelConfig):
            raise ValueError(f"model_config must be a ModelConfig, got {type(model_config).__name__}")
        if trained_depth is not None and (not isinstance(trained_depth, int) or trained_depth < 1):
            raise ValueError(f"trained_depth must be a positive int or None, got {trained_depth!r}")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be a positive int, got {num_layers!r}")
        self.config = model_config
        self.trained_depth = trained_depth
        self.objective = objective
        self.name_or_path: str | None = None  # the spec or directory it was loaded by (load_head, bebop.policy)
        d, eps = model_config.hidden_size, model_config.rms_norm_eps
        self.fc = Linear(2 * d, d, bias=False)
        self.pre_fc_norm_embedding = RMSNorm(d, eps)
        self.pre_fc_norm_hidden = RMSNorm(d, eps)
        self.layers = nn.ModuleList(DecoderLayer(model_config) for _ in range(num_layers))
        self.norm = RMSNorm(d, eps)
        self.apply(init_weights)
        check_taps(tuple(feature_layers), model_config.num_hidden_layers)
        self.feature_layers = tuple(feature_layers)
        if self.feature_layers:  # fused features (module docstring), starting as the top hidden alone
            n = len(self.feature_layers)
            self.fuse = Linear((1 + n) * d, d, bias=False)
            self.fuse_norms = nn.ModuleList([RMSNorm(d, eps) for _ in range(n)])
            with torch.no_grad():
                self.fuse.weight.zero_()
                self.fuse.weight[:, :d].copy_(torch.eye(d))
        # Not in state_dict: checkpoints store S as EAGLE-3's d2t / t2d (bebop.models.checkpoint); .to() moves it.
        self.register_buffer("draft_ids", None, persistent=False)
        self._draft_weight: tuple | None = None  # (the LM head's version key, its rows of S): see `draft_weight`
        self.use_draft_vocab(draft_ids)

    # ----------------------------------------------------------------------------------------------
    def _input(self, backbone: Transformer, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """x = fc([norm_e(Emb(tokens)); norm_h(features(hidden))]), hidden [B, S, d] (the head's own output, or the
        backbone's top hidden) or [B, S, (1 + n) d] (the backbone's features), tokens [B, S] -> [B, S, d]."""
        embedding = F.embedding(tokens, backbone.model.embed_tokens.weight.detach())  # [B, S, d]
        hidden = self.features(hidden.detach())  # [B, S, d]
        both = torch.cat([self.pre_fc_norm_embedding(embedding), self.pre_fc_norm_hidden(hidden)], -1)
        return self.fc(both)

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """h_0 [..., d] from what the head is handed: [..., d] as it is; the backbone's features [..., (1 + m) d] (the
        top hidden first) fused when m is the head's feature layers' count, their top hidden without feature layers."""
        d, n = self.config.hidden_size, len(self.feature_layers)
        width = hidden.shape[-1]
        if width == d:
            return hidden
        if width % d or (n and width != (1 + n) * d):
            raise ValueError(f"the head reads hidden states of width {d} or features of width {(1 + n) * d} "
                             f"(feature layers {self.feature_layers}), got {width}")
        if not n:
            return hidden[..., :d]
        parts = hidden.unflatten(-1, (1 + n, d))  # [..., 1 + n, d]
        normed = [parts[..., 0, :]] + [norm(parts[..., i + 1, :]) for i, norm in enumerate(self.fuse_norms)]
        return self.fuse(torch.cat(normed, -1))  # [..., d]

    def with_features(self, feature_layers: tuple[int, ...]) -> MTPHead:
        """A copy of this top-layer head that reads fused features of `feature_layers`, starting as this head (its
        fuse passes the top hidden through)."""
        if self.feature_layers:
            raise ValueError(f"the head already reads feature layers {self.feature_layers}")
        return self._copy(feature_layers=feature_layers)

    def with_layers(self, num_layers: int) -> MTPHead:
        """A copy of this head with `num_layers` decoder layers (at least its own), starting as this head: each added
        layer's attention and MLP output projections are zero, so it passes its input through."""
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < len(self.layers):
            raise ValueError(f"a head of {len(self.layers)} layers grows to at least as many, got {num_layers!r}")
        head = self._copy(num_layers=num_layers)
        with torch.no_grad():
            for layer in head.layers[len(self.layers):]:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
        return head

    def _copy(self, **changes) -> MTPHead:
        """This head rebuilt with `changes` to its constructor's arguments, its own weights loaded where they fit (the
        new parts keep their initialisation), on its device and dtype."""
        kwargs = dict(trained_depth=self.trained_depth, objective=self.objective, draft_ids=self.draft_ids,
                      feature_layers=self.feature_layers, num_layers=len(self.layers)) | changes
        head = MTPHead(self.config, **kwargs).to(device=self.fc.weight.device, dtype=self.fc.weight.dtype)
        head.load_state_dict(self.state_dict(), strict=False)
        return head

    def use_draft_vocab(self, draft_ids: torch.Tensor | None) -> MTPHead:
        """Draft over the target ids `draft_ids` [K] from now on (None: the whole vocabulary); returns the head."""
        if draft_ids is not None:
            draft_ids = check_ids(draft_ids, self.config.vocab_size).to(self.fc.weight.device)
        self.draft_ids, self._draft_weight = draft_ids, None
        return self

    @property
    def draft_size(self) -> int:
        """How many tokens the head drafts over: K with a draft vocabulary, else the target's V."""
        return self.config.vocab_size if self.draft_ids is None else self.draft_ids.numel()

    def logits(self, backbone: Transformer, hidden: torch.Tensor) -> torch.Tensor:
        """Draft logits [..., K] from the head's output hidden [..., d], through the backbone's frozen LM head (its
        rows of the draft vocabulary when the head has one; K = V without)."""
        if self.draft_ids is None:
            return linear(hidden, backbone.lm_head, detach=True)
        return linear_rows(hidden, self.draft_weight(backbone))

    def draft_weight(self, backbone: Transformer) -> torch.Tensor:
        """W_S [K, d]: the backbone's LM head rows of the draft vocabulary (detached). Gathered once per version of
        the LM head (an RL update changes it in place; a tied head changes with the embedding) and reused until
        then; inside a compiled graph, gathered every call."""
        weight = backbone.lm_head.weight.detach()
        if torch.compiler.is_compiling() or weight.is_inference():  # no version counter to reuse a gather by
            return weight[self.draft_ids]
        key = (weight._version, weight.data_ptr(), weight.dtype, weight.device, self.draft_ids.data_ptr(),
               torch.is_inference_mode_enabled())  # an inference-mode gather cannot enter autograd later
        if self._draft_weight is None or self._draft_weight[0] != key:
            self._draft_weight = (key, weight[self.draft_ids])
        return self._draft_weight[1]

    def to_target(self, index: torch.Tensor) -> torch.Tensor:
        """Target ids of drafted indices (the identity without a draft vocabulary)."""
        return index if self.draft_ids is None else self.draft_ids[index]

    def full_probs(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """q [..., K] -> [..., V], zero off the draft vocabulary (the identity without one)."""
        return draft_probs if self.draft_ids is None else scatter_probs(draft_probs, self.draft_ids,
                                                                        self.config.vocab_size)

    def new_cache(self, batch: int, max_len: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None) -> KVCache:
        """An empty ragged cache for the head, a layer of it per decoder layer."""
        if max_len > self.config.max_position_embeddings:
            raise ValueError(f"max_len={max_len} exceeds max_position_embeddings={self.config.max_position_embeddings}")
        weight, c = self.fc.weight, self.config
        return KVCache(len(self.layers), batch, c.num_key_value_heads, max_len, c.head_dim, dtype or weight.dtype,
                       device or weight.device)

    # ----------------------------------------------------------------------------------------------
    def forward_cached(self, backbone: Transformer, hidden: torch.Tensor, next_tokens: torch.Tensor,
                       cache: KVCache, *, kv_len: int | None = None,
                       compute_logits: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
        """One head step for S entries per row: entry s of row b sits at position cache.lengths[b] + s and
        pairs hidden[b, s] (backbone hidden, or the head's previous output) with next_tokens[b, s] (the token
        one position later). Returns (logits [B, S, V] or None, out_hidden [B, S, d]); lengths are not moved."""
        check_head_fits(self.config, backbone.config)
        if hidden.dim() != 3 or next_tokens.shape != hidden.shape[:2]:
            raise ValueError(f"hidden must be [B, S, d] and next_tokens [B, S]; got {tuple(hidden.shape)} "
                             f"and {tuple(next_tokens.shape)}")
        if cache.batch != hidden.shape[0] or cache.num_layers != len(self.layers):
            raise ValueError(f"cache must have {len(self.layers)} layers and batch={hidden.shape[0]}, "
                             f"got {cache.num_layers} layers, batch={cache.batch}")
        cos, sin, shared = cached_attention_setup(cache, hidden.shape[1], kv_len, backbone.rope_cos, backbone.rope_sin_signed)
        x = self._input(backbone, hidden, next_tokens)  # [B, S, d]
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, partial(cached_attend, k_cache=cache.k, v_cache=cache.v, layer=i, **shared))
        out = self.norm(x)  # [B, S, d]
        return (self.logits(backbone, out) if compute_logits else None), out

    def write_keys(self, backbone: Transformer, hidden: torch.Tensor, next_tokens: torch.Tensor, cache: KVCache, *,
                   kv_len: int | None = None) -> None:
        """Only the cache entries of `forward_cached`'s S entries per row (same arguments), not their outputs: what a
        prefill or catch-up needs of every entry but the last, whose output is the next draft's query. The keys and
        values are the last layer's first matmul; its attention, output projection and MLP at those entries (most of
        the layer) are skipped (the layers below it run whole: their outputs are its input). Lengths are not moved."""
        check_head_fits(self.config, backbone.config)
        if hidden.dim() != 3 or next_tokens.shape != hidden.shape[:2] or cache.batch != hidden.shape[0]:
            raise ValueError(f"need hidden [B, S, d], next_tokens [B, S] and a cache of batch B; got "
                             f"{tuple(hidden.shape)}, {tuple(next_tokens.shape)}, batch={cache.batch}")
        cos, sin, shared = cached_attention_setup(cache, hidden.shape[1], kv_len, backbone.rope_cos,
                                                  backbone.rope_sin_signed)
        x = self._input(backbone, hidden, next_tokens)  # [B, S, d]
        for i, layer in enumerate(self.layers[:-1]):
            x = layer(x, cos, sin, partial(cached_attend, k_cache=cache.k, v_cache=cache.v, layer=i, **shared))
        last = len(self.layers) - 1
        _, k, v = self.layers[last].self_attn.project(self.layers[last].input_layernorm(x), cos, sin)  # [B, Hkv, S, D]
        write_kv(k, v, k_cache=cache.k, v_cache=cache.v, layer=last, rows=shared["rows"], pos=shared["pos"])

    def chain_hidden(self, backbone: Transformer, hidden: torch.Tensor, tokens: torch.Tensor,
                     depth: int) -> torch.Tensor:
        """Teacher-forced outputs h_k for every anchor and step: [B, T, depth, d]; see `chain`."""
        check_head_fits(self.config, backbone.config)
        if hidden.dim() != 3 or tokens.shape != hidden.shape[:2]:
            raise ValueError(f"hidden must be [B, T, d] and tokens [B, T]; got {tuple(hidden.shape)} "
                             f"and {tuple(tokens.shape)}")
        if not isinstance(depth, int) or depth < 1:
            raise ValueError(f"depth must be a positive int, got {depth!r}")
        T = tokens.shape[1]
        if T + depth - 1 > self.config.max_position_embeddings:
            raise ValueError(f"T + depth - 1 = {T + depth - 1} exceeds max_position_embeddings="
                             f"{self.config.max_position_embeddings}")
        # Inputs past the sequence end are padding: only anchors whose chain stays inside are trained.
        padded = F.pad(tokens, (0, depth), value=0)  # [B, T + depth]
        anchors = torch.arange(T, device=tokens.device)  # [T]
        keys: list[list[torch.Tensor]] = [[] for _ in self.layers]  # per layer, each step's [B, Hkv, T, D]
        values: list[list[torch.Tensor]] = [[] for _ in self.layers]
        h, outs = hidden.detach(), []
        for k in range(1, depth + 1):
            x = self._input(backbone, h, padded[:, k:k + T])  # step k reads y_{t+k}
            pos = anchors + (k - 1)  # [T]: (step k, anchor t) sits at position t+k-1, as in inference
            mask = chain_mask(T, k, tokens.device)
            for layer, layer_keys, layer_values in zip(self.layers, keys, values):
                attend = partial(chain_attend, keys=layer_keys, values=layer_values, mask=mask)
                x = layer(x, backbone.rope_cos[pos], backbone.rope_sin_signed[pos], attend)  # [B, T, d]
            h = self.norm(x)
            outs.append(h)
        return torch.stack(outs, 2)  # [B, T, depth, d]

    def chain(self, backbone: Transformer, hidden: torch.Tensor, tokens: torch.Tensor, depth: int) -> torch.Tensor:
        """Training forward, all anchors in parallel, teacher forced: hidden [B, T, d] (backbone, detached
        here), tokens [B, T] -> draft_logits [B, T, depth, K] (K = V without a draft vocabulary), where [b, t, k-1] is step k at anchor t
        (input token tokens[b, t+k], predicting tokens[b, t+k+1]). Pair with `chain_targets`."""
        return self.logits(backbone, self.chain_hidden(backbone, hidden, tokens, depth))

    def forward(self, backbone: Transformer, hidden: torch.Tensor, tokens: torch.Tensor, depth: int) -> torch.Tensor:
        """= chain (so DDP-style wrappers that call the module train the same function)."""
        return self.chain(backbone, hidden, tokens, depth)


def chain_targets(backbone_logits: torch.Tensor, tokens: torch.Tensor, depth: int,
                  lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Targets aligned with `MTPHead.chain`, for `bebop.losses.draft_loss`.

    backbone_logits [B, T, V], tokens [B, T] ->
      target_logits [B, T, depth, V]  [b, t, k-1] = backbone_logits[b, t+k] (detached; a strided view)
      labels        [B, T, depth]     [b, t, k-1] = tokens[b, t+k+1]
      mask          [B, T] bool       anchors whose whole chain is inside the row: t + depth + 1 < length
    Entries past the end are zero-padded and masked out. `lengths` [B] (default T) marks right padding."""
    if backbone_logits.dim() != 3 or backbone_logits.shape[:2] != tokens.shape:
        raise ValueError(f"backbone_logits must be [B, T, V] matching tokens [B, T]; got "
                         f"{tuple(backbone_logits.shape)} and {tuple(tokens.shape)}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive int, got {depth!r}")
    B, T, _ = backbone_logits.shape
    logits = F.pad(backbone_logits.detach(), (0, 0, 0, depth))  # [B, T + depth, V]
    # Window i of unfold is positions i..i+depth-1; anchor t needs positions t+1..t+depth, i.e. window t+1.
    target_logits = logits.unfold(1, depth, 1)[:, 1:T + 1].transpose(2, 3)  # [B, T, depth, V]
    labels = F.pad(tokens, (0, depth + 1)).unfold(1, depth, 1)[:, 2:T + 2]  # [B, T, depth]
    if lengths is None:
        lengths = torch.full((B,), T, device=tokens.device)
    elif lengths.shape != (B,):
        raise ValueError(f"lengths must be [B]={B}, got {tuple(lengths.shape)}")
    anchors = torch.arange(T, device=tokens.device)
    mask = anchors[None, :] + depth + 1 < lengths.to(tokens.device)[:, None]  # [B, T]
    return target_logits, labels, mask
