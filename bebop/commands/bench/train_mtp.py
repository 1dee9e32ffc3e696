"""`bebop bench train-mtp`: one train-mtp step at a real vocabulary: dense logits, the chunked full vocabulary, and
heads over draft vocabularies of K ids, side by side.

    bebop bench train-mtp --vocab 151936            # B = 4, T = 128, depth 5, e2e TV, Qwen3-0.6B's width
    bebop bench train-mtp --vocab 49152 --hidden-size 576 --draft-vocab 4096 8192 16384   # SmolLM2's LM head
    bebop bench train-mtp --vocab 49152 --hidden-size 576 --draft-vocab 8192 --chunk-elements 8388608 1048576

Both variants take the same AdamW step of `bebop train-mtp` on the same random-init backbone (one decoder layer
by default; the step's memory is the head's and the LM head's, not the backbone's) and the same random batch,
whose first `--prompt-len` tokens are prompt (their anchors are not trained):

    dense    the step before hidden-state caching: the batch caches the backbone's logits [B, T, V]; the head's
             [B, T, depth, V] draft logits and the aligned target logits at every anchor, masked ones included,
             go through `draft_loss` in float32; a second full pass logs d_TV
    chunked  `bebop.heads.step.train_step`: the batch caches hidden states [B, T, d] only; valid anchors
             go through the LM head in checkpointed row chunks, whose logits give the loss and the logged d_TV
             together (`bebop.losses_from_hidden.draft_loss_and_alpha_from_hidden`)
    K        the same step for a head over a draft vocabulary of K ids (`--draft-vocab`): the batch also caches each
             position's log-normaliser (one float), and only the LM head's K rows of S run in the step

With `--chunk-elements N ...` the chunked steps (whole vocabulary and each K) run once per chunk size, logit elements
per chunk (`bebop.draft_vocab.CHUNK_ELEMENTS`, the chunk train-mtp uses), each in its own process, and the
summary gives each one's time over the first size's.

Each variant runs in a fresh process (`bebop.commands.bench.worker`): the model, the batch, the head, its
optimiser state and one warm-up step on a short batch exist before the peak window opens, so the peak is what
the timed steps add. On CPU (train-mtp's device) that is the resident-set high-water mark above the baseline,
reset through /proc/self/clear_refs (ru_maxrss, but resettable after setup). The cache column is what the data
cache holds per sequence of `--seq-len` tokens (train-mtp caches every training sequence).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from bebop import draft_vocab
from bebop.commands.bench.worker import check_peak_supported, peak, reset_peak, spawn
from bebop.commands.device_args import add_device_args
from bebop.device import resolve_device, resolve_dtype
from bebop.heads.config import TrainMTPConfig
from bebop.heads.data import anchor_mask
from bebop.heads.step import lm_head_weight, new_head, train_step
from bebop.losses import OBJECTIVES, acceptance_alpha, draft_loss
from bebop.models.config import ModelConfig
from bebop.models.mtp import chain_targets
from bebop.models.transformer import Transformer

LR = 1e-4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size V")
    parser.add_argument("--batch-size", type=int, default=4, help="sequences per step B")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence T")
    parser.add_argument("--prompt-len", type=int, default=16, help="leading prompt tokens (anchors not trained)")
    parser.add_argument("--depth", type=int, default=5, help="γ_train recursive draft steps")
    parser.add_argument("--objective", default="e2e_tv", help=f"one of {', '.join(OBJECTIVES)}")
    parser.add_argument("--layers", type=int, default=1, help="backbone decoder layers")
    parser.add_argument("--hidden-size", type=int, default=None,
                        help="backbone width (default: Qwen3-0.6B's shape, d = 1024; else the tiny preset's shape)")
    parser.add_argument("--draft-vocab", type=int, nargs="*", default=[], metavar="K",
                        help="also time heads over draft vocabularies of these sizes (default: none)")
    parser.add_argument("--chunk-elements", type=int, nargs="+", default=None, metavar="N",
                        help="time the chunked steps with N logit elements per chunk, each N in its own run "
                             f"(default: train-mtp's, {draft_vocab.CHUNK_ELEMENTS})")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per variant; the median is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results here")
    add_device_args(parser, dtype_help="the compute dtype, as train-mtp's --dtype", dtype_aliases=("--autocast",))


def _check_args(args: argparse.Namespace) -> None:
    for name in ("vocab", "batch_size", "depth", "layers", "steps", "threads"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.chunk_elements is not None and min(args.chunk_elements) < 1:
        raise ValueError(f"--chunk-elements must each be >= 1, got {args.chunk_elements}")
    if args.prompt_len < 0:
        raise ValueError(f"--prompt-len must be >= 0, got {args.prompt_len}")
    if args.seq_len < args.prompt_len + args.depth + 2:
        raise ValueError(f"--seq-len {args.seq_len} leaves no anchor to train: it must be >= --prompt-len + "
                         f"--depth + 2 = {args.prompt_len + args.depth + 2}")
    if args.hidden_size is not None and (args.hidden_size < 2 or args.hidden_size % 2):
        raise ValueError(f"--hidden-size must be an even number >= 2, got {args.hidden_size}")
    if any(not 1 <= k <= args.vocab for k in args.draft_vocab):
        raise ValueError(f"--draft-vocab sizes must lie in 1..--vocab ({args.vocab}), got {args.draft_vocab}")
    if args.objective not in OBJECTIVES:
        raise ValueError(f"--objective {args.objective!r} is not one of {', '.join(OBJECTIVES)}")
    args.device = str(resolve_device(args.device))  # what the workers read
    check_peak_supported(args.device)


# ------------------------------------------------------------------------------------ worker side
def _model(spec: dict) -> Transformer:
    torch.manual_seed(0)
    if spec["hidden_size"] is None:
        config = ModelConfig.small(vocab_size=spec["vocab"], num_hidden_layers=spec["layers"])
    else:
        d = spec["hidden_size"]
        config = ModelConfig.tiny(vocab_size=spec["vocab"], hidden_size=d, intermediate_size=3 * d,
                                  num_hidden_layers=spec["layers"])
    return Transformer(config).float().to(spec["device"]).eval().requires_grad_(False)


@torch.no_grad()
def _batch(model: Transformer, spec: dict, batch: int, seq_len: int, use_bf16: bool) -> dict:
    """Random tokens; the variant's cache: hidden states, and for "dense" the logits as well."""
    gen = torch.Generator().manual_seed(seq_len)
    tokens = torch.randint(0, spec["vocab"], (batch, seq_len), generator=gen)  # [B, T]
    trainable = (torch.arange(seq_len) >= spec["prompt_len"]).expand(batch, seq_len)  # [B, T]
    mask = anchor_mask(trainable, torch.full((batch,), seq_len), spec["depth"])  # [B, T]
    tokens, mask = tokens.to(spec["device"]), mask.to(spec["device"])
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=use_bf16):
        logits, hidden = model(tokens, compute_logits=spec["variant"] == "dense")  # [B, T, V] | None, [B, T, d]
    out = {"tokens": tokens, "mask": mask, "hidden": hidden}
    if isinstance(spec["variant"], int):  # a draft vocabulary: each position's log-normaliser, cached
        weight = lm_head_weight(model, use_bf16)
        out["lse"] = draft_vocab.log_normaliser(hidden.reshape(-1, hidden.shape[-1]), weight).reshape(batch, seq_len)
    return out if logits is None else {**out, "logits": logits}


def dense_step(head, model, batch: dict, optimizer, config: TrainMTPConfig, use_bf16: bool) -> tuple[float, float]:
    """Today's step before hidden-state caching: (loss, d_TV) from [B, T, depth, V] float32 logits."""
    with torch.autocast(batch["tokens"].device.type, dtype=torch.bfloat16, enabled=use_bf16):
        draft = head.chain(model, batch["hidden"], batch["tokens"], config.depth).float()  # [B, T, depth, V]
    target, labels, _ = chain_targets(batch["logits"], batch["tokens"], config.depth)
    target = target.float()  # [B, T, depth, V]
    loss = draft_loss(draft, target, objective=config.objective, labels=labels, mask=batch["mask"],
                      temperature=config.temperature)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), config.grad_clip)
    optimizer.step()
    with torch.no_grad():
        d_tv = 1.0 - acceptance_alpha(draft.detach(), target, config.temperature)[batch["mask"]].mean()
    return float(loss.detach()), float(d_tv)


def worker(spec: dict) -> dict:
    """One variant in a fresh process: step times, peak memory above the set-up baseline, losses."""
    torch.set_num_threads(spec["threads"])
    draft_vocab.CHUNK_ELEMENTS = spec["chunk_elements"]  # the knob under test, in this worker process only
    use_bf16 = resolve_dtype(spec["dtype"], spec["device"]) == torch.bfloat16
    model = _model(spec)
    config = TrainMTPConfig(objective=spec["objective"], depth=spec["depth"])
    head = new_head(model, config).to(spec["device"])
    if isinstance(spec["variant"], int):  # which K ids make S does not change a step's cost: the first K
        head.use_draft_vocab(torch.arange(spec["variant"], device=spec["device"]))
    optimizer = torch.optim.AdamW(head.parameters(), lr=LR)
    weight = lm_head_weight(model, use_bf16)  # the chunked path's run-long cast; dense casts under autocast

    def step(batch: dict) -> tuple[float, float]:
        if spec["variant"] == "dense":
            return dense_step(head, model, batch, optimizer, config, use_bf16)
        loss, d_tv, _ = train_step(head, model, batch, optimizer, LR, config, use_bf16, weight)
        return loss, d_tv

    # Warm up on a short batch: the optimiser state and one-off allocations stay out of the peak.
    step(_batch(model, spec, 1, spec["prompt_len"] + spec["depth"] + 4, use_bf16))
    batch = _batch(model, spec, spec["batch_size"], spec["seq_len"], use_bf16)
    cache_bytes = sum(batch[k].numel() * batch[k].element_size() for k in ("hidden", "logits", "lse") if k in batch)
    baseline = reset_peak(spec["device"])
    seconds, losses = [], []
    for _ in range(spec["steps"]):
        start = time.perf_counter()
        losses.append(step(batch))
        seconds.append(time.perf_counter() - start)
    return {"variant": spec["variant"], "chunk_elements": spec["chunk_elements"], "seconds": seconds,
            "peak_bytes": peak(spec["device"]) - baseline,
            "cache_bytes_per_seq": cache_bytes / spec["batch_size"], "losses": losses,
            "anchors": int(batch["mask"].sum()), "bf16": use_bf16}


# ------------------------------------------------------------------------------------ parent side
def _print_table(rows: list[dict], args: argparse.Namespace) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"one train-mtp step ({args.objective}), V = {args.vocab}, B = {args.batch_size}, "
                        f"T = {args.seq_len}, depth {args.depth}, on {args.device} (median time; peak above setup)")
    for col in ("variant", "chunk", "s/step", "peak MiB", "cache MiB/seq", "first loss", "trained anchors"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(_name(r), "" if r["variant"] == "dense" else f"{r['chunk_elements']:,}",
                      f"{r['seconds_median']:.2f}", f"{r['peak_mib']:.0f}", f"{r['cache_bytes_per_seq'] / 2**20:.2f}",
                      f"{r['losses'][0][0]:.6f}", str(r["anchors"]))
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # logs and pipes: keep every column readable
    console.print(table)
    dense, chunked = rows[:2]
    first = [r for r in rows[1:] if r["chunk_elements"] == chunked["chunk_elements"]]  # the first chunk size's
    print(f"peak dense / chunked: {dense['peak_mib'] / max(chunked['peak_mib'], 1e-9):.1f}x; "
          f"time dense / chunked: {dense['seconds_median'] / chunked['seconds_median']:.2f}x")
    for r in first[1:]:
        print(f"time chunked full vocabulary / draft vocabulary {r['variant']}: "
              f"{chunked['seconds_median'] / r['seconds_median']:.2f}x")
    for r in rows[1 + len(first):]:
        base = next(b for b in first if b["variant"] == r["variant"])
        print(f"{_name(r)}: time at {r['chunk_elements']:,} elements per chunk / at {base['chunk_elements']:,}: "
              f"{r['seconds_median'] / base['seconds_median']:.2f}x; peak {r['peak_mib']:.0f} / {base['peak_mib']:.0f} MiB")


def _name(row: dict) -> str:
    return f"draft vocab {row['variant']}" if isinstance(row["variant"], int) else row["variant"]


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    spec = {k: getattr(args, k) for k in ("vocab", "batch_size", "seq_len", "prompt_len", "depth", "objective",
                                         "layers", "hidden_size", "steps", "dtype", "threads", "device")}
    chunks = args.chunk_elements or [draft_vocab.CHUNK_ELEMENTS]
    runs = [("dense", chunks[0])] + [(v, c) for c in chunks for v in ("chunked", *args.draft_vocab)]  # dense: no chunks
    rows = []
    for variant, chunk in runs:
        result = spawn("bebop.commands.bench.train_mtp", {**spec, "variant": variant, "chunk_elements": chunk})
        rows.append({**result, "seconds_median": statistics.median(result["seconds"]),
                     "peak_mib": result["peak_bytes"] / 2**20})
    _print_table(rows, args)
    if args.json is not None:
        args.json.write_text(json.dumps({"device": args.device, "config": spec, "results": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))))
