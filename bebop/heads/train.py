"""Pre-RL MTP draft-head training on a frozen policy (PAPER §4): `train_mtp`, the loop the `bebop train-mtp` job runs.

Recipe, as in the paper:
* self-generated data: the policy answers task prompts at the rollout temperature through the `Engine`
  with gamma = 0 (plain sampling; agent prompts are played out against their environment), so the head
  learns the distribution it will draft for. `--data FILE` caches these sequences, so heads trained with
  different objectives see exactly the same data (a cache made with other settings is refused).
* frozen backbone: only `MTPHead.parameters()` are in the optimiser, the backbone has requires_grad off
  and runs under no_grad; its hidden states are computed once per cached batch. Logits are not cached: at a
  real vocabulary they are V/d times the hidden states (about 44 GB for the default 480 sequences at
  V = 151,936). Each step sends only the valid anchors through the LM head, in row chunks
  (`bebop.losses_from_hidden`), so no [B, T, depth, V] tensor is ever built.
* target distribution at the rollout temperature: `draft_loss(..., temperature=T)` compares q and p both
  scaled by T; "ce" uses the sampled data tokens as labels (which are samples of p at T).
* γ_train = `depth` recursive steps (default 5), teacher forced (`MTPHead.chain`); only anchors whose
  whole chain lies inside the policy-written part of a sequence are trained (not the prompt, not tool
  replies, not past the end).
* AdamW, a linear warmup over `warmup_frac` of the steps, then a constant or cosine-decaying learning rate
  (`lr_schedule`); gradient clipping.

A fresh head starts from a copy of the backbone's last decoder layer (`init_from_backbone`, a common MTP
initialisation that shortens training); fc and norms start fresh. `--init HEAD_DIR` adapts an existing
head instead, which is how the shipped heads were made (`bebop.default`): a CE base head trained until its
held-out d_TV flattens, then each loss for the same number of steps. Heads learn at different speeds by objective (docs/default-model.md has what was measured), so a comparison of
losses from an unconverged head measures convergence speed, not the losses' optimum.

Run directory (kind "train-mtp"): `train` stream {step, mtp/loss/{objective}, mtp/d_tv_mean, mtp/grad_norm, lr} with
d_tv_mean = mean over trained (anchor, step) of 1 - α, α = Σ min(p, q) at temperature T; `eval` stream
on held-out sequences {step, mtp/eval/d_tv_mean, mtp/eval/d_tv_pos/{k}, mtp/eval/accept_length_tf}
(the teacher-forced RS accept length at γ = 3: 1 + Σ_j Π_{i≤j} α_i).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from bebop import distributed
from bebop.data.prompts import vocab_limit
from bebop.data.tasks import Task, dataset_config
from bebop.data.tasks import get as get_task
from bebop.files import cache_root
from bebop.heads import checkpoint as checkpoints
from bebop.heads.config import TrainMTPConfig, learning_rate
from bebop.heads.corpus import CorpusSource, load_corpus
from bebop.heads.data import choose_draft_vocab, make_batches, split_heldout
from bebop.heads.feature_store import StoredBatches, backbone_batches
from bebop.heads.step import bf16_copy, check_init_layers, evaluate, lm_head_weight, new_head, train_step
from bebop.host_memory import release_freed_memory
from bebop.models.checkpoint import save_head
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer, check_taps
from bebop.play import stop_ids
from bebop.policy import head_meta, load_policy, policy_meta
from bebop.runlog.mirror import Mirror
from bebop.runlog.session import RunSession, default_run_dir, open_session
from bebop.runlog.setup import one_or_all, setup_keys

# How long the other ranks wait for rank 0 to generate the data set: a bound on a hung rank 0, not on the work.
GENERATION_WAIT = datetime.timedelta(hours=12)
# Steps between two hand-backs of freed memory: each makes the next step fault its pages in afresh (on SmolLM2 every
# step cost 24% more time, every 10 steps 5%), and ten steps grow the heap by little (docs/real-model.md).
RELEASE_EVERY = 10


def open_run(run_dir: str | os.PathLike | None, config: TrainMTPConfig, *, resume: bool = False,
             mirrors: Sequence[Mirror] = (), progress: bool = False) -> RunSession:
    """A train-mtp run opened in `run_dir` (None: runs/train-mtp-OBJECTIVE-TIME) through `bebop.runlog.session`: the
    directory checked, threads, device and dtype set, and with `resume` its checkpoint read and its config held
    against `config`; for `train_mtp`. `progress`: a progress bar and what the run is doing on the terminal (the
    job's; a library call is quiet)."""
    run_dir = default_run_dir("train-mtp", config.objective) if run_dir is None else run_dir
    return open_session(run_dir, config, kind="train-mtp", resume=resume, checkpoints=checkpoints.CHECKPOINTS,
                        mirrors=mirrors, progress=progress)


def train_mtp(model: Transformer, tokenizer, config: TrainMTPConfig, run: RunSession | str | os.PathLike, *,
              data: CorpusSource = CorpusSource(), out: Path | None = None) -> MTPHead:
    """Train a head on the frozen `model` in the run `run` (opened by `open_run`; a directory: a new run there,
    opened so) and save it (bf16) to `out` when given. `data`: where the corpus comes from (`CorpusSource`: its tasks
    as the job got them, the cache, batches shared with other runs; on a real model the backbone's pass is most of a
    short run's time). Under torchrun (bebop.distributed) each step's batch is split by rows over the ranks and rank
    0 alone writes."""
    check_taps(config.feature_layers, model.config.num_hidden_layers)  # refused before the corpus, not hours later
    check_init_layers(config)
    session = run if isinstance(run, RunSession) else open_run(run, config)
    model = model.float().to(session.device).eval().requires_grad_(False)
    tasks = data.tasks if data.tasks is not None else {n: get_task(n, dataset_config(config)) for n in config.tasks}
    with session.begin(_meta(config, model, session.dtype)):
        say = _teller(session)
        corpus = _corpus(model, tokenizer, tasks, data, session, say)
        head, weight, train, held = _prepare(model, tokenizer, tasks, corpus, session, say, data)
        release_freed_memory()  # what generating the corpus and the backbone's pass freed, before the steps' heap
        head.name_or_path = None if out is None else str(out)  # where this head goes (not the --init it started from)
        session.writer.update_meta(head=head_meta(head))  # its draft vocabulary is chosen by now
        trainee = Trainee.start(head.to(session.device), model, weight, config)
        if session.checkpoint is not None:
            checkpoints.restore(session.checkpoint, head, trainee.optimizer, trainee.generator)
        say(f"training the head ({len(train)} batches, {len(held)} held out)")
        _loop(trainee, (train, held), session)
        if out is not None and distributed.is_main():
            save_head(bf16_copy(head.eval(), model), out)
    return head.eval()


def _meta(config: TrainMTPConfig, model: Transformer, dtype: torch.dtype) -> dict:
    """meta.json's keys of a train-mtp run: its setup keys (docs/runs.md) and the policy it trains a head for."""
    return {**setup_keys(task=one_or_all(config.tasks), rollout=None, mtp_objective=config.objective,
                         mtp_strategy=None, gamma=config.depth, mode=None), "policy": policy_meta(model, dtype=dtype)}


def _corpus(model: Transformer, tokenizer, tasks: dict[str, Task], data: CorpusSource, session: RunSession,
            say) -> dict:
    """The corpus, read from the cache or generated by rank 0 (sampling in the run's compute dtype, as the policy's
    rollouts do), as the single process would; the other ranks receive the same, waiting for as long as generating
    takes (hours for a large data set: far past a collective's timeout)."""
    return distributed.broadcast_object(load_corpus(data.directory, model, tokenizer, session.config, tasks,
                                                    dtype=session.dtype, log=say, drafter=data.drafter)
                                        if distributed.is_main() else None, wait=GENERATION_WAIT)


def _prepare(model: Transformer, tokenizer, tasks: dict[str, Task], data: dict, session: RunSession, say,
             source: CorpusSource) -> tuple[MTPHead, torch.Tensor, StoredBatches, StoredBatches]:
    """(the head to train, with its draft vocabulary when it has one; the LM head weight it trains through; the
    training and held-out batches). `source`: the corpus's directory, where the backbone's pass over it is kept for
    later runs (`backbone_batches`), and the batches of earlier runs of this process, by what made them."""
    shared = source.batches
    config, use_bf16, checkpoint = session.config, session.dtype == torch.bfloat16, session.checkpoint
    weight = lm_head_weight(model, use_bf16, vocab_limit(tokenizer, model.config.vocab_size))  # [V, d]
    head = new_head(model, config)
    if checkpoint is not None and checkpoint.get("draft_ids") is not None:  # the resumed run's own S
        head.use_draft_vocab(checkpoint["draft_ids"])
    on_vocab = config.draft_vocab is not None or head.draft_ids is not None
    # data["key"] names the corpus and the policy that wrote it (its weights' fingerprint), and the temperature the
    # log-normalisers are taken at: with the batch settings, all that fixes the batches
    made_by = json.dumps([data["key"], config.batch_size, config.length_bucket, config.depth, use_bf16, on_vocab],
                         sort_keys=True)
    taps = head.feature_layers  # a fused head's layers, kept with the hidden states
    if shared is not None and (made_by, taps) in shared:
        batches = shared[made_by, taps]
        say("the backbone's hidden states" + (" and log-normalisers" if on_vocab else "") + ", from an earlier run")
    else:
        def make() -> Iterator[dict]:
            say("the backbone's hidden states" + (" and log-normalisers (the whole LM head, once)" if on_vocab else ""))
            return make_batches(model, data, config, use_bf16, weight if on_vocab else None, taps)

        batches = backbone_batches(source.directory, made_by, taps, make, say, session.device)
        if shared is not None:
            shared[made_by, taps] = batches
    train, held = split_heldout(batches, config.heldout_fraction)
    if on_vocab and head.draft_ids is None:
        head.use_draft_vocab(choose_draft_vocab(train, config.draft_vocab, stop_ids(tokenizer, tasks.values())))
        say(f"draft vocabulary: the {config.draft_vocab} ids with the most of the policy's probability on the "
            f"training split (its stop ids included)")
    return head, weight, train.without("mass"), held.without("mass")  # the mass only chooses S


def _teller(session: RunSession):
    """What the run is doing, to its status (the dashboard reads it) and, with a progress bar, to the terminal."""
    def say(message: str) -> None:
        session.writer.status(message=message)
        if session.progress:
            tqdm.write(f"train-mtp: {message}")
    return say


@dataclass(frozen=True)
class Trainee:
    """What the steps of a train-mtp run update and read: the head and its optimiser, the frozen policy and its LM
    head weight, and the generator that draws each step's batch."""

    head: MTPHead
    model: Transformer
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    weight: torch.Tensor

    @classmethod
    def start(cls, head: MTPHead, model: Transformer, weight: torch.Tensor, config: TrainMTPConfig) -> Trainee:
        """A fresh optimiser for `head` and a generator seeded by the config (a resumed run restores both)."""
        optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
        return cls(head, model, optimizer, torch.Generator().manual_seed(config.seed), weight)


def _loop(trainee: Trainee, batches: tuple[StoredBatches, StoredBatches], session: RunSession) -> None:
    """The steps from the session's start: each a batch drawn from the training split, held-out evaluation every
    `eval_every` steps and at the last, a checkpoint when the session says one is due."""
    (train, held), config, writer = batches, session.config, session.writer
    use_bf16, name = session.dtype == torch.bfloat16, f"mtp/loss/{config.objective}"
    t = trainee
    bar = tqdm(range(session.start, config.steps), desc=f"train-mtp {config.objective}", disable=not session.progress,
               dynamic_ncols=True)
    for step in bar:
        lr = learning_rate(config, step)
        batch = train[int(torch.randint(len(train), (1,), generator=t.generator))]
        loss, d_tv, grad_norm = train_step(t.head, t.model, batch, t.optimizer, lr, config, use_bf16, t.weight)
        del batch
        if (step + 1) % RELEASE_EVERY == 0:
            release_freed_memory()  # else the heap's holes grow with the steps (bebop.host_memory)
        writer.log("train", {"step": step, name: loss, "mtp/d_tv_mean": d_tv, "mtp/grad_norm": grad_norm, "lr": lr})
        bar.set_postfix(loss=f"{loss:.4f}", d_tv=f"{d_tv:.3f}")
        if ((step + 1) % config.eval_every == 0 or step + 1 == config.steps) and distributed.is_main():
            metrics = evaluate(t.head, t.model, held, config, use_bf16, t.weight)
            writer.log("eval", {"step": step, **metrics})
            writer.status(step=step, **metrics)
        if session.due(step):
            session.save(step, checkpoints.state(t.head, t.optimizer, t.generator, distributed.world()))


def load_frozen_policy(path: str | Path | None):
    """(model, tokenizer) from a checkpoint dir or hub id, or the shipped default when path is None, in float32 (the
    compute dtype is `TrainMTPConfig.dtype`'s)."""
    model, tokenizer, _ = load_policy(path, dtype=torch.float32)
    return model, tokenizer
