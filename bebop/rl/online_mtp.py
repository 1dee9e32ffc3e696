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

Targets are the backbone's own logits on the rollout rows (teacher forcing on what was sampled), aligned
by `bebop.models.mtp.chain_targets`; only anchors inside the completion are trained, since that is where the
head drafts at rollout.
"""

from __future__ import annotations

import torch

from bebop.losses import acceptance_alpha, draft_loss
from bebop.models.mtp import MTPHead, chain_targets

OBJECTIVE = {"online-tv": "e2e_tv", "online-ce": "ce"}


class OnlineMTP:
    """Keeps the head frozen or trains it on rollouts; `update` returns the step's `mtp/*` metrics."""

    def __init__(self, head: MTPHead | None, strategy: str, *, lr: float, grad_clip: float, depth: int,
                 temperature: float = 1.0):
        if strategy not in ("frozen", *OBJECTIVE):
            raise ValueError(f"unknown MTP strategy {strategy!r}; valid names: ['frozen', {', '.join(map(repr, OBJECTIVE))}]")
        if strategy != "frozen" and head is None:
            raise ValueError(f"MTP strategy {strategy!r} needs a head to train")
        self.head, self.strategy = head, strategy
        self.grad_clip, self.depth, self.temperature = grad_clip, depth, temperature
        self.optimizer = None
        if head is not None:
            head.requires_grad_(strategy != "frozen")
        if strategy != "frozen":
            self.optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)

    @property
    def trains(self) -> bool:
        """True when `update` trains the head (it then needs the backbone's hidden states and logits)."""
        return self.optimizer is not None

    @property
    def objective(self) -> str | None:
        return OBJECTIVE.get(self.strategy)

    def update(self, backbone, hidden: torch.Tensor | None, logits: torch.Tensor | None, tokens: torch.Tensor,
               lengths: torch.Tensor, prompt_lengths: torch.Tensor) -> dict[str, float]:
        """One head step on rows `tokens` [B, L] with the backbone's hidden [B, L, d] and logits [B, L, V]
        (None when the head is frozen: nothing is read).

        Anchors are completion positions (t >= prompt length - 1) whose whole chain is inside the row."""
        if self.optimizer is None:
            return {"mtp/online_update": 0}
        B, L = tokens.shape
        if hidden.shape[:2] != (B, L) or logits.shape[:2] != (B, L):
            raise ValueError(f"hidden {tuple(hidden.shape)} and logits {tuple(logits.shape)} must start with "
                             f"tokens' [B, L]={B, L}")
        depth = self.depth
        target_logits, labels, mask = chain_targets(logits.detach().float(), tokens, depth, lengths)  # [B, L, γ, V]
        anchors = torch.arange(L, device=tokens.device)  # [L]
        mask = mask & (anchors[None, :] >= prompt_lengths.to(tokens.device)[:, None] - 1)  # [B, L]
        if not bool(mask.any()):
            return {"mtp/online_update": 0}
        self.head.train()
        draft_logits = self.head.chain(backbone, hidden.detach(), tokens, depth).float()  # [B, L, γ, V]
        loss = draft_loss(draft_logits, target_logits, objective=self.objective, labels=labels, mask=mask,
                          temperature=self.temperature)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.head.parameters(), self.grad_clip)
        self.optimizer.step()
        self.head.eval()
        with torch.no_grad():
            alpha = acceptance_alpha(draft_logits.detach(), target_logits, self.temperature)  # [B, L, γ]
            d_tv = ((1 - alpha).mean(-1) * mask).sum() / mask.sum()
        return {f"mtp/loss/{self.objective}": float(loss.detach()), "mtp/d_tv_mean": float(d_tv),
                "mtp/grad_norm": float(grad_norm), "mtp/online_update": 1}

    def state_dict(self) -> dict | None:
        return None if self.optimizer is None else self.optimizer.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if (state is None) != (self.optimizer is None):
            raise ValueError(f"checkpoint's head optimiser state does not fit MTP strategy {self.strategy!r}")
        if state is not None:
            self.optimizer.load_state_dict(state)
