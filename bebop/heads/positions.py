"""The target and draft distributions at every position the policy wrote: what notebooks 01 and 02 inspect.

The policy answers the examples by plain decoding at its temperature, prompts in the format the jobs use (a chat
user turn when the tokenizer has a chat template, as `--chat-template auto`, so the positions are those `eval-mtp`
measures); the answers are then run through the policy once
more, teacher forced, to read at each position t whose next token the policy wrote (its input token t and its
drafted token t + 1 both policy-written, `anchor_mask`) the target p (the backbone's next-token distribution,
aligned by `chain_targets`) and each head's first draft step q (`MTPHead.chain`), both at that temperature. From those,
α_TO = p(argmax q) and α_RS = 1 − d_TV(p, q) are exact expectations, not Monte Carlo estimates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from bebop.data.batches import pad
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig
from bebop.heads.data import anchor_mask
from bebop.models.mtp import MTPHead, chain_targets
from bebop.models.transformer import Transformer
from bebop.data.prompts import PromptFormat, prompt_format, prompt_ids
from bebop.play import complete
from bebop.sampling import probs_from_logits


@torch.no_grad()
def policy_positions(model: Transformer, tokenizer, heads: Mapping[str, MTPHead], task, examples: Sequence,
                     answers: GenerationConfig, *, fmt: PromptFormat | None = None
                     ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """p [N, V] and {head: q [N, V]} at the N positions whose next token the policy wrote (module docstring), the
    policy answering as `answers` says (plain decoding: gamma 0; its temperature is also p's and q's); `fmt` None:
    the jobs' default format for this tokenizer."""
    if answers.gamma != 0:
        raise ValueError(f"the policy answers by plain decoding: gamma must be 0, got {answers.gamma!r}")
    fmt = prompt_format("auto", tokenizer) if fmt is None else fmt
    completions, _ = complete(Engine(model), tokenizer, task, examples, answers, prompt_format=fmt)
    temperature = answers.temperature
    prompts = prompt_ids(tokenizer, examples, fmt)
    tokens, lengths = pad([p + c.tokens for p, c in zip(prompts, completions)], 0)  # [B, T]
    written, _ = pad([[0] * len(p) + [int(w) for w in c.policy] for p, c in zip(prompts, completions)], 0)  # [B, T]
    mask = anchor_mask(written.bool(), lengths, 1)  # [B, T]: the drafted token and its input are the policy's
    logits, hidden = model(tokens)  # [B, T, V], [B, T, d]
    target_logits, _, _ = chain_targets(logits, tokens, 1)  # [B, T, 1, V]
    p = probs_from_logits(target_logits[mask][:, 0], temperature)  # [N, V]
    # a head over a draft vocabulary: q over S spread over V, zero off S (what verification tests)
    # a fused head reads the backbone's features of its own layers, one more pass each
    features = {name: model(tokens, compute_logits=False, taps=head.feature_layers)[1] if head.feature_layers
                else hidden for name, head in heads.items()}
    qs = {name: head.full_probs(probs_from_logits(head.chain(model, features[name], tokens, 1)[mask][:, 0],
                                                  temperature))
          for name, head in heads.items()}  # [N, V]
    assert all(q.shape == p.shape for q in qs.values()), "a head's vocabulary differs from the policy's"
    return p, qs
