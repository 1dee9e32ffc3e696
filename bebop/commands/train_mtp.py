"""`bebop train-mtp`: pre-RL MTP draft-head training on a frozen policy (PAPER §4).

    bebop train-mtp --policy bebop/assets/default --objective e2e_tv --depth 5 --temperature 1.0 \\
        --out bebop/assets/default/heads/e2e_tv --data runs/mtp-data.pt

Recipe, as in the paper:
* self-generated data: the policy answers task prompts at the rollout temperature through the `Engine`
  with gamma = 0 (plain sampling; agent prompts are played out against their environment), so the head
  learns the distribution it will draft for. `--data FILE` caches these sequences, so heads trained with
  different objectives see exactly the same data (a cache made with other settings is refused).
* frozen backbone: only `MTPHead.parameters()` are in the optimiser, the backbone has requires_grad off
  and runs under no_grad; its hidden states are computed once per cached batch. Logits are not cached: at a
  real vocabulary they are V/d times the hidden states (about 44 GB for the default 480 sequences at
  V = 151,936). Each step sends only the valid anchors through the LM head, in row chunks
  (`bebop.losses.draft_loss_from_hidden`), so no [B, T, depth, V] tensor is ever built.
* target distribution at the rollout temperature: `draft_loss(..., temperature=T)` compares q and p both
  scaled by T; "ce" uses the sampled data tokens as labels (which are samples of p at T).
* γ_train = `depth` recursive steps (default 5), teacher forced (`MTPHead.chain`); only anchors whose
  whole chain lies inside the policy-written part of a sequence are trained (not the prompt, not tool
  replies, not past the end).
* AdamW, constant learning rate after a linear warmup over `warmup_frac` of the steps; gradient clipping.

A fresh head starts from a copy of the backbone's last decoder layer (`init_from_backbone`, a common MTP
initialisation that shortens training); fc and norms start fresh. `--init HEAD_DIR` adapts an existing
head instead, which is how the shipped heads were made (`bebop.default`): a CE base head trained until its
held-out d_TV flattens, then each loss for the same number of steps. Measured on the default policy: from
a fresh head, TV and e2e TV learn several times slower than CE (their gradient is bounded by q, which
starts far from p); adapting a half-trained CE head (held-out d_TV 0.32) for 500 steps, e2e TV ended behind
per-step TV at every draft position, step 1 included, while from a converged one (0.10) it ends ahead at
steps 1-3 and behind at steps 4-5, as its weights (~35% on step 1, ~6% on step 5) say. A comparison of
losses from an unconverged head measures convergence speed, not the losses' optimum.

Run directory (kind "train-mtp"): `train` stream {step, mtp/loss/{objective}, mtp/d_tv_mean, mtp/grad_norm, lr} with
d_tv_mean = mean over trained (anchor, step) of 1 - α, α = Σ min(p, q) at temperature T; `eval` stream
on held-out sequences {step, mtp/eval/d_tv_mean, mtp/eval/d_tv_pos/{k}, mtp/eval/accept_length_tf}
(the teacher-forced RS accept length at γ = 3: 1 + Σ_j Π_{i≤j} α_i).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from bebop.commands import policy
from bebop.commands.prompt_args import add_prompt_args, prompt_fields
from bebop.data.batches import pad
from bebop.data.completions import complete
from bebop.data.prompt_options import PromptOptions, check_prompt_fields
from bebop.data.prompting import dataset_config, job_prompt_format, prompt_ids, vocab_limit
from bebop.data.tasks import parse_tasks, task_for
from bebop.device import resolve_dtype
from bebop.engine import Engine
from bebop.engine.rollout import GenerationConfig
from bebop.losses import OBJECTIVES, acceptance_alpha_from_hidden, draft_loss_from_hidden, expected_accepted
from bebop.models.checkpoint import load_head, save_head
from bebop.models.mtp import MTPHead, chain_targets
from bebop.models.transformer import Transformer
from bebop.runlog import RunWriter
from bebop.runlog.mirror import Mirror, add_mirror_arguments, mirrors_from_args

DATA_SEED = 2_000_003  # prompts for self-generated data: disjoint from pretraining's and eval's seeds
EVAL_GAMMA = 3


@dataclass(frozen=True)
class TrainMTPConfig(PromptOptions):  # + prompt_key, answer_key, chat_template, system_prompt
    objective: str = "e2e_tv"
    depth: int = 5
    temperature: float = 1.0
    tasks: tuple[str, ...] = ("math", "code", "agent")
    num_sequences: int = 480  # self-generated sequences (per run, all tasks together)
    max_new_tokens: int = 240
    heldout_fraction: float = 0.1
    steps: int = 250
    batch_size: int = 16
    lr: float = 1e-3
    warmup_frac: float = 0.03
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 50
    init_from_backbone: bool = True
    init_head: str | None = None  # a head directory (save_head) to adapt instead of starting fresh
    seed: int = 0
    autocast: str = "auto"
    threads: int = 1

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; valid objectives: {', '.join(OBJECTIVES)}")
        check_prompt_fields(self)
        parse_tasks(self.tasks, dataset_config(self))
        for name in ("depth", "num_sequences", "max_new_tokens", "steps", "batch_size", "eval_every", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"TrainMTPConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if not (isinstance(self.temperature, (int, float)) and 0 < self.temperature < math.inf):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if not 0 < self.heldout_fraction < 1 or not 0 <= self.warmup_frac < 1:
            raise ValueError("heldout_fraction must be in (0, 1) and warmup_frac in [0, 1)")
        if not self.lr > 0 or not self.grad_clip > 0:
            raise ValueError(f"lr and grad_clip must be > 0, got lr={self.lr}, grad_clip={self.grad_clip}")
        if self.autocast not in ("auto", "bf16", "fp32"):
            raise ValueError(f"autocast must be 'auto', 'bf16' or 'fp32', got {self.autocast!r}")

    @classmethod
    def tiny(cls, objective: str = "e2e_tv") -> TrainMTPConfig:
        return cls(objective=objective, depth=3, tasks=("math",), num_sequences=8, max_new_tokens=24, steps=4,
                   batch_size=4, eval_every=2, heldout_fraction=0.25)

    def data_key(self) -> dict:
        """The settings that fix the self-generated data (a --data cache must match them and the policy)."""
        names = ("temperature", "tasks", "num_sequences", "max_new_tokens", "seed", "prompt_key", "answer_key",
                 "chat_template", "system_prompt")
        return {k: getattr(self, k) for k in names}


def fingerprint(model: Transformer) -> str:
    """A short hash of the policy's weights: a data cache is only valid for the policy that sampled it."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


# ------------------------------------------------------------------------------------------------ data
def generate_data(model: Transformer, tokenizer, config: TrainMTPConfig) -> dict:
    """Policy samples at the rollout temperature: {"tokens": [[int]], "trainable": [[bool]], "key": {...}}.

    trainable[i][j] is True where token j was written by the policy (not prompt, not tool replies)."""
    engine, seqs, trainable = Engine(model), [], []
    fmt = job_prompt_format(config, tokenizer)
    per_task = -(-config.num_sequences // len(config.tasks))
    for t, name in enumerate(config.tasks):
        task = task_for(name, dataset_config(config))
        examples = task.sample(per_task, seed=DATA_SEED + config.seed)
        gen = GenerationConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature, gamma=0,
                               seed=config.seed * 31 + t)
        for start in range(0, len(examples), 64):  # chunks keep the engine's padded batch small
            chunk = examples[start : start + 64]
            completions, _ = complete(engine, tokenizer, task, chunk, gen, prompt_format=fmt)
            for prompt, c in zip(prompt_ids(tokenizer, chunk, fmt), completions):
                seqs.append(prompt + c.tokens)
                trainable.append([False] * len(prompt) + c.policy)
    order = torch.randperm(len(seqs), generator=torch.Generator().manual_seed(config.seed)).tolist()
    order = order[: config.num_sequences]
    key = {**config.data_key(), "policy": fingerprint(model)}
    return {"tokens": [seqs[i] for i in order], "trainable": [trainable[i] for i in order], "key": key}


def load_or_generate(path: Path | None, model: Transformer, tokenizer, config: TrainMTPConfig) -> dict:
    if path is not None and path.is_file():
        data = torch.load(path, weights_only=False)
        want = {**config.data_key(), "policy": fingerprint(model)}
        if data.get("key") != want:
            raise ValueError(f"--data {path} was generated with {data.get('key')}, not {want} (settings and "
                             "policy fingerprint): pass another path, or the policy and settings that made it")
        return data
    data = generate_data(model, tokenizer, config)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save(data, tmp)
        tmp.replace(path)
    return data


def anchor_mask(trainable: torch.Tensor, lengths: torch.Tensor, depth: int) -> torch.Tensor:
    """[B, T] bool: anchors t whose chain inputs and targets t+1..t+depth+1 are all policy-written."""
    _, T = trainable.shape
    padded = torch.nn.functional.pad(trainable, (0, depth + 2), value=False)  # [B, T + depth + 2]
    window = padded.unfold(1, depth + 1, 1)[:, 1 : T + 1]  # [B, T, depth+1]: positions t+1..t+depth+1
    inside = torch.arange(T)[None, :] + depth + 1 < lengths[:, None]  # [B, T]
    return window.all(-1) & inside


@torch.no_grad()
def make_batches(model: Transformer, data: dict, config: TrainMTPConfig, use_bf16: bool) -> list[dict]:
    """Fixed batches (sorted by length) with the frozen backbone's hidden states [B, T, d] precomputed."""
    order = sorted(range(len(data["tokens"])), key=lambda i: len(data["tokens"][i]))
    batches = []
    for start in range(0, len(order), config.batch_size):
        idx = order[start : start + config.batch_size]
        tokens, lengths = pad([data["tokens"][i] for i in idx], 0)
        trainable, _ = pad([[int(m) for m in data["trainable"][i]] for i in idx], 0)
        mask = anchor_mask(trainable.bool(), lengths, config.depth)
        if not bool(mask.any()):
            continue
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
            _, hidden = model(tokens, compute_logits=False)  # [B, T, d]
        batches.append({"tokens": tokens, "mask": mask, "hidden": hidden})
    return batches


def split_heldout(batches: list[dict], fraction: float) -> tuple[list[dict], list[dict]]:
    """Every k-th batch is held out (batches are sorted by length, so both sides span all lengths)."""
    if len(batches) < 2:
        raise ValueError(f"need at least 2 batches of self-generated data to hold one out, got {len(batches)}")
    every = min(len(batches), max(2, round(1 / fraction)))
    held = [i for i in range(len(batches)) if i % every == every - 1]
    return [b for i, b in enumerate(batches) if i not in held], [batches[i] for i in held]


# ------------------------------------------------------------------------------------------------ step
def lm_head_weight(model: Transformer, use_bf16: bool, rows: int | None = None) -> torch.Tensor:
    """The frozen LM head [V, d] in the compute dtype, cast once per run (under autocast every matmul would
    cast the [V, d] weight again). `rows` keeps the tokenizer's ids only: padding rows are never sampled
    (`bebop.data.prompting.vocab_limit`), so target and draft are the distributions over the rest."""
    return model.lm_head.weight.detach()[:rows].to(torch.bfloat16 if use_bf16 else torch.float32)


def chain_outputs(head: MTPHead, model: Transformer, batch: dict, depth: int, use_bf16: bool):
    """(draft_hidden [B, T, depth, d], target_hidden [B, T, depth, d], labels [B, T, depth], mask [B, T])."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
        draft = head.chain_hidden(model, batch["hidden"], batch["tokens"], depth)
    # chain_targets aligns any per-position tensor: here the backbone hidden states behind the target logits.
    target, labels, _ = chain_targets(batch["hidden"], batch["tokens"], depth)
    return draft, target, labels, batch["mask"]


def train_step(head, model, batch, optimizer, lr: float, config: TrainMTPConfig, use_bf16: bool,
               weight: torch.Tensor) -> tuple[float, float, float]:
    """One AdamW step of the draft loss through the LM head `weight` [V, d] (`lm_head_weight`); returns (loss,
    mean d_TV over the trained (anchor, step), the gradient norm before clipping)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    draft, target, labels, mask = chain_outputs(head, model, batch, config.depth, use_bf16)
    loss = draft_loss_from_hidden(draft, target, weight, objective=config.objective, labels=labels, mask=mask,
                                  temperature=config.temperature)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(head.parameters(), config.grad_clip)  # before clipping
    optimizer.step()
    with torch.no_grad():
        alpha = acceptance_alpha_from_hidden(draft.detach(), target, weight, mask=mask,
                                             temperature=config.temperature)  # [M, depth]
    return float(loss.detach()), float(1.0 - alpha.mean()), float(grad_norm)


@torch.no_grad()
def evaluate(head, model, batches: list[dict], config: TrainMTPConfig, use_bf16: bool,
             weight: torch.Tensor) -> dict[str, float]:
    """Held-out d_TV per draft step and the teacher-forced RS accept length at γ = 3."""
    alphas = []
    for batch in batches:
        draft, target, _, mask = chain_outputs(head, model, batch, config.depth, use_bf16)
        alphas.append(acceptance_alpha_from_hidden(draft, target, weight, mask=mask,
                                                   temperature=config.temperature))  # [M, depth]
    alpha = torch.cat(alphas)  # [N, depth]
    out = {"mtp/eval/d_tv_mean": float(1 - alpha.mean())}
    out.update({f"mtp/eval/d_tv_pos/{k}": float(1 - alpha[:, k].mean()) for k in range(config.depth)})
    gamma = min(EVAL_GAMMA, config.depth)
    out["mtp/eval/accept_length_tf"] = float(1 + expected_accepted(alpha[:, :gamma]).mean())
    return out


def new_head(model: Transformer, config: TrainMTPConfig) -> MTPHead:
    """The head to train: a copy of `init_head` (adaptation), else fresh (layer copied from the backbone)."""
    if config.init_head is not None:
        head = load_head(config.init_head, model.config, dtype=torch.float32)
        head.trained_depth, head.objective = config.depth, config.objective
        return head.train()
    torch.manual_seed(config.seed)  # the head's initialisation only
    head = MTPHead(model.config, trained_depth=config.depth, objective=config.objective)
    if config.init_from_backbone:
        head.layers[0].load_state_dict(model.model.layers[-1].state_dict())
    return head.float().train()


def train_mtp(model: Transformer, tokenizer, config: TrainMTPConfig, run_dir: Path, *, data_path: Path | None = None,
              out: Path | None = None, progress: bool = True, mirrors: Sequence[Mirror] = ()) -> MTPHead:
    """Train a head on the frozen `model`; logs to `run_dir`; saves (bf16) to `out` when given."""
    torch.set_num_threads(config.threads)
    use_bf16 = resolve_dtype(None if config.autocast == "auto" else config.autocast, "cpu") == torch.bfloat16
    model = model.float().eval().requires_grad_(False)
    tasks = config.tasks[0] if len(config.tasks) == 1 else list(config.tasks)
    writer = RunWriter(run_dir, config, kind="train-mtp", mirrors=mirrors,  # setup keys: docs/runs.md
                       meta_extra={"task": tasks, "rollout": None, "mtp_objective": config.objective,
                                   "mtp_strategy": None, "gamma": config.depth, "mode": None})
    with writer:
        writer.status(message="generating self-generated data")
        data = load_or_generate(data_path, model, tokenizer, config)
        batches = make_batches(model, data, config, use_bf16)
        train, held = split_heldout(batches, config.heldout_fraction)
        rows = vocab_limit(tokenizer, model.config.vocab_size)
        head, weight = new_head(model, config), lm_head_weight(model, use_bf16, rows)
        optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        generator = torch.Generator().manual_seed(config.seed)
        warmup = max(1, round(config.warmup_frac * config.steps))
        writer.status(message=f"training the head ({len(train)} batches, {len(held)} held out)")
        name = f"mtp/loss/{config.objective}"
        bar = tqdm(range(config.steps), desc=f"train-mtp {config.objective}", disable=not progress, dynamic_ncols=True)
        for step in bar:
            lr = config.lr * min(1.0, (step + 1) / warmup)
            batch = train[int(torch.randint(len(train), (1,), generator=generator))]
            loss, d_tv, grad_norm = train_step(head, model, batch, optimizer, lr, config, use_bf16, weight)
            writer.log("train", {"step": step, name: loss, "mtp/d_tv_mean": d_tv, "mtp/grad_norm": grad_norm, "lr": lr})
            bar.set_postfix(loss=f"{loss:.4f}", d_tv=f"{d_tv:.3f}")
            if (step + 1) % config.eval_every == 0 or step + 1 == config.steps:
                metrics = evaluate(head, model, held, config, use_bf16, weight)
                writer.log("eval", {"step": step, **metrics})
                writer.status(step=step, **metrics)
        head.eval()
        if out is not None:
            save_head(_bf16_copy(head, model), out)
    return head


def _bf16_copy(head: MTPHead, model: Transformer) -> MTPHead:
    copy = MTPHead(model.config, trained_depth=head.trained_depth, objective=head.objective)
    copy.load_state_dict(head.state_dict())
    return copy.to(torch.bfloat16)


# ------------------------------------------------------------------------------------------------ CLI
def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainMTPConfig()
    parser.add_argument("--policy", default=None, help=f"{policy.POLICY_HELP} (default: the embedded default)")
    parser.add_argument("--objective", default=d.objective, help=f"one of {', '.join(OBJECTIVES)}")
    parser.add_argument("--depth", type=int, default=d.depth, help="γ_train recursive draft steps")
    parser.add_argument("--temperature", type=float, default=d.temperature, help="rollout temperature")
    parser.add_argument("--tasks", nargs="+", default=list(d.tasks),
                        help="built-in tasks and/or datasets (jsonl:PATH, parquet:PATH, a save_to_disk directory) "
                             "the policy answers for the head's training data (default: %(default)s)")
    add_prompt_args(parser)
    parser.add_argument("--num-sequences", type=int, default=d.num_sequences)
    parser.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="per self-generated completion")
    parser.add_argument("--steps", type=int, default=d.steps)
    parser.add_argument("--batch-size", type=int, default=d.batch_size)
    parser.add_argument("--lr", type=float, default=d.lr)
    parser.add_argument("--warmup-frac", type=float, default=d.warmup_frac, help="linear warmup, fraction of steps")
    parser.add_argument("--grad-clip", type=float, default=d.grad_clip, help="max gradient norm")
    parser.add_argument("--autocast", default=d.autocast, help="auto | bf16 | fp32: the head's compute dtype")
    parser.add_argument("--eval-every", type=int, default=d.eval_every, help="held-out evaluation every N steps")
    parser.add_argument("--seed", type=int, default=d.seed)
    parser.add_argument("--threads", type=int, default=d.threads)
    parser.add_argument("--init", type=Path, default=None, help="adapt this head directory instead of a fresh head")
    parser.add_argument("--data", type=Path, default=None, help="cache file for the self-generated data")
    parser.add_argument("--out", type=Path, default=None, help="directory for the trained head (save_head)")
    parser.add_argument("--run-dir", type=Path, default=None, help="run directory (default runs/train-mtp-<time>)")
    parser.add_argument("--tiny", action="store_true", help="the tiny test preset (seconds)")
    add_mirror_arguments(parser)


def config_from_args(args: argparse.Namespace) -> TrainMTPConfig:
    if args.tiny:
        return dataclasses.replace(TrainMTPConfig.tiny(args.objective), **prompt_fields(args))
    return dataclasses.replace(
        TrainMTPConfig(objective=args.objective), depth=args.depth, temperature=args.temperature,
        tasks=tuple(args.tasks), num_sequences=args.num_sequences, max_new_tokens=args.max_new_tokens,
        steps=args.steps, batch_size=args.batch_size,
        lr=args.lr, warmup_frac=args.warmup_frac, grad_clip=args.grad_clip, autocast=args.autocast,
        eval_every=args.eval_every, seed=args.seed, threads=args.threads,
        init_head=None if args.init is None else str(args.init), **prompt_fields(args))


def load_policy(path: str | Path | None):
    """(model, tokenizer) from a checkpoint dir or hub id, or the shipped default when path is None, in float32 (the
    compute dtype is `TrainMTPConfig.autocast`'s)."""
    model, tokenizer, _ = policy.load_policy(path, dtype=torch.float32)
    return model, tokenizer


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    mirrors = mirrors_from_args(args)  # a missing tensorboard / wandb package fails here, before any work
    model, tokenizer = load_policy(args.policy)
    run_dir = args.run_dir or Path("runs") / f"train-mtp-{config.objective}-{time.strftime('%Y%m%d-%H%M%S')}"
    start = time.perf_counter()
    train_mtp(model, tokenizer, config, run_dir, data_path=args.data, out=args.out, mirrors=mirrors)
    print(f"trained {config.objective} head in {time.perf_counter() - start:.0f} s; run directory: {run_dir}"
          + (f"; head: {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    import sys

    parser = argparse.ArgumentParser(prog="bebop train-mtp", description=__doc__)
    add_arguments(parser)
    sys.exit(run(parser.parse_args()))
