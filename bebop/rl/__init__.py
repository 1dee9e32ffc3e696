"""GRPO with speculative rollouts (PAPER §5-6): the policy samples through bebop's engine (plain, TO or
RS with the MTP head), GRPO updates it, and the head stays frozen or trains online.

    from bebop.rl import RLConfig, build_trainer
    trainer = build_trainer(RLConfig.quick(method="rs"), model, tokenizer, head=head, run_dir="runs/rl-rs")
    records = trainer.run()

Modules: `config` (RLConfig), `grpo` (advantages and loss, pure functions), `entropy_control` (the loss's entropy
bonus: constant, or TRL's adaptive rule), `batch` (`Rollouts`: a task played through a rollout backend -> update
batch), `shared_prompt` (the update's shared-prompt layout), `online_mtp` (frozen | online-tv | online-ce), `resume`
(atomic checkpoints), `build` (`build_trainer`: the task, prompt format, backend, writer and checks composed, a
`Trainer` handed the parts), `trainer` (sync/async), `shadow_spec`, `shadow_score`, `shadow` (every head scored on
each step's rollouts), `shadow_report` (that stream read back: the law per head and rule, the drift), `draft_health`
(the entropy law's residual per step), `compare` (one job under several rollout settings, side by side), `synthetic`
(preview runs for the dashboard, without training), `task_sweep` (a policy's start reward on
reasoning-gym tasks by difficulty: `bebop task-sweep`).
The command is `bebop rl`.

The names are imported lazily, as in `bebop`: the dashboard and the synthetic runs read the run vocabulary from
`bebop.rl.config` without loading torch and the trainer.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    **dict.fromkeys(("RLConfig", "TASKS", "ROLLOUTS", "MTP_STRATEGIES", "MODES", "PRESETS"), "bebop.rl.config"),
    **dict.fromkeys(("group_advantages", "grpo_loss", "token_logprobs"), "bebop.rl.grpo"),
    **dict.fromkeys(("Trainer", "UpdateResult"), "bebop.rl.trainer"),
    **dict.fromkeys(("build_trainer", "prepare_run"), "bebop.rl.build"),
    "OnlineMTP": "bebop.rl.online_mtp",
    "EntropyControl": "bebop.rl.entropy_control",
    "ShadowHeads": "bebop.rl.shadow",
    **dict.fromkeys(("shadow_fits", "shadow_points", "shadow_summary"), "bebop.rl.shadow_report"),
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'bebop.rl' has no attribute {name!r}")
