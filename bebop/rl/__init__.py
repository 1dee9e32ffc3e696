"""GRPO with speculative rollouts (PAPER §5-6): the policy samples through bebop's engine (plain, TO or
RS with the MTP head), GRPO updates it, and the head stays frozen or trains online.

    from bebop.rl import RLConfig, Trainer
    trainer = Trainer(RLConfig.quick(rollout="rs"), model, tokenizer, head=head, run_dir="runs/rl-rs")
    records = trainer.run()

Modules: `config` (RLConfig), `grpo` (advantages and loss, pure functions), `rollouts` (prompts -> batch),
`online_mtp` (frozen | online-tv | online-ce), `checkpoint` (atomic checkpoints), `loop` (sync/async
trainer), `cli` (`bebop rl`).
"""

from bebop.rl.config import MODES, MTP_STRATEGIES, PRESETS, ROLLOUTS, TASKS, RLConfig
from bebop.rl.grpo import group_advantages, grpo_loss, token_logprobs
from bebop.rl.loop import Trainer
from bebop.rl.online_mtp import OnlineMTP

__all__ = ["RLConfig", "Trainer", "OnlineMTP", "group_advantages", "grpo_loss", "token_logprobs",
           "TASKS", "ROLLOUTS", "MTP_STRATEGIES", "MODES", "PRESETS"]
