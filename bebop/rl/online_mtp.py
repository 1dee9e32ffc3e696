"""What happens to the MTP draft head during RL (PAPER §5, finding 4).

    frozen     the paper's recipe: adapt the head once before RL (e2e TV), then never touch it. Its
               weights stay bit-identical; the step logs `mtp/online_update = 0`.
    online-tv  after every policy update, one step on the head with the e2e TV loss on the step's fresh
               rollouts: the exception the paper allows when RL pushes entropy outside the pre-RL range.
    online-ce  the same with hard CE on the sampled tokens: the paper finds it pulls an RS+TV head back
               toward the smoother RS+CE baseline.

The online head has its own AdamW optimiser, learning rate and gradient-norm clip. Its loss never
reaches the policy: `MTPHead` reads the backbone's hidden states, embedding and LM head through
`.detach()`, and the backbone activations handed in here are detached as well, so the policy's `.grad`
is untouched by `update` (tests/test_rl.py checks it).

Targets are the backbone's own distributions on the rollout rows (teacher forcing on what was sampled), aligned
by `bebop.models.mtp.chain_targets`; only anchors inside the completion are trained, since that is where the
head drafts at rollout. The trainer hands in the backbone's hidden states, not its logits ([N, L, V] float32
would not fit at a real vocabulary): the loss sends the valid anchors' hidden states through the LM head in row
chunks (`bebop.losses_from_hidden`), the same LM head the head drafts through, i.e. the policy's
after its step. The head's chain runs `micro_batch_rows` rows at a time with the gradient accumulated, each
micro-batch weighted by its share of the valid anchors, so the step equals one step on all rows at once. Under
torchrun each rank trains its own rows, weighted by their share of the global batch's anchors, and the head's
gradients are summed over the ranks (every rank holds the whole head), which is the single-process step.
"""

from __future__ import annotations

import torch

from bebop import distributed
from bebop.losses_from_hidden import draft_loss_and_alpha_from_hidden
from bebop.models.mtp import MTPHead, chain_targets

OBJECTIVE = {"online-tv": "e2e_tv", "online-ce": "ce"}


class OnlineMTP:
    """Keeps the head frozen or trains it on rollouts; `update` returns the step's `mtp/*` metrics."""

    def __init__(self, head: MTPHead | None, strategy: str, *, lr: float, grad_clip: float, depth: int,
                 temperature: float = 1.0, micro_batch_rows: int = 8, vocab_limit: int | None = None):
        if strategy not in ("frozen", *OBJECTIVE):
            raise ValueError(f"unknown MTP strategy {strategy!r}; valid names: ['frozen', {', '.join(map(repr, OBJECTIVE))}]")
        if strategy != "frozen" and head is None:
            raise ValueError(f"MTP strategy {strategy!r} needs a head to train")
        if not isinstance(micro_batch_rows, int) or micro_batch_rows < 1:
            raise ValueError(f"micro_batch_rows must be a positive int, got {micro_batch_rows!r}")
        self.head, self.strategy, self.micro_batch_rows = head, strategy, micro_batch_rows
        self.grad_clip, self.depth, self.temperature = grad_clip, depth, temperature
        self.vocab_limit = vocab_limit  # the LM head's rows past it are padding the rollouts never sample
        self.optimizer = None
        if head is not None:
            head.requires_grad_(strategy != "frozen")
        if strategy != "frozen":
            self.optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)

    @property
    def trains(self) -> bool:
        """True when `update` trains the head (it then needs the backbone's hidden states)."""
        return self.optimizer is not None

    @property
    def objective(self) -> str | None:
        return OBJECTIVE.get(self.strategy)

    def update(self, backbone, hidden: torch.Tensor | None, tokens: torch.Tensor, lengths: torch.Tensor,
               prompt_lengths: torch.Tensor) -> dict[str, float]:
        """One head step on rows `tokens` [B, L] with the backbone's hidden states [B, L, d] (None when the head
        is frozen: nothing is read).

        Anchors are completion positions (t >= prompt length - 1) whose whole chain is inside the row."""
        if self.optimizer is None:
            return {"mtp/online_update": 0}
        B, L = tokens.shape
        if hidden.shape[:2] != (B, L):
            raise ValueError(f"hidden {tuple(hidden.shape)} must start with tokens' [B, L]={B, L}")
        hidden = hidden.detach()  # [B, L, d], or a fused head's features [B, L, (1 + n) d] (the top hidden first)
        top = hidden[..., : self.head.config.hidden_size]  # [B, L, d]: what the target's logits read
        target_hidden, labels, mask = chain_targets(top, tokens, self.depth, lengths)  # [B, L, γ, d]
        anchors = torch.arange(L, device=tokens.device)  # [L]
        mask = mask & (anchors[None, :] >= prompt_lengths.to(tokens.device)[:, None] - 1)  # [B, L]
        total = int(distributed.all_reduce(mask.sum()))  # under torchrun: the global batch's anchors
        if total == 0:
            return {"mtp/online_update": 0}
        self.head.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = d_tv_sum = 0.0
        for start in range(0, B, self.micro_batch_rows):
            rows = slice(start, start + self.micro_batch_rows)
            count = int(mask[rows].sum())
            if count:
                loss, d_tv = self._micro_step(backbone, hidden[rows], tokens[rows], target_hidden[rows],
                                              labels[rows], mask[rows], count / total)
                loss_sum, d_tv_sum = loss_sum + loss * count, d_tv_sum + d_tv
        distributed.all_reduce_grads(self.head.parameters())  # every rank's replica takes the global step
        grad_norm = torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.grad_clip)
        self.optimizer.step()
        self.head.eval()
        loss_sum, d_tv_sum = (float(distributed.all_reduce(float(x))) for x in (loss_sum, d_tv_sum))
        return {f"mtp/loss/{self.objective}": loss_sum / total, "mtp/d_tv_mean": d_tv_sum / total,
                "mtp/grad_norm": float(grad_norm), "mtp/online_update": 1}

    def _micro_step(self, backbone, hidden, tokens, target_hidden, labels, mask, share: float) -> tuple[float, float]:
        """Backward of `share` x the loss on some rows (hidden [b, L, d], target_hidden [b, L, γ, d], mask [b, L]);
        returns (their mean loss, their sum over anchors of the mean d_TV over steps)."""
        weight = backbone.lm_head.weight.detach()[: self.vocab_limit]  # [V, d]
        draft_hidden = self.head.chain_hidden(backbone, hidden, tokens, self.depth)  # [b, L, γ, d]
        # A head over a draft vocabulary trains on S; its targets' log-normalisers come from the whole LM head, in
        # chunks, as the full-vocabulary loss's logits do.
        loss, alpha = draft_loss_and_alpha_from_hidden(draft_hidden, target_hidden, weight, objective=self.objective,
                                                       labels=labels, mask=mask, temperature=self.temperature,
                                                       draft_ids=self.head.draft_ids)  # [], [M, γ]
        (loss * share).backward()
        return float(loss.detach()), float((1 - alpha).mean(-1).sum())

    def state_dict(self) -> dict | None:
        return None if self.optimizer is None else self.optimizer.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if (state is None) != (self.optimizer is None):
            raise ValueError(f"checkpoint's head optimiser state does not fit MTP strategy {self.strategy!r}")
        if state is not None:
            self.optimizer.load_state_dict(state)
