"""One GRPO update on a fixed global batch, as one process or as one rank of torchrun (tests/test_distributed.py).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/dist_update.py OUT.pt [frozen|online-tv|knobs]

Every rank builds the same global batch (8 rows, 4 prompts: two with long completions, two with short ones, so under
a small micro-batch budget rank 0 runs two micro-batches and rank 1 one) and updates on its block of prompt groups;
rank 0 writes the summed loss, the gradient norm, the whole (clipped) gradients and the updated weights to OUT.pt;
with "online-tv" the MTP head's loss, gradients and updated weights too (its step on the ranks' rows). "knobs" turns
on the adaptive entropy bonus and two shadow heads (one online) and updates twice on the batch, so the second update
applies the coefficient the first one's global entropy set: its entropy stats, the controller's state, the shadow
records and the online shadow head's weights too.
"""

from __future__ import annotations

import sys
import tempfile

import torch

from bebop import distributed
from bebop.data.tasks import Example
from bebop.data.tokenizer import CharTokenizer
from bebop.engine.rollout import Rollout
from bebop.engine.stops import Stop
from bebop.models.config import ModelConfig
from bebop.models.mtp import MTPHead
from bebop.models.transformer import Transformer
from bebop.rl import RLConfig, prepare_run
from bebop.rl.batch import RolloutBatch, align
from bebop.rl.parallel import rank_block

MODEL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, max_position_embeddings=512)
CONFIG = RLConfig.tiny(method="none", mode="sync", prompts_per_step=4, group_size=2, kl_coef=0.1,
                       micro_batch_tokens=80, grad_clip=0.05)  # a clip that bites: the norm must be global
COMPLETION_LENGTHS = [30, 27, 24, 30, 3, 2, 4, 3]  # rows, group by group
KNOBS = CONFIG.replace(method="rs", entropy_coef=0.05, entropy_target=50.0, shadow_heads=("a", "online-tv:a"),
                       mtp_lr=1e-2)


class Toy:
    name = "toy"


def model_and_tokenizer() -> tuple[Transformer, MTPHead, CharTokenizer]:
    tok = CharTokenizer()
    torch.manual_seed(0)
    config = ModelConfig.tiny(vocab_size=tok.vocab_size, **MODEL)
    return Transformer(config), MTPHead(config), tok


def global_rows() -> tuple[list[list[int]], Rollout, list[float]]:
    """(prompts [8], rollout, rewards [8]) of the fixed global batch: deterministic, no sampling."""
    g = torch.Generator().manual_seed(1)
    prompts, tokens, logprobs = [], [], []
    for i, length in enumerate(COMPLETION_LENGTHS):
        if i % CONFIG.group_size == 0:
            prompt = torch.randint(3, 60, (5 + i // 2,), generator=g).tolist()
        prompts.append(prompt)
        tokens.append(torch.randint(3, 60, (length,), generator=g).tolist())
        logprobs.append((-2.0 - torch.rand(length, generator=g)).tolist())
    rollout = Rollout(tokens=tokens, logprobs=logprobs, entropy=[[0.5] * len(t) for t in tokens],
                      origin=[["plain"] * len(t) for t in tokens], finish_reason=["stop"] * len(tokens),
                      stops=[Stop()] * len(tokens))
    rewards = [1.0, 0.0, 0.3, 0.9, 0.0, 1.0, 0.5, 0.4]
    return prompts, rollout, rewards


def batch_of(rows: list[int]) -> RolloutBatch:
    prompts, rollout, rewards = global_rows()
    part = Rollout(**{k: [getattr(rollout, k)[i] for i in rows] for k in
                      ("tokens", "logprobs", "entropy", "origin", "finish_reason", "stops")})
    chosen = [prompts[i] for i in rows]
    examples = [Example(prompt="p", answer=0, level=1, task="toy") for _ in rows]
    return RolloutBatch(examples, chosen, part, ["x"] * len(rows), torch.tensor([rewards[i] for i in rows]),
                        *align(chosen, part, 0), policy_version=0, gen_time_s=0.0, gen_interval=(0.0, 0.0))


def update(run_dir: str, mtp: str = "frozen") -> dict:
    """This process's update on its block of the global batch; the whole results on every rank."""
    model, head, tok = model_and_tokenizer()
    knobs = mtp == "knobs"
    config = (CONFIG if mtp == "frozen" else KNOBS if knobs
              else CONFIG.replace(method="rs", mtp=mtp, mtp_lr=1e-2, mtp_grad_clip=0.05))
    trainer = prepare_run(config, run_dir, task=Toy()).trainer(model, tok, head=head if config.uses_head else None,
                                                               shadow_heads={"a": head} if knobs else None)
    rows = rank_block(list(range(len(COMPLETION_LENGTHS))), distributed.rank(), distributed.world())
    for _ in range(2 if knobs else 1):
        update = trainer.update(batch_of(rows))
    metrics = update.metrics
    names = [n for n, _ in trainer.policy.named_parameters()]
    params = list(trainer.policy.parameters())
    out = {"loss": float(distributed.all_reduce(metrics["actor/loss"])), "grad_norm": metrics["actor/grad_norm"],
           "grads": {n: distributed.full_tensor(p.grad).clone() for n, p in zip(names, params)},
           "params": {n: distributed.full_tensor(p.detach()).clone() for n, p in zip(names, params)}}
    if trainer.online.trains:  # replicated on every rank: plain tensors
        out["head"] = {"loss": metrics["mtp/loss/e2e_tv"], "grad_norm": metrics["mtp/grad_norm"],
                       "d_tv": metrics["mtp/d_tv_mean"],
                       "grads": {n: p.grad.clone() for n, p in trainer.head.named_parameters()},
                       "params": {n: p.detach().clone() for n, p in trainer.head.named_parameters()}}
    if knobs:
        online = {e.label: e.head for e in trainer.shadow.heads}["online-tv:a"]
        out["entropy"] = {"current": float(distributed.all_reduce(metrics["actor/entropy_current"])),
                          "applied": metrics["actor/entropy_coef"], **trainer.entropy.state_dict()}
        out["shadow"] = list(update.shadow)
        out["shadow_params"] = {n: p.detach().clone() for n, p in online.named_parameters()}
    return out


if __name__ == "__main__":
    distributed.init("cpu")
    with tempfile.TemporaryDirectory() as tmp:
        result = update(tmp, *sys.argv[2:3])
    if distributed.is_main():
        torch.save(result, sys.argv[1])
    distributed.finish()
