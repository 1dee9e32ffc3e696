"""The shipped default's heads, swept as the claims of issue 4 need them (tests/test_shipped_heads.py,
tests/test_shipped_ranking.py): rows of `bebop.heads.evaluate.sweep` with per-prompt counts, and standard errors
resampled over whole prompts.

Acceptance comes from the engine's counters on held-out math prompts; 96 prompts give about 1.8k verify steps per (head, method). Its standard error is resampled over whole
prompts (claim_stats.jackknife_se): at T=1 about 0.9-1.2 points per rate and 1.1-1.2 per paired difference,
1.5-2x the binomial sqrt(p(1-p)/n) over draft tokens, which treats the correlated drafts of one step and the
steps of one completion as independent.
"""

from __future__ import annotations

import pytest
import torch
from claim_stats import K, jackknife_se

import bebop.heads.evaluate as evaluate
from bebop.play import Completion
from bebop.heads.evaluate import EvalMTPConfig, fit_slopes, token_records
from bebop.metrics import fit_entropy_law

SHIPPED_HEADS = ("ce", "tv", "e2e_tv")
# What issue 4 asks for and the shipped heads do NOT show yet. strict: when a retrained head makes one
# pass, the suite fails until its xfail mark is removed.
NOT_YET = "measured on the shipped heads: does not hold yet (see docs/default-model.md and the issue note)"
__all__ = ["K", "NOT_YET", "SHIPPED_HEADS", "acceptance", "claims", "difference", "load_shipped", "slope",
           "swept"]


def load_shipped():
    from bebop.default import load_default

    torch.set_num_threads(1)
    default = load_default()
    missing = [n for n in SHIPPED_HEADS if n not in default.heads]
    assert not missing, f"the shipped default lacks heads {missing}"
    return default


def _prompt_counts(completion: Completion, gamma: int) -> tuple[int, int, float, int]:
    """(accepted drafts, drafted tokens, entropy sum over reached draft positions, reached positions) of one prompt's
    completion, from its token records; every verify step reaches position 0, so it has one record there."""
    records = token_records([completion])
    steps = sum(r["pos"] == 0 for r in records)
    return (sum(r["accepted"] for r in records), gamma * steps, sum(r["entropy"] for r in records), len(records))


def swept(default, config: EvalMTPConfig) -> list[dict]:
    """`sweep`'s rows, each with "prompts": the per-prompt counts of its completions, which the standard errors
    resample. Every (temperature, head, method) answers the same prompts (a sweep with fewer prompts answers a
    prefix of them), so prompt i is one unit across rows. The claims are on acceptance: no teacher-forced d_TV."""
    counts, evaluate_one = [], evaluate.evaluate_one

    def keep_counts(*args, **kwargs):
        row, completions = evaluate_one(*args, **kwargs)
        counts.append([_prompt_counts(c, config.gamma) for c in completions])
        return row, completions

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluate, "evaluate_one", keep_counts)
        rows = evaluate.sweep(default.model, default.tokenizer, {n: default.heads[n] for n in config.heads},
                              config, progress=False)
    assert len(rows) == len(counts)
    for row, prompts in zip(rows, counts):
        assert sum(p[1] for p in prompts) == row["num_draft_tokens"], "per-prompt drafts must add up to the counters"
    return [{**row, "prompts": prompts} for row, prompts in zip(rows, counts)]


def acceptance(rows: list[dict], method: str, temperature: float = 1.0) -> dict[str, float]:
    return {r["head"]: 100 * r["acceptance_rate"] for r in rows if r["temperature"] == temperature
            and r["method"] == method}


def _row(rows: list[dict], head: str, method: str, temperature: float = 1.0) -> dict:
    (row,) = [r for r in rows if (r["head"], r["method"], r["temperature"]) == (head, method, temperature)]
    return row


def _kept(row: dict, drop: int, num: int, den: int) -> float:
    """sum(count num) / sum(count den) over the row's prompts without prompt `drop` (kept if the row has fewer)."""
    kept = [p for i, p in enumerate(row["prompts"]) if i != drop]
    return sum(p[num] for p in kept) / sum(p[den] for p in kept)


def _rate(row: dict, drop: int) -> float:
    return _kept(row, drop, 0, 1)  # accepted / drafted


def _entropy(row: dict, drop: int) -> float:
    return _kept(row, drop, 2, 3)  # mean H(p) at the reached draft positions


def difference(rows: list[dict], a: tuple[str, str], b: tuple[str, str]) -> tuple[float, float]:
    """Acceptance of (head, method) a minus b at T=1 in points, from the engine's counters, and its standard error
    over prompts (paired: both rows answered the same prompts)."""
    ra, rb = _row(rows, *a), _row(rows, *b)
    se = jackknife_se(lambda i: 100 * (_rate(ra, i) - _rate(rb, i)), len(ra["prompts"]))
    return 100 * (ra["acceptance_rate"] - rb["acceptance_rate"]), se


def slope(rows: list[dict], head: str, method: str) -> tuple[float, float]:
    """`fit_slopes`' slope of acceptance on draft entropy over the temperatures, and its standard error over
    prompts (each prompt left out of every temperature at once, so both axes' noise counts)."""
    points = [r for r in rows if (r["head"], r["method"]) == (head, method)]
    (fit,) = fit_slopes(points)

    def without(i: int) -> float:
        return fit_entropy_law([_entropy(r, i) for r in points], [_rate(r, i) for r in points],
                               n_bootstrap=0).slope

    return fit["slope"], jackknife_se(without, max(len(r["prompts"]) for r in points))


def claims(**measured: tuple[float, float]) -> str:
    return ", ".join(f"{name} {value:+.2f} (SE {se:.2f})" for name, (value, se) in measured.items())
