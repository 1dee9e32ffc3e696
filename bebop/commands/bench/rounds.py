"""Ratios of cells timed in interleaved rounds (`bebop bench engine`, `bebop bench depth`): each the median over
rounds of the ratio within a round, so drift between rounds (a shared machine's load) cancels."""

from __future__ import annotations

import statistics
from collections.abc import Mapping


def round_ratio(numerator: list[float], denominator: list[float]) -> float:
    """The median over rounds of numerator / denominator within a round: robust to drift between rounds."""
    return statistics.median(a / b for a, b in zip(numerator, denominator, strict=True))


def auto_beside_static(auto: list[float], static: Mapping[int, list[float]], chosen: Mapping[int, int]) -> dict:
    """gamma="auto"'s fields beside the static depths of the same rounds (seconds per round): the best static γ (the
    fastest at the median), its seconds over auto's, and the depths auto chose ({γ: steps}) with their mean."""
    best = min(static, key=lambda g: statistics.median(static[g]), default=None)
    return {"gamma_chosen": dict(chosen),
            "gamma_mean": sum(g * n for g, n in chosen.items()) / max(sum(chosen.values()), 1),
            "best_static_gamma": best,
            "over_best_static": None if best is None else round_ratio(static[best], auto)}
