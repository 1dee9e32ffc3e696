"""One GRPO job run under several rollout settings and summarised side by side (`bebop bench rl`, `bebop demo`).

`run_once` runs a job to its end and returns its step records; `summarize` reduces them to what the comparison
reports: step, generation and update seconds (`bebop.speedup.STATISTIC`, the statistic the dashboard's Speed page
reads too), reward, entropy, accept length and its drift, and, with gamma="auto", the depths the engine chose.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from bebop import speedup
from bebop.metrics import derive, pool
from bebop.rl.config import RLConfig


def run_once(policy, config: RLConfig, head: str | None, run_dir: Path, progress: bool = True,
             task=None) -> list[dict]:
    """The job's step records, on `policy` (a `bebop.default.PolicyBundle`) with its head `head`; `task` is
    config.task as the caller got it (None: got here)."""
    from bebop.rl.build import build_trainer  # torch and the models: not for the CLIs' help texts

    trainer = build_trainer(config, policy.model, policy.tokenizer, head=policy.heads[head] if head else None,
                            task=task, run_dir=run_dir, name=run_dir.name)
    return trainer.run(progress=progress)


def summarize(records: list[dict]) -> dict:
    """Timings by `speedup.STATISTIC` (medians over the steady steps: neither the first nor the last), means of
    reward/entropy over every step, pooled spec rates."""
    update = [{"u": r["timing_s/update_actor"] + r["timing_s/update_mtp"]} for r in records]
    out = {
        "steps": len(records),
        "step_s": speedup.median(records, "timing_s/step"),
        "gen_s": speedup.median(records, "timing_s/gen"),
        "update_s": speedup.median(update, "u"),
        "overlap_s": speedup.median(records, "timing_s/overlap"),
        "reward_first": records[0]["critic/score/mean"],
        "reward_mean": statistics.fmean(r["critic/score/mean"] for r in records),
        "reward_last": records[-1]["critic/score/mean"],
        "groups_with_signal": statistics.fmean(r.get("critic/groups_with_signal", math.nan) for r in records),
        "entropy": statistics.fmean(r["actor/entropy"] for r in records),
        "response_length": statistics.fmean(r["response_length/mean"] for r in records),
        "tokens_per_s": speedup.median(records, "perf/throughput"),
    }
    if "spec/num_drafts" in records[0]:
        quarter = max(1, len(records) // 4)
        first, last = derive(pool(records[:quarter])), derive(pool(records[-quarter:]))
        out["accept_length"] = derive(pool(records))["spec/accept_length"]
        out["accept_length_first"] = first["spec/accept_length"]
        out["accept_length_last"] = last["spec/accept_length"]
        out["accept_length_drift"] = last["spec/accept_length"] / first["spec/accept_length"] - 1
    chosen = {int(k.rsplit("/", 1)[1]): sum(r.get(k, 0) for r in records) for k in records[0]
              if k.startswith("spec/num_gamma_chosen/")}
    if sum(chosen.values()) > 0:  # gamma="auto": the engine steps' depths
        out["gamma_mean"] = sum(g * n for g, n in chosen.items()) / sum(chosen.values())
        out["gamma_mode"] = max(chosen, key=chosen.get)
    rows = {int(k.rsplit("/", 1)[1]): sum(r.get(k, 0) for r in records) for k in records[0]
            if k.startswith("spec/num_row_depth/")}
    if sum(rows.values()) > 0:  # gamma="rows": the depths of the rows' steps, and the share that decoded plainly
        out["row_depth_mean"] = sum(d * n for d, n in rows.items()) / sum(rows.values())
        out["row_plain_share"] = rows.get(0, 0) / sum(rows.values())
    return out
