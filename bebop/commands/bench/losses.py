"""`bebop bench losses`: the vocabulary-tiled TV against plain autograd, side by side.

Every variant computes overlap = Σ_v min(p_v, q_v) (= 1 - d_TV) for N positions over a V-token
vocabulary, forward and backward, on the same logits: hidden states [N, d] times an LM head [V, d].

    plain   softmax -> 0.5·Σ|p - q| through autograd on [N, V] logits: keeps several [N, V] float32
            tensors alive
    tiled   bebop.tv_tiled on [N, V] logits: two streaming passes, backward recomputes q and p per tile
    hidden  bebop.losses.acceptance_alpha_from_hidden on the hidden states and the LM head: the logits
            are made and dropped a chunk of rows at a time, and the gradient is [N, d], not [N, V]. Its
            time includes the LM head's matmuls (forward, the backward's recompute, and the gradient),
            which plain and tiled receive done, so compare its time with `bench train-mtp`'s steps

Each variant runs in a fresh Python process (`bebop.commands.bench.worker`: peak above a baseline taken
once the inputs exist, CUDA's allocator peak or the CPU's resident-set high-water mark). The plain and
tiled peaks include the [N, V] gradient that any loss on logits must return. On CPU the RSS also holds what the C allocator
keeps resident after a free, so it bounds the live tensors from above (for the tiled variant at
V = 32768, N = 2048 about 450 MiB, against 310 MiB, i.e. gradient + a few blocks, when
MALLOC_MMAP_THRESHOLD_=65536 makes every large block go back to the kernel). Each worker also saves its value and the gradient
of a few rows (taken back to the hidden states through the LM head for the logit variants), and the
parent prints how far each variant is from plain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from bebop.commands.bench.worker import check_peak_supported, peak, reset_peak, spawn
from bebop.commands.device_args import add_device_args, device_and_dtype
from bebop.losses import tv_distance
from bebop.losses_from_hidden import acceptance_alpha_from_hidden
from bebop.sampling import probs_from_logits
from bebop.tv_tiled import tv_overlap_tiled

VARIANTS = ("plain", "tiled", "hidden")
SAMPLE_ROWS = 8  # rows whose full gradient each worker hands back for the agreement check


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vocab", type=int, nargs="+", default=[32768, 151936], help="vocabulary sizes V")
    parser.add_argument("--positions", type=int, default=512,
                        help="rows N (anchor x step positions); memory and time grow with N x V, the ratios between "
                             "the variants hardly do (default: %(default)s, so `make bench` takes minutes on 2 cores)")
    parser.add_argument("--hidden-size", type=int, default=1024, help="width d of the hidden states behind the logits")
    parser.add_argument("--tile", type=int, default=8192, help="vocabulary columns per tile (tiled variant)")
    parser.add_argument("--repeats", type=int, default=3, help="timed forward+backward runs; the median is reported")
    add_device_args(parser, dtype_help="the logits' (or hidden states') dtype", dtype_default="fp32")
    parser.add_argument("--temperature", type=float, default=1.0, help="applied to both logits")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results here")


def _check_args(args: argparse.Namespace) -> None:
    for name in ("positions", "hidden_size", "tile", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if any(v < 1 for v in args.vocab):
        raise ValueError(f"--vocab sizes must be >= 1, got {args.vocab}")
    if not args.temperature > 0:
        raise ValueError(f"--temperature must be > 0, got {args.temperature}")
    device, dtype = device_and_dtype(args)
    args.device, args.dtype = str(device), str(dtype).removeprefix("torch.")  # what the workers and records read
    check_peak_supported(args.device)


# ------------------------------------------------------------------------------------ worker side

def _inputs(spec: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(draft, target, lm_head): the variant's inputs, hidden states [N, d] for "hidden", else logits [N, V]."""
    gen = torch.Generator(device=spec["device"]).manual_seed(0)
    rows, dim, device = spec["positions"], spec["hidden_size"], spec["device"]
    # Logits of standard deviation about 3, the draft's off the target's by about 1, as trained heads are.
    weight = torch.randn(spec["vocab"], dim, generator=gen, device=device).mul_(3.0 / dim**0.5)  # [V, d]
    target = torch.randn(rows, dim, generator=gen, device=device)  # [N, d]
    draft = torch.randn(rows, dim, generator=gen, device=device).mul_(1.0 / 3.0).add_(target)  # [N, d]
    dtype = getattr(torch, spec["dtype"])
    if spec["variant"] != "hidden":
        draft, target = draft @ weight.T, target @ weight.T  # [N, V]
    return draft.to(dtype).requires_grad_(True), target.to(dtype), weight.to(dtype)


def _overlap(variant: str, draft: torch.Tensor, target: torch.Tensor, weight: torch.Tensor,
             spec: dict) -> torch.Tensor:
    temperature = spec["temperature"]
    if variant == "hidden":  # rows as [1, N, 1, d]: one "anchor" per row, one step
        alpha = acceptance_alpha_from_hidden(draft[None, :, None], target[None, :, None], weight,
                                             temperature=temperature)  # [N, 1]
        return alpha[:, 0]
    if variant == "tiled":
        return tv_overlap_tiled(draft, target, temperature, spec["tile"])
    p = probs_from_logits(target.detach(), temperature)  # [N, V]
    q = probs_from_logits(draft, temperature)  # [N, V]
    return 1.0 - tv_distance(p, q)  # [N]


def worker(spec: dict) -> dict:
    """One variant, one vocabulary, fresh process: times, peak memory, and samples for the check."""
    device = spec["device"]
    draft, target, weight = _inputs(spec)
    # Warm up on a few rows: lazy one-off allocations (kernels, thread pools) stay out of the peak.
    _overlap(spec["variant"], draft[:SAMPLE_ROWS], target[:SAMPLE_ROWS], weight, spec).sum().backward()
    draft.grad = None
    baseline = reset_peak(device)
    seconds = []
    for _ in range(spec["repeats"]):
        draft.grad = None  # each repeat allocates its own gradient, as a training step would
        start = time.perf_counter()
        value = _overlap(spec["variant"], draft, target, weight, spec)  # [N]
        value.sum().backward()
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        seconds.append(time.perf_counter() - start)
    peak_bytes = peak(device) - baseline
    rows = torch.linspace(0, spec["positions"] - 1, SAMPLE_ROWS).long().unique()
    grad = draft.grad[rows].float()  # [n, d] or [n, V]
    if spec["variant"] != "hidden":
        grad = grad @ weight.float()  # chain rule to the hidden states: [n, d]
    torch.save({"value": value.detach().cpu(), "grad": grad.cpu()}, spec["sample_path"])
    return {"seconds": seconds, "peak_bytes": peak_bytes}


# ------------------------------------------------------------------------------------ parent side

def _measure(args: argparse.Namespace, vocab: int, scratch: Path, bar) -> dict:
    row = {"vocab": vocab, "positions": args.positions, "tile": args.tile, "dtype": args.dtype}
    samples = {}
    for variant in VARIANTS:
        bar.set_postfix_str(f"V={vocab} {variant}: {args.repeats} timed forward+backward in a fresh process",
                            refresh=True)
        spec = {
            "variant": variant, "vocab": vocab, "positions": args.positions, "hidden_size": args.hidden_size,
            "tile": args.tile,
            "repeats": args.repeats, "device": args.device, "dtype": args.dtype,
            "temperature": args.temperature, "sample_path": str(scratch / f"{variant}-{vocab}.pt"),
        }
        result = spawn("bebop.commands.bench.losses", spec)
        row[f"{variant}_s"] = statistics.median(result["seconds"])
        row[f"{variant}_peak_mib"] = result["peak_bytes"] / 2**20
        samples[variant] = torch.load(spec["sample_path"])
        bar.update()
    for variant in VARIANTS[1:]:
        row[f"max_abs_diff_value_{variant}"] = (samples["plain"]["value"] - samples[variant]["value"]).abs().max().item()
        row[f"max_abs_diff_grad_{variant}"] = (samples["plain"]["grad"] - samples[variant]["grad"]).abs().max().item()
    row["max_abs_grad"] = samples["plain"]["grad"].abs().max().item()
    row["logits_mib"] = args.positions * vocab * 4 / 2**20  # one [N, V] float32 tensor, for scale
    return row


def _print_table(rows: list[dict], device: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"full-vocabulary TV, forward + backward on {device} (median time; peak above inputs)")
    for col in ("V", "N", "variant", "s", "time / plain", "peak MiB", "plain / peak", "[N,V] fp32 MiB",
                "max|Δ value|", "max|Δ grad_h|"):
        table.add_column(col, justify="right")
    for r in rows:
        for variant in VARIANTS:
            seconds, mib = r[f"{variant}_s"], r[f"{variant}_peak_mib"]
            diffs = ("", "") if variant == "plain" else (f"{r[f'max_abs_diff_value_{variant}']:.1e}",
                                                         f"{r[f'max_abs_diff_grad_{variant}']:.1e}")
            table.add_row(str(r["vocab"]), str(r["positions"]), variant, f"{seconds:.3f}",
                          f"{seconds / r['plain_s']:.2f}x", f"{mib:.0f}", f"{r['plain_peak_mib'] / max(mib, 1e-9):.1f}x",
                          f"{r['logits_mib']:.0f}", *diffs)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # logs and pipes: keep every column readable
    console.print(table)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    _check_args(args)
    with tempfile.TemporaryDirectory(prefix="bebop-bench-losses-") as scratch, \
            tqdm(total=len(args.vocab) * len(VARIANTS), desc="bench losses", unit="cell", leave=False) as bar:
        rows = [_measure(args, vocab, Path(scratch), bar) for vocab in args.vocab]
    _print_table(rows, args.device)
    if args.json is not None:
        args.json.write_text(json.dumps({"device": args.device, "results": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))))
