"""Cells timed in interleaved rounds (`interleaved`, `bebop bench engine`) and their ratios (`bebop bench engine`,
`bebop bench depth`): each the median over rounds of the ratio within a round, so drift between rounds (a shared
machine's load) cancels."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Mapping

import torch


def round_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median over rounds of numerator / denominator within a round: robust to drift between rounds."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def round_ratio_se(numerator: list[float], denominator: list[float]) -> float:
    """The standard error of `round_ratio`: sqrt(pi / 2) x the ratios' standard deviation / sqrt(rounds), a median's
    for roughly normal ratios (nan below 2 rounds). A difference of a few of these is noise of the machine."""
    ratios = [a / b for a, b in zip(numerator, denominator, strict=True)]
    return math.sqrt(math.pi / 2) * statistics.stdev(ratios) / math.sqrt(len(ratios)) if len(ratios) > 1 else math.nan


def auto_beside_static(auto: list[float], static: Mapping[int, list[float]], chosen: Mapping[int, int]) -> dict:
    """gamma="auto"'s fields beside the static depths of the same rounds (seconds per round): the best static γ, its
    seconds over auto's with its standard error, and the depths auto chose ({γ: steps}) with their mean. The best
    static γ is the one auto fares worst against in the rounds' paired ratios (the statistic reported), not the
    fastest by median seconds: rounds differ in their prompts, so seconds taken across rounds mostly measure them."""
    ratios = {g: round_ratio(seconds, auto) for g, seconds in static.items()}
    best = min(ratios, key=ratios.get, default=None)
    return {"gamma_chosen": dict(chosen),
            "gamma_mean": sum(g * n for g, n in chosen.items()) / max(sum(chosen.values()), 1),
            "best_static_gamma": best,
            "over_best_static": None if best is None else ratios[best],
            "over_best_static_se": None if best is None else round_ratio_se(static[best], auto)}


def _finished(device: torch.device) -> None:
    """Wait for queued GPU work, so a cell's time is its work's (CUDA runs asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # named: --device cuda:N need not be the current device


def _cell_name(cell: tuple) -> str:
    """A cell's key as a progress line reads it: ("bebop", "rs", 3, True) is "bebop rs γ=3 compiled"."""
    source, what, gamma, compiled = cell
    return f"{source} {what}" + (f" γ={gamma}" if gamma else "") + (" compiled" if compiled else "")


def interleaved(cells: dict, repeats: int, device: torch.device, label: str = "") -> dict:
    """{name: (seconds per round, last result)} for each zero-argument callable in `cells`, timed in rounds of
    one run of every cell, so a slow patch of a shared machine hits all cells of a round alike. A progress bar says
    which cell runs and what for (the warm-up round compiles the compiled engine's graphs), with an estimate."""
    from tqdm import tqdm

    bar = tqdm(total=len(cells) * (repeats + 1), desc=label, unit="cell", leave=False, dynamic_ncols=True)
    results = {}
    for name, fn in cells.items():  # warm-up: allocator, oneDNN primitive caches, the compiled graphs
        bar.set_postfix_str(f"warm-up{' (compiling)' if name[-1] else ''}: {_cell_name(name)}", refresh=True)
        results[name] = fn()
        bar.update()
    times = {name: [] for name in cells}
    for round_ in range(repeats):
        for name, fn in cells.items():
            bar.set_postfix_str(f"timing round {round_ + 1}/{repeats}: {_cell_name(name)}", refresh=True)
            _finished(device)
            start = time.perf_counter()
            results[name] = fn()
            _finished(device)
            times[name].append(time.perf_counter() - start)
            bar.update()
    bar.close()
    return {name: (times[name], results[name]) for name in cells}
