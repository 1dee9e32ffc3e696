"""Every head's acceptance along one RL trajectory: heads scored on each step's rollouts beside the run's own.

Finding 4 compares heads (frozen CE, frozen e2e TV, online TV, online CE) and verification rules (TO, RS) on the
same policy as RL changes it. One run per combination is hours on a CPU; here one run carries them all
(`bebop rl --shadow-heads ...`, `bebop.rl.shadow_spec`): each step, after the update's forward and before the
optimiser steps, every head (the run's own, labelled `rollout`, and each shadow head) is scored exactly on the
step's rollouts, teacher-forced, under both rules (`bebop.rl.shadow_score`); then the online shadow heads take one
step each on the same rollouts with their own optimiser (`OnlineMTP`, as an online rollout head does). The run's
rollouts still draft with its own head, so its speed figures are that head's.

The hidden states are the update's own forward (`SharedOutputs`, collected per row as the online head collects
them): no extra forward. The policy they come from is the one being updated, before its step (in async runs one
version newer than the one that sampled the rows, as the update's ratios are). The LM head, the embedding and the
entropies are that policy's too, read before `optimizer.step`. The trainer scores under the update's autocast, so in
the rollout dtype the engine drafts and verifies in (bf16 where fast, which also makes scoring cheaper); a float32
run scores in float32.

Teacher forcing drafts from every anchor, where a run's verify steps start only where the last one ended; the
rollout head's expected accept length is therefore close to, not equal to, the engine's measured one.

Under torchrun each rank scores its own rows; the counters are summed over the ranks (every rank then holds the
global record, which rank 0 logs); the online shadow heads' gradients are summed as the rollout head's are.
Memory: rows go through the head `micro_batch_rows` at a time, and the LM head in chunks (never [N, L, V]).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from bebop import distributed
from bebop.losses_from_hidden import acceptances_from_hidden
from bebop.models.mtp import MTPHead, chain_targets, check_head_fits
from bebop.rl.online_mtp import OnlineMTP
from bebop.rl.shadow_score import (RULES, counters_record, drafted_entropy, expected_counters, position_entropy,
                                   scored_anchors)
from bebop.rl.shadow_spec import ROLLOUT_LABEL, parse_shadow_specs


@dataclass
class ShadowHead:
    label: str
    strategy: str  # frozen | online-tv | online-ce
    head: MTPHead
    online: OnlineMTP | None = None  # its own trainer (None: frozen, or the rollout head, which the run trains)


class ShadowHeads:
    """The heads scored each step. `heads` maps each shadow spec's HEAD (as --head takes it) to a loaded head; each
    shadow gets its own copy. `rollout_head` (the trainer's, scored as it is) joins them when shadows are asked for.
    """

    def __init__(self, config, heads: Mapping[str, MTPHead], *, rollout_head: MTPHead | None, policy_config,
                 vocab_limit: int | None, device: torch.device, micro_batch_rows: int = 8):
        specs = parse_shadow_specs(config.shadow_heads)
        missing = sorted({s.head for s in specs} - set(heads))
        if missing:
            raise ValueError(f"shadow heads {missing} were not handed in: pass shadow_heads={{spec: head}} for each")
        self.depth, self.temperature, self.vocab_limit = config.draft_depth, config.temperature, vocab_limit
        self.micro_batch_rows = micro_batch_rows
        self.heads: list[ShadowHead] = []
        if specs and rollout_head is not None:
            self.heads.append(ShadowHead(ROLLOUT_LABEL, config.mtp, rollout_head))
        for spec in specs:
            check_head_fits(heads[spec.head].config, policy_config)
            head = copy.deepcopy(heads[spec.head]).float().to(device).eval()
            online = None
            if spec.strategy != "frozen":
                online = OnlineMTP(head, spec.strategy, lr=config.mtp_lr, grad_clip=config.mtp_grad_clip,
                                   depth=config.online_depth, temperature=config.temperature, vocab_limit=vocab_limit)
            else:
                head.requires_grad_(False)
            self.heads.append(ShadowHead(spec.label, spec.strategy, head, online))

    @property
    def active(self) -> bool:
        return bool(self.heads)

    def score(self, backbone, hidden: torch.Tensor, batch) -> tuple[list[dict], float]:
        """Every head under both rules on `batch`'s rows (a `RolloutBatch` on the device) with the policy's hidden
        states [N, L, d]: (one record per head and rule, the global batch's; seconds spent)."""
        start = time.perf_counter()
        with torch.no_grad():
            weight = backbone.lm_head.weight.detach()[: self.vocab_limit]  # [V, d]
            anchors = scored_anchors(batch.tokens, batch.lengths, batch.prompt_lengths, batch.policy_mask,
                                     self.depth)  # [N, L]
            needed = torch.zeros_like(anchors)  # [N, L] the drafted positions t+1..t+γ of every anchor
            for k in range(1, self.depth + 1):
                needed[:, k:] |= anchors[:, :-k]
            top = hidden[..., : weight.shape[1]]  # [N, L, d]: of a fused head's features, the top hidden
            drafted_h = drafted_entropy(position_entropy(top, weight, needed, self.temperature), batch.tokens,
                                        self.depth)[anchors]  # [M, γ]
            target_hidden, _, _ = chain_targets(top, batch.tokens, self.depth)  # [N, L, γ, d] a strided view
            totals = torch.stack([self._score_head(entry.head, backbone, hidden, batch.tokens, target_hidden,
                                                   anchors, weight, drafted_h) for entry in self.heads])  # [H, 2, C]
        totals = distributed.all_reduce(totals)
        records = [{"head": entry.label, "rule": rule, "strategy": entry.strategy,
                    **counters_record(totals[h, r], self.depth, rule)}
                   for h, entry in enumerate(self.heads) for r, rule in enumerate(RULES)]
        return records, time.perf_counter() - start

    def _score_head(self, head: MTPHead, backbone, hidden, tokens, target_hidden, anchors, weight,
                    drafted_h) -> torch.Tensor:
        """One head's summed counters under each rule [2, C] (`expected_counters`), rows a micro-batch at a time."""
        alphas: dict[str, list[torch.Tensor]] = {rule: [] for rule in RULES}
        for start in range(0, tokens.shape[0], self.micro_batch_rows):
            rows = slice(start, start + self.micro_batch_rows)
            if not bool(anchors[rows].any()):
                continue
            draft_hidden = head.chain_hidden(backbone, hidden[rows], tokens[rows], self.depth)  # [b, L, γ, d]
            rs, to = acceptances_from_hidden(draft_hidden, target_hidden[rows], weight, mask=anchors[rows],
                                             temperature=self.temperature, draft_ids=head.draft_ids)  # [m, γ] x2
            alphas["rs"].append(rs)
            alphas["to"].append(to)
        empty = torch.zeros(0, self.depth, device=hidden.device)
        return torch.stack([expected_counters(torch.cat(alphas[rule] or [empty]), drafted_h) for rule in RULES])

    def update(self, backbone, hidden: torch.Tensor, batch) -> dict[str, float]:
        """One step of each online shadow head on `batch`'s rows (after the policy's step, as the rollout head's
        online update): {timing_s/shadow/LABEL: seconds}."""
        timings = {}
        for entry in self.heads:
            if entry.online is None:
                continue
            start = time.perf_counter()
            entry.online.update(backbone, hidden, batch.tokens, batch.lengths, batch.prompt_lengths)
            timings[f"timing_s/shadow/{entry.label}"] = time.perf_counter() - start
        return timings

    def state_dict(self) -> dict[str, dict]:
        """The online shadow heads' weights and optimisers (frozen ones are reloaded from their specs)."""
        return {e.label: {"head": e.head.state_dict(), "optimizer": e.online.state_dict()}
                for e in self.heads if e.online is not None}

    def load_state_dict(self, state: Mapping[str, dict] | None) -> None:
        online = {e.label: e for e in self.heads if e.online is not None}
        state = state or {}
        if set(state) != set(online):
            raise ValueError(f"the checkpoint's online shadow heads {sorted(state)} are not this run's "
                             f"{sorted(online)}")
        for label, entry in online.items():
            entry.head.load_state_dict(state[label]["head"])
            entry.online.load_state_dict(state[label]["optimizer"])
