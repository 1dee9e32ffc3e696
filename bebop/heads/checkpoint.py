"""train-mtp checkpoints: `{run_dir}/checkpoint.pt` (written atomically by bebop.files, as the RL trainer's) holding
the last completed step, the head, its optimizer, the batch-sampling generator's state and the config; a resumed run
continues at step + 1 with the run log rewound to the checkpoint, so no step is repeated or skipped.

The self-generated data is not in it: it is a function of the config and the policy (or read from --data), so a
resumed run has the same batches."""

from __future__ import annotations

import os
from dataclasses import asdict

import torch

from bebop.files import load_checkpoint, save_checkpoint
from bebop.heads.config import TrainMTPConfig

FORMAT = "bebop-train-mtp-checkpoint-v1"
KEYS = ("format", "step", "head", "optimizer", "generator", "config", "world_size")
# Config fields a resumed run may change; any other difference from the checkpoint's config is refused.
RESUMABLE_CHANGES = ("steps", "threads", "eval_every", "checkpoint_every")


def save(run_dir: str | os.PathLike, step: int, head: torch.nn.Module, optimizer: torch.optim.Optimizer,
         generator: torch.Generator, config: TrainMTPConfig, world_size: int) -> None:
    # The draft vocabulary is not in the head's state_dict; it rides along (checkpoints before it had none).
    save_checkpoint(run_dir, {"step": step, "head": head.state_dict(), "optimizer": optimizer.state_dict(),
                              "generator": generator.get_state(), "config": asdict(config),
                              "world_size": world_size, "draft_ids": head.draft_ids}, format=FORMAT, keys=KEYS)


def load(run_dir: str | os.PathLike, config: TrainMTPConfig) -> dict | None:
    """The checkpoint in run_dir (None when there is none), refused when made with another config."""
    state = load_checkpoint(run_dir, format=FORMAT, keys=KEYS)
    if state is not None:
        current = asdict(config)
        saved = state["config"]
        same = lambda a, b: (list(a) if isinstance(a, tuple) else a) == (list(b) if isinstance(b, tuple) else b)  # noqa: E731
        changed = {k: (saved.get(k), v) for k, v in current.items()
                   if k not in RESUMABLE_CHANGES and not same(saved.get(k), v)}
        if changed:
            raise ValueError(f"cannot resume with a different config (checkpoint, now): {changed}")
    return state


def restore(state: dict, head: torch.nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> int:
    """Load `state` into the head, optimizer and generator; returns the step to continue at. Any number of processes
    may resume it: every step trains on the same global batch (bebop.heads.step.train_step)."""
    head.load_state_dict(state["head"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    return int(state["step"]) + 1
