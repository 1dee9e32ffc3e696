"""train-mtp checkpoints: `{run_dir}/checkpoint.pt` (written atomically by the run's session, `bebop.runlog.session`,
as the RL trainer's) holding the last completed step, the head, its optimizer, the batch-sampling generator's state
and the config; a resumed run continues at step + 1 with the run log rewound to the checkpoint, so no step is
repeated or skipped. Which config fields a resume may change: `TrainMTPConfig.RESUMABLE`.

The self-generated data is not in it: it is a function of the config and the policy (or read from --data), so a
resumed run has the same batches."""

from __future__ import annotations

import torch

from bebop.runlog.session import Checkpoints

FORMAT = "bebop-train-mtp-checkpoint-v1"
KEYS = ("format", "step", "head", "optimizer", "generator", "config", "world_size")
CHECKPOINTS = Checkpoints(FORMAT, KEYS)


def state(head: torch.nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator,
          world_size: int) -> dict:
    """What a checkpoint holds besides its step and config (`RunSession.save` adds both)."""
    # The draft vocabulary is not in the head's state_dict; it rides along (checkpoints before it had none).
    return {"head": head.state_dict(), "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
            "world_size": world_size, "draft_ids": head.draft_ids}


def restore(state: dict, head: torch.nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator) -> int:
    """Load `state` into the head, optimizer and generator; returns the step to continue at. Any number of processes
    may resume it: every step trains on the same global batch (bebop.heads.step.train_step)."""
    head.load_state_dict(state["head"])
    optimizer.load_state_dict(state["optimizer"])
    generator.set_state(state["generator"])
    return int(state["step"]) + 1
