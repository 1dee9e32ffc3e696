"""Pretraining the tiny Qwen3 policy on task demonstrations (the embedded default; the job is `bebop pretrain`).

No model hub is reachable, so bebop makes its own policy: a `ModelConfig.tiny` decoder over the
character tokenizer, trained by next-token prediction on teacher demonstrations of all three tasks
(`bebop.data.batches.DemoBatches`). A fraction `error_rate` of demonstrations is wrong on purpose, so the policy
makes mistakes that RL can fix; the varied phrasing of the demonstrations gives the policy real entropy in
its reasoning. Periodic eval samples completions at T=1 on held-out prompts (`bebop.play`) and logs the reward per
task and the mean per-token entropy of the samples.

Training keeps float32 master weights under bf16 autocast where the CPU has native bf16, with one thread by
default (two threads lost to one while other processes shared the cores); the checkpoint is saved in bf16. Loss
covers prompt tokens too (`prompt_loss`): without it the policy learnt too little copying from the prompt. What these
choices measured, and the heads made next: docs/default-model.md.

Run directory (`bebop.runlog`, kind "pretrain"): `train` stream {step, loss, lr, tokens, elapsed_s},
`eval` stream {step, reward/{task}, reward/mean, entropy/mean, response_length/mean}. The policy (`out`, Hugging Face
layout + tokenizer files) is written atomically file by file at every eval. A resumable checkpoint
(`{run_dir}/checkpoint.pt`, written by the run's session every `checkpoint_every` steps and at the last) holds the
float32 weights, the optimiser, where the demonstrations' stream stands and the tokens seen, so a resumed run
(`open_run(..., resume=True)`, `bebop pretrain --resume`) continues at the next step as if it had never stopped.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import ClassVar

import torch
import torch.nn.functional as F
from tqdm import tqdm

from bebop.checks import PRECISIONS, check_choice, check_ints, check_number
from bebop.data.batches import DemoBatches
from bebop.data.tasks import TASKS, check_task_names
from bebop.data.tasks import get as get_task
from bebop.data.tokenizer import CharTokenizer
from bebop.device import check_device_name, to_device
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig
from bebop.models.checkpoint import load_pretrained, save_pretrained
from bebop.models.config import Llama3RopeScaling, ModelConfig
from bebop.models.transformer import Transformer
from bebop.play import complete
from bebop.runlog.session import Checkpoints, RunSession, default_run_dir, open_session

EVAL_SEED = 1_000_003  # held-out prompts: training draws seeds seed*1000 + chunk, far below this
CHECKPOINTS = Checkpoints("bebop-pretrain-checkpoint-v1",  # what `bebop.runlog.session` writes and reads for a run
                          ("format", "step", "model", "optimizer", "batches", "tokens", "elapsed_s", "config"))


@dataclass(frozen=True)
class PretrainConfig:
    tasks: tuple[str, ...] = ("math", "code", "agent")
    steps: int = 1800
    batch_size: int = 24
    lr: float = 3e-3
    min_lr: float = 2e-4  # cosine decay floor
    warmup: int = 30
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    error_rate: float = 0.15  # fraction of deliberately wrong demonstrations
    prompt_loss: bool = True  # train on prompt tokens too: their repeated names/numbers teach copying early
    eval_every: int = 600
    checkpoint_every: int = 100  # steps between resumable checkpoints (0 = only at the end)
    eval_prompts: int = 32  # held-out prompts per task
    eval_max_new_tokens: int = 240
    seed: int = 0
    dtype: str = "auto"  # the autocast dtype: "auto" (bf16 where the CPU has it) | "bf16" | "fp32"
    threads: int = 1  # torch threads; 1 is fastest when other processes share the cores
    device: str = "auto"  # "auto" (CUDA when present) | "cpu" | "cuda" | "cuda:N"; the shipped default: the CPU
    model: ModelConfig | None = field(default=None)  # None: ModelConfig.tiny for the tokenizer's vocab
    init: str | None = None  # a policy checkpoint to continue from (fresh optimiser and schedule)
    autocast: InitVar[str | None] = None  # the dtype's earlier name, still read (with a deprecation note)
    RENAMED: ClassVar[dict[str, str]] = {"autocast": "dtype"}  # earlier names of a saved config's keys
    # Fields a resumed run may change (`bebop.runlog.session.config_changes`); any other difference is refused.
    RESUMABLE: ClassVar[tuple[str, ...]] = ("steps", "threads", "eval_every", "checkpoint_every")

    def __post_init__(self, autocast: str | None = None) -> None:
        if autocast is not None:
            warnings.warn("PretrainConfig.autocast is now PretrainConfig.dtype", DeprecationWarning, stacklevel=3)
            object.__setattr__(self, "dtype", autocast)
        check_task_names(self.tasks)
        taught = [n for n in self.tasks if n not in TASKS]
        if taught:  # a dataset has answers but no teacher: pretraining writes demonstrations of built-ins only
            raise ValueError(f"pretrain teaches the built-in tasks {sorted(TASKS)} only (they have teachers), "
                             f"not {taught}")
        check_ints(self, ("steps", "batch_size", "eval_every", "eval_prompts", "eval_max_new_tokens", "threads"), low=1)
        check_number(self, "lr", low=0, open_low=True)
        check_number(self, "min_lr", low=0, high=self.lr, open_low=True)
        check_ints(self, ("warmup", "checkpoint_every"), low=0)
        check_number(self, "warmup", high=self.steps, open_high=True)
        check_number(self, "error_rate", low=0, high=1, open_high=True)
        check_choice(self, "dtype", PRECISIONS)
        check_device_name(self.device)
        if isinstance(self.model, dict):  # a saved config's model, read back
            rope = self.model.get("rope_scaling")
            rope = Llama3RopeScaling(**rope) if rope else None
            object.__setattr__(self, "model", ModelConfig(**{**self.model, "rope_scaling": rope}))

    @classmethod
    def tiny(cls) -> "PretrainConfig":
        model = ModelConfig.tiny(vocab_size=CharTokenizer().vocab_size, hidden_size=32, intermediate_size=64,
                                 num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=16)
        return cls(steps=4, batch_size=4, warmup=1, eval_every=2, eval_prompts=2, eval_max_new_tokens=24,
                   model=model)


def lr_at(step: int, config: PretrainConfig) -> float:
    """Linear warmup to `lr`, then cosine decay to `min_lr` at the last step."""
    if step < config.warmup:
        return config.lr * (step + 1) / config.warmup
    progress = (step - config.warmup) / max(1, config.steps - 1 - config.warmup)
    return config.min_lr + 0.5 * (config.lr - config.min_lr) * (1 + math.cos(math.pi * progress))


def lm_loss(model: Transformer, tokens: torch.Tensor, loss_mask: torch.Tensor, use_bf16: bool) -> torch.Tensor:
    """Mean next-token cross-entropy over the masked targets: tokens, loss_mask [B, T] -> scalar."""
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=use_bf16):
        logits, _ = model(tokens[:, :-1])  # [B, T-1, V]
    targets, mask = tokens[:, 1:], loss_mask[:, 1:]  # [B, T-1]
    per_token = F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none")  # [B, T-1]
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def train_step(model, optimizer, tokens, loss_mask, lr: float, config: PretrainConfig, use_bf16: bool) -> float:
    for group in optimizer.param_groups:
        group["lr"] = lr
    loss = lm_loss(model, tokens, loss_mask, use_bf16)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
    optimizer.step()
    return float(loss.detach())


@torch.no_grad()
def evaluate(model: Transformer, tokenizer: CharTokenizer, config: PretrainConfig) -> dict[str, float]:
    """Reward of T=1 samples on held-out prompts per task, and the mean per-token entropy of those samples."""
    model.eval()
    engine, out = Engine(model), {}
    entropies, lengths = [], []
    for name in config.tasks:
        task = get_task(name)
        examples = task.sample(config.eval_prompts, seed=EVAL_SEED)
        gen = GenerationConfig(max_new_tokens=config.eval_max_new_tokens, temperature=1.0, gamma=0,
                               seed=config.seed)
        completions, _ = complete(engine, tokenizer, task, examples, gen)
        rewards = task.rewards(examples, [c.text for c in completions])
        out[f"reward/{name}"] = sum(rewards) / len(rewards)
        entropies += [h for c in completions for h in c.entropy]
        lengths += [len(c.tokens) for c in completions]
    model.train()
    out["reward/mean"] = sum(out[f"reward/{n}"] for n in config.tasks) / len(config.tasks)
    out["entropy/mean"] = sum(entropies) / max(1, len(entropies))
    out["response_length/mean"] = sum(lengths) / max(1, len(lengths))
    return out


def save_policy(model: Transformer, tokenizer: CharTokenizer, out: Path) -> None:
    """bf16 copy of the policy + tokenizer files, in the Hugging Face layout."""
    copy = Transformer(model.config)
    copy.load_state_dict(model.state_dict())
    save_pretrained(copy.to(torch.bfloat16), out)
    tokenizer.save(out)


def initial_model(config: PretrainConfig, tokenizer: CharTokenizer) -> Transformer:
    """A fresh policy (config.model or ModelConfig.tiny), or the fp32 weights of `config.init`."""
    if config.init is not None:
        model, _ = load_pretrained(config.init, dtype=torch.float32)
    else:
        model = Transformer(config.model or ModelConfig.tiny(vocab_size=tokenizer.vocab_size))
    if model.config.vocab_size != tokenizer.vocab_size:
        raise ValueError(f"model vocab_size={model.config.vocab_size} != tokenizer vocab {tokenizer.vocab_size}")
    return model.train()


def open_run(run_dir: str | os.PathLike | None, config: PretrainConfig, *, resume: bool = False,
             progress: bool = False) -> RunSession:
    """A pretraining run opened in `run_dir` (None: runs/pretrain-TIME) through `bebop.runlog.session`: the
    directory checked, threads, device and dtype set, and with `resume` its checkpoint read and its config held
    against `config` (`RESUMABLE`); for `pretrain`. `progress`: a progress bar (the job's; a library call is
    quiet)."""
    run_dir = default_run_dir("pretrain") if run_dir is None else run_dir
    return open_session(run_dir, config, kind="pretrain", resume=resume, checkpoints=CHECKPOINTS, progress=progress)


def pretrain(config: PretrainConfig, run: RunSession | str | os.PathLike, out: Path | None = None) -> Transformer:
    """Train a policy from scratch in the run `run` (opened by `open_run`, which sets its threads, device and dtype
    and, resumed, read its checkpoint; a directory: a new run there, quiet); saves to `out` (if given) at every eval
    and at the end."""
    session = run if isinstance(run, RunSession) else open_run(run, config)
    torch.manual_seed(config.seed)  # parameter init only; data and sampling use their own generators
    tokenizer = CharTokenizer()
    model = initial_model(config, tokenizer).to(session.device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": rest, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95))
    batches = DemoBatches(config.tasks, tokenizer, batch_size=config.batch_size, error_rate=config.error_rate,
                          seed=config.seed, prompt_loss=config.prompt_loss)
    meta = {"num_parameters": model.num_parameters(), "bf16_autocast": session.dtype == torch.bfloat16,
            "out": None if out is None else str(Path(out).resolve())}  # where a resume saves it again
    with session.begin(meta):
        _loop(model, optimizer, batches, session, out)
    return model.eval()


def _loop(model: Transformer, optimizer: torch.optim.Optimizer, batches: DemoBatches, session: RunSession,
          out: Path | None) -> None:
    """The steps from the session's start (a resumed run's checkpoint restored first): each logged, an eval (and
    the policy saved to `out`) every `eval_every` steps and at the last, a checkpoint when the session says one is
    due."""
    config, writer, use_bf16 = session.config, session.writer, session.dtype == torch.bfloat16
    seen, elapsed = 0, 0.0
    if session.checkpoint is not None:
        state = session.checkpoint
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        batches.load_state_dict(state["batches"])
        seen, elapsed = int(state["tokens"]), float(state["elapsed_s"])
    start = time.perf_counter() - elapsed
    bar = tqdm(range(session.start, config.steps), desc="pretrain", disable=not session.progress, dynamic_ncols=True)
    for step in bar:
        tokens, loss_mask = (to_device(t, session.device) for t in next(batches))
        lr = lr_at(step, config)
        loss = train_step(model, optimizer, tokens, loss_mask, lr, config, use_bf16)
        seen += int(loss_mask.sum())
        writer.log("train", {"step": step, "loss": loss, "lr": lr, "tokens": seen,
                             "elapsed_s": time.perf_counter() - start})
        bar.set_postfix(loss=f"{loss:.3f}")
        if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
            metrics = evaluate(model, batches.tokenizer, config)
            writer.log("eval", {"step": step, **metrics})
            writer.status(step=step, **metrics)
            bar.write(f"step {step + 1}: " + ", ".join(f"{k}={v:.3f}" for k, v in metrics.items()))
            if out is not None:
                save_policy(model, batches.tokenizer, out)
        if session.due(step):
            session.save(step, {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                                "batches": batches.state_dict(), "tokens": seen,
                                "elapsed_s": time.perf_counter() - start})
