"""`bebop bench losses`: the vocabulary-tiled TV against plain autograd, side by side.

Both variants compute overlap = Σ_v min(p_v, q_v) (= 1 - d_TV) for N positions over a V-token
vocabulary, forward and backward:

    plain   softmax -> 0.5·Σ|p - q| through autograd: keeps several [N, V] float32 tensors alive
    tiled   bebop.tv_tiled: two streaming passes, backward recomputes q and p per tile

Each variant runs in a fresh Python process (`bebop.commands.bench.worker`: peak above a baseline taken
once the inputs exist, CUDA's allocator peak or the CPU's resident-set high-water mark). Both include
the [N, V] gradient that any method must return. On CPU the RSS also holds what the C allocator
keeps resident after a free, so it bounds the live tensors from above (for the tiled variant at
V = 32768, N = 2048 about 450 MiB, against 310 MiB, i.e. gradient + a few blocks, when
MALLOC_MMAP_THRESHOLD_=65536 makes every large block go back to the kernel). Each worker also saves its value and the gradient
of a few rows, and the parent prints how far apart the two variants are.
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
from bebop.losses import tv_distance
from bebop.sampling import probs_from_logits
from bebop.tv_tiled import tv_overlap_tiled

VARIANTS = ("plain", "tiled")
SAMPLE_ROWS = 8  # rows whose full gradient each worker hands back for the agreement check


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--vocab", type=int, nargs="+", default=[32768, 151936], help="vocabulary sizes V")
    parser.add_argument("--positions", type=int, default=2048, help="rows N (anchor x step positions)")
    parser.add_argument("--tile", type=int, default=8192, help="vocabulary columns per tile (tiled variant)")
    parser.add_argument("--repeats", type=int, default=3, help="timed forward+backward runs; the median is reported")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu | cuda")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32", help="logits dtype")
    parser.add_argument("--temperature", type=float, default=1.0, help="applied to both logits")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="also write the results here")


def _check_args(args: argparse.Namespace) -> None:
    for name in ("positions", "tile", "repeats"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if any(v < 1 for v in args.vocab):
        raise ValueError(f"--vocab sizes must be >= 1, got {args.vocab}")
    if not args.temperature > 0:
        raise ValueError(f"--temperature must be > 0, got {args.temperature}")
    check_peak_supported(args.device)


# ------------------------------------------------------------------------------------ worker side

def _inputs(spec: dict) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=spec["device"]).manual_seed(0)
    shape = (spec["positions"], spec["vocab"])
    target = torch.randn(shape, generator=gen, device=spec["device"]).mul_(3.0)  # [N, V]
    draft = torch.randn(shape, generator=gen, device=spec["device"]).add_(target)  # near the target
    dtype = getattr(torch, spec["dtype"])
    return draft.to(dtype).requires_grad_(True), target.to(dtype)


def _overlap(variant: str, draft: torch.Tensor, target: torch.Tensor, spec: dict) -> torch.Tensor:
    temperature = spec["temperature"]
    if variant == "tiled":
        return tv_overlap_tiled(draft, target, temperature, spec["tile"])
    p = probs_from_logits(target.detach(), temperature)  # [N, V]
    q = probs_from_logits(draft, temperature)  # [N, V]
    return 1.0 - tv_distance(p, q)  # [N]


def worker(spec: dict) -> dict:
    """One variant, one vocabulary, fresh process: times, peak memory, and samples for the check."""
    device = spec["device"]
    draft, target = _inputs(spec)
    # Warm up on a few rows: lazy one-off allocations (kernels, thread pools) stay out of the peak.
    _overlap(spec["variant"], draft[:SAMPLE_ROWS], target[:SAMPLE_ROWS], spec).sum().backward()
    draft.grad = None
    baseline = reset_peak(device)
    seconds = []
    for _ in range(spec["repeats"]):
        draft.grad = None  # each repeat allocates its own [N, V] gradient, as a training step would
        start = time.perf_counter()
        value = _overlap(spec["variant"], draft, target, spec)  # [N]
        value.sum().backward()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    peak_bytes = peak(device) - baseline
    rows = torch.linspace(0, spec["positions"] - 1, SAMPLE_ROWS).long().unique()
    torch.save({"value": value.detach().cpu(), "grad": draft.grad[rows].float().cpu()}, spec["sample_path"])
    return {"seconds": seconds, "peak_bytes": peak_bytes}


# ------------------------------------------------------------------------------------ parent side

def _measure(args: argparse.Namespace, vocab: int, scratch: Path) -> dict:
    row = {"vocab": vocab, "positions": args.positions, "tile": args.tile, "dtype": args.dtype}
    samples = {}
    for variant in VARIANTS:
        spec = {
            "variant": variant, "vocab": vocab, "positions": args.positions, "tile": args.tile,
            "repeats": args.repeats, "device": args.device, "dtype": args.dtype,
            "temperature": args.temperature, "sample_path": str(scratch / f"{variant}-{vocab}.pt"),
        }
        result = spawn("bebop.commands.bench.losses", spec)
        row[f"{variant}_s"] = statistics.median(result["seconds"])
        row[f"{variant}_peak_mib"] = result["peak_bytes"] / 2**20
        samples[variant] = torch.load(spec["sample_path"])
    row["max_abs_diff_value"] = (samples["plain"]["value"] - samples["tiled"]["value"]).abs().max().item()
    row["max_abs_diff_grad"] = (samples["plain"]["grad"] - samples["tiled"]["grad"]).abs().max().item()
    row["max_abs_grad"] = samples["plain"]["grad"].abs().max().item()
    row["logits_mib"] = args.positions * vocab * 4 / 2**20  # one [N, V] float32 tensor, for scale
    return row


def _print_table(rows: list[dict], device: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"full-vocabulary TV, forward + backward on {device} (median time; peak above inputs)")
    for col in ("V", "N", "plain s", "tiled s", "time tiled/plain", "plain MiB", "tiled MiB",
                "mem plain/tiled", "[N,V] fp32 MiB", "max|Δ value|", "max|Δ grad|"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["vocab"]), str(r["positions"]), f"{r['plain_s']:.3f}", f"{r['tiled_s']:.3f}",
            f"{r['tiled_s'] / r['plain_s']:.2f}x", f"{r['plain_peak_mib']:.0f}", f"{r['tiled_peak_mib']:.0f}",
            f"{r['plain_peak_mib'] / max(r['tiled_peak_mib'], 1e-9):.2f}x", f"{r['logits_mib']:.0f}",
            f"{r['max_abs_diff_value']:.1e}", f"{r['max_abs_diff_grad']:.1e}",
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # logs and pipes: keep every column readable
    console.print(table)


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    with tempfile.TemporaryDirectory(prefix="bebop-bench-losses-") as scratch:
        rows = [_measure(args, vocab, Path(scratch)) for vocab in args.vocab]
    _print_table(rows, args.device)
    if args.json is not None:
        args.json.write_text(json.dumps({"device": args.device, "results": rows}, indent=2))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    print(json.dumps(worker(json.loads(sys.argv[1]))))
