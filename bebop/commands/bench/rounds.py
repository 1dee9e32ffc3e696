"""Ratios of cells timed in interleaved rounds (`bebop bench engine`, `bebop bench depth`): each the median over
rounds of the ratio within a round, so drift between rounds (a shared machine's load) cancels."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping


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
