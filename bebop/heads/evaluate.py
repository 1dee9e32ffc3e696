"""Speculative acceptance of MTP heads by method, temperature and task (PAPER Table 2, §3): the sweep behind
`bebop eval-mtp` and notebooks 01-03.

For every task and temperature the same held-out prompts (a task's held-out split where it has one, `heldout()`; else
prompts of a seed no corpus draws) are answered by the `Engine` with every
(head, method) at depth `--gamma` (3), and we measure, from the engine's own counters:
    acceptance rate (accepted drafts / drafted), accept length (1 + accepted / verify steps), the
    per-position conditional acceptance alpha_pos/i, and the mean target entropy at the draft positions.
Mean d_TV(p, q) is computed teacher-forced: after generation, the policy and the head run over the
generated sequences (the chain fed with the emitted tokens, `MTPHead.chain_hidden` at depth γ) and
d_TV = 1 - α at the same temperature, averaged over the policy-written anchors. It is the RS acceptance the head
would have along those sequences, whatever method drafted them. For a head over a draft vocabulary S, q is zero off
S, and the table also gives p(S) (`coverage`), the cap on its acceptance.

Every acceptance rate printed carries its counts and a 95% interval, and every difference between heads or
methods says when its own 95% interval holds 0 ("noise"): `bebop.metrics.rate_interval` and
`rate_difference_interval`, binomial over draft tokens, so the real uncertainty is larger, never smaller. The
entropy-law fit needs at least 3 distinct draft entropies (temperatures x tasks); with fewer it says so.

Run directory (kind "eval-mtp"):
    table.csv / table.json   one row per (task, temperature, head, method)
    table2.csv               Table 2 layout: RS acceptance % at the temperature nearest 1, heads x tasks
    fits.json                acceptance = a + slope·entropy per (task, head, method) over the temperatures
    tokens.jsonl             one record per reached draft position: task, temperature, head, method, pos,
                             entropy (H(p) at that position, nats), accepted (0/1): fit the entropy law
                             per token with `bebop.metrics.fit_entropy_law` from these
"""

from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from bebop.device import check_device_name
from bebop.data.batches import pad
from bebop.data.prompts import PromptOptions, check_prompt_fields, job_prompt_format, prompt_ids
from bebop.data.tasks import Task, check_task_names, dataset_config
from bebop.data.tasks import get as get_task
from bebop.engine import Engine
from bebop.engine.lookup import PromptLookup
from bebop.engine.rollout import GenerationConfig
from bebop.heads.data import anchor_mask
from bebop.draft_vocab import coverage, log_normaliser, target_logp
from bebop.losses_from_hidden import acceptance_alpha_from_hidden
from bebop.entropy_law import NEAR_UNIFORM
from bebop.metrics import derive, fit_entropy_law
from bebop.models.mtp import MTPHead, chain_targets
from bebop.models.transformer import Transformer
from bebop.play import Completion, complete
from bebop.runlog.session import RunSession
from bebop.runlog.setup import one_or_all, setup_keys
from bebop.verify import METHODS

EVAL_SEED = 3_000_017  # held-out prompts, disjoint from pretraining, train-mtp data and pretrain eval
# A sweep's temperatures are > 0, where "greedy" is not the policy's distribution (it is what both other methods
# become at T = 0): a sweep compares the rest.
SWEPT_METHODS = tuple(m for m in METHODS if m != "greedy")
MIN_FIT_POINTS = 3  # distinct draft entropies (temperatures x tasks) an entropy-law fit needs


@dataclass(frozen=True)
class EvalMTPConfig(PromptOptions):  # + prompt_key, answer_key, chat_template, system_prompt
    heads: tuple[str, ...] = ("ce", "e2e_tv")
    methods: tuple[str, ...] = ("to", "rs")
    # T = 0.5-2.0 spans 0.2-1.3 nats of this policy's entropy, a range RL runs visit and wide enough to pin a slope
    temperatures: tuple[float, ...] = (0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0)
    tasks: tuple[str, ...] = ("math",)
    gamma: int = 3
    num_prompts: int = 64
    max_new_tokens: int = 200
    teacher_forced: bool = True  # also d_TV along the generated sequences (about as long again as generating them)
    seed: int = 0
    dtype: str = "auto"
    threads: int = 1
    device: str = "auto"  # "auto" (CUDA when present) | "cpu" | "cuda" | "cuda:N"

    def __post_init__(self) -> None:
        check_prompt_fields(self)
        check_device_name(self.device)
        check_task_names(self.tasks)  # a dataset is read once, where the job builds its tasks
        if not self.heads:
            raise ValueError("heads is empty: name at least one head")
        bad = [m for m in self.methods if m not in SWEPT_METHODS]
        if bad or not self.methods:
            raise ValueError(f"unknown methods {bad or self.methods!r}; valid methods: {SWEPT_METHODS}")
        if not self.temperatures or any(not (isinstance(t, (int, float)) and 0 < t < math.inf)
                                        for t in self.temperatures):
            raise ValueError(f"temperatures must be finite numbers > 0, got {self.temperatures!r}")
        for name in ("gamma", "num_prompts", "max_new_tokens", "threads"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"EvalMTPConfig.{name} must be a positive int, got {getattr(self, name)!r}")

    @classmethod
    def tiny(cls, heads: tuple[str, ...] = ("ce", "e2e_tv")) -> "EvalMTPConfig":
        return cls(heads=heads, temperatures=(0.5, 1.0, 1.5), num_prompts=4, max_new_tokens=24, gamma=2)


# ----------------------------------------------------------------------------------------------- records
def token_records(completions: list[Completion], **fields) -> list[dict]:
    """One record per reached draft position, from the engine's origins: a run of "accepted" tokens at
    positions 0.. then a "recovered" token at the rejected position (a "bonus" means all γ passed)."""
    records = []
    for c in completions:
        pos = 0
        for origin, h in zip(c.origin, c.entropy):
            if origin == "accepted":
                records.append({**fields, "pos": pos, "entropy": h, "accepted": 1})
                pos += 1
            elif origin == "recovered":
                records.append({**fields, "pos": pos, "entropy": h, "accepted": 0})
                pos = 0
            else:
                pos = 0
    return records


@torch.no_grad()
def teacher_forced(model: Transformer, head: MTPHead, prompts: list[list[int]], completions: list[Completion],
                   gamma: int, temperature: float, batch_size: int = 32) -> tuple[list[float], float]:
    """(mean d_TV(p, q) per draft position [γ], mean p(S) at the first position's targets: the share of the target's
    probability the head's draft vocabulary holds, 1.0 without one) along the generated sequences (module docstring).
    Through hidden states and the LM head in row chunks (`bebop.losses_from_hidden`): no [B, T, V] tensor."""
    seqs = [p + c.tokens for p, c in zip(prompts, completions)]
    written = [[False] * len(p) + c.policy for p, c in zip(prompts, completions)]
    weight = model.lm_head.weight.detach()
    alphas, covered = [], []
    for start in range(0, len(seqs), batch_size):
        tokens, lengths = pad(seqs[start : start + batch_size], 0)
        trainable, _ = pad([[int(w) for w in ws] for ws in written[start : start + batch_size]], 0)
        mask = anchor_mask(trainable.bool(), lengths, gamma)  # [B, T]
        if not bool(mask.any()):
            continue
        tokens, mask = tokens.to(weight.device), mask.to(weight.device)
        _, hidden = model(tokens, compute_logits=False, taps=head.feature_layers)  # [B, T, (1 + n) d]
        draft = head.chain_hidden(model, hidden, tokens, gamma)  # [B, T, γ, d]
        target, _, _ = chain_targets(hidden[..., : model.config.hidden_size], tokens, gamma)  # [B, T, γ, d]
        alphas.append(acceptance_alpha_from_hidden(draft, target, weight, mask=mask, temperature=temperature,
                                                   draft_ids=head.draft_ids))  # [M, γ]
        if head.draft_ids is not None:
            rows = target[:, :, 0][mask]  # [M, d]
            lse = log_normaliser(rows, weight, temperature)
            covered.append(coverage(target_logp(rows, weight[head.draft_ids], lse, temperature)))
    if not alphas:
        return [math.nan] * gamma, math.nan
    share = float(torch.cat(covered).mean()) if covered else 1.0
    return (1 - torch.cat(alphas).mean(0)).tolist(), share


def evaluate_one(model, tokenizer, head: MTPHead | PromptLookup, task, examples, *, method: str, temperature: float,
                 config: EvalMTPConfig) -> tuple[dict, list[Completion]]:
    """Generate with one (head, method, temperature) and summarise acceptance, entropy and d_TV."""
    gen = GenerationConfig(max_new_tokens=config.max_new_tokens, temperature=temperature, gamma=config.gamma,
                           method=method, seed=config.seed)
    fmt = job_prompt_format(config, tokenizer)
    completions, stats = complete(Engine(model, head), tokenizer, task, examples, gen, prompt_format=fmt)
    rates = derive(stats)
    prompts = prompt_ids(tokenizer, examples, fmt)
    lookup = isinstance(head, PromptLookup)  # no q to compare with p: no teacher-forced d_TV
    dtv, share = (teacher_forced(model, head, prompts, completions, config.gamma, temperature)
                  if config.teacher_forced and not lookup else ([math.nan] * config.gamma, math.nan))
    entropies = [h for c in completions for h in c.entropy]
    row = {
        "acceptance_rate": rates["spec/acceptance_rate"],
        "accept_length": rates["spec/accept_length"],
        **{f"alpha_pos/{i}": rates[f"spec/alpha_pos/{i}"] for i in range(config.gamma)},
        "draft_entropy_mean": rates.get("spec/entropy_mean", math.nan),
        "entropy_mean": sum(entropies) / max(1, len(entropies)),
        "d_tv_mean": sum(dtv) / len(dtv),
        **{f"d_tv_pos/{i}": v for i, v in enumerate(dtv)},
        "draft_vocab": None if getattr(head, "draft_ids", None) is None else head.draft_size,  # K ids, or all
        "coverage": share,  # p(S): what any draft over S could accept at most (1 without a draft vocabulary)
        "num_draft_tokens": int(stats["spec/num_draft_tokens"]),
        "num_accepted_tokens": int(stats["spec/num_accepted_tokens"]),
        # ln V: the entropy of the uniform distribution, near which (NEAR_UNIFORM of it) the fit leaves points out
        "max_entropy": math.log(model.lm_head.weight.shape[0]),
        "reward": (sum(task.rewards(examples, [c.text for c in completions])) / len(examples)
                   if getattr(task, "verifiable", True) else math.nan),  # chat: no verifier
    }
    return row, completions


def sweep(model, tokenizer, heads: dict[str, MTPHead], config: EvalMTPConfig, run: RunSession | None = None,
          progress: bool = True, tasks: dict[str, Task] | None = None) -> list[dict]:
    """All (task, temperature, head, method) rows; with `run` (opened by `bebop.runlog.session` and begun), per-token
    records go to its `tokens` stream and each row to its status. `tasks`: config.tasks as the job got them
    (`bebop.data.tasks.get`; None: got here)."""
    rows, writer = [], None if run is None else run.writer
    tasks = tasks if tasks is not None else {n: get_task(n, dataset_config(config)) for n in config.tasks}
    # prompt lookup's q is one-hot: RS tests what TO tests, so it runs once, as TO
    cells = [(task_name, temperature, label, method) for task_name in config.tasks
             for temperature in config.temperatures for label, head in heads.items()
             for method in (("to",) if isinstance(head, PromptLookup) else config.methods)]
    # a task with a held-out split (reasoning-gym's questions, the code styles' functions, chat's requests) is
    # measured on it: prompts a head's corpus, drawn from the training split, never holds
    tasks = {n: task.heldout() if hasattr(task, "heldout") else task for n, task in tasks.items()}
    examples = {n: tasks[n].sample(config.num_prompts, seed=EVAL_SEED + config.seed) for n in config.tasks}
    with _progress(progress) as bar:
        job = bar.add_task("eval-mtp", total=len(cells))
        for task_name, temperature, label, method in cells:
            name = f"{short_task(task_name)} T={temperature} {label} {method}"
            bar.update(job, description=name)
            start = time.perf_counter()
            row, completions = evaluate_one(model, tokenizer, heads[label], tasks[task_name], examples[task_name],
                                            method=method, temperature=temperature, config=config)
            keys = {"task": task_name, "temperature": temperature, "head": label, "method": method}
            rows.append({**keys, **row})
            if writer is not None:
                for record in token_records(completions, **keys):
                    writer.log("tokens", record)
                writer.status(message=name, rows=len(rows))
            bar.console.log(f"{name}: acceptance {row['acceptance_rate']:.3f}, accept length "
                            f"{row['accept_length']:.2f}, H {row['draft_entropy_mean']:.3f}, d_tv "
                            f"{row['d_tv_mean']:.3f} ({time.perf_counter() - start:.1f} s)")
            bar.advance(job)
    return rows


def _progress(shown: bool) -> Progress:
    """The sweep's bar on stderr: cells done of all, elapsed, and the time left at the pace so far (cells at a higher
    temperature write longer answers, so the estimate firms up as the sweep goes)."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("left"), TimeRemainingColumn(), console=Console(stderr=True, quiet=not shown),
                    disable=not shown)


def short_task(task_name: str) -> str:
    """A task's name for a progress line or a table: a dataset by its file name, not its path."""
    kind, _, path = task_name.partition(":")
    return f"{kind}:{Path(path).name}" if path and kind in ("jsonl", "parquet") else task_name


def eval_setup(config: EvalMTPConfig, heads: dict[str, MTPHead]) -> dict:
    """The sweep's setup keys for meta.json: the methods stand where an RL run's rollout does."""
    return setup_keys(task=one_or_all(config.tasks), rollout=one_or_all(config.methods), mtp_strategy=None,
                      mtp_objective=one_or_all(getattr(h, "objective", None) or label for label, h in heads.items()),
                      gamma=config.gamma, mode=None)


# ----------------------------------------------------------------------------------------------- tables
def fit_slopes(rows: list[dict]) -> list[dict]:
    """The entropy law per (task, head, method) over the temperatures' points, in both units of the findings:
    acceptance_rate = a + slope·draft_entropy_mean (slope, slope_ci, r2, intercept, n) and accept_length the same
    way (length_slope, length_slope_ci, length_r2), with what the points cannot support (flags: the rate fit's,
    `bebop.entropy_law.EntropyFit.flags`). One line per task: tasks sit at their own levels (a head that never saw
    code accepts little of it at any entropy), so a line through several measures the gap between them. Points where
    the policy is near uniform (rows' max_entropy = ln V) are left out of both."""
    fits = []
    for task, head, method in dict.fromkeys(_series(r) for r in rows):
        points = [r for r in rows if _series(r) == (task, head, method)
                  and math.isfinite(r["draft_entropy_mean"]) and math.isfinite(r["acceptance_rate"])]
        if len({round(r["draft_entropy_mean"], 9) for r in points}) < MIN_FIT_POINTS:
            continue  # a line through 2 points always fits: no test of the law, and no interval on its slope
        entropy = [r["draft_entropy_mean"] for r in points]
        ln_v = min((r["max_entropy"] for r in points if "max_entropy" in r), default=None)
        try:
            rate, length = (fit_entropy_law(entropy, [r[key] for r in points], n_bootstrap=200, max_entropy=ln_v)
                            for key in ("acceptance_rate", "accept_length"))
        except ValueError:  # the points below the near-uniform entropies are too few for a line
            continue
        fits.append({"task": task, "head": head, "method": method, "slope": rate.slope, "intercept": rate.intercept,
                     "r2": rate.r2, "slope_ci": list(rate.slope_ci), "n": rate.n, "length_slope": length.slope,
                     "length_slope_ci": list(length.slope_ci), "length_r2": length.r2, "flags": list(rate.flags)})
    return fits


def _series(row: dict) -> tuple[str, str, str]:
    """What one entropy-law line is fitted over: a task, a head and a method, across temperatures."""
    return row["task"], row["head"], row["method"]


def unfitted(rows: list[dict], fits: list[dict]) -> dict[tuple[str, str, str], str]:
    """Why each (task, head, method) of `rows` has no fit in `fits`: too few temperatures, or too few below the
    entropies where the policy is near uniform (`bebop.entropy_law.NEAR_UNIFORM`)."""
    fitted, out = {_series(f) for f in fits}, {}
    for pair in dict.fromkeys(_series(r) for r in rows):
        points = [r for r in rows if _series(r) == pair and math.isfinite(r["draft_entropy_mean"])]
        distinct = {round(r["draft_entropy_mean"], 9) for r in points}
        ln_v = min((r.get("max_entropy", math.inf) for r in points), default=math.inf)
        if pair in fitted:
            continue
        if len(distinct) < MIN_FIT_POINTS:
            out[pair] = (f"a fit needs >= {MIN_FIT_POINTS} temperatures (distinct draft entropies), this sweep has "
                         f"{len(distinct)}")
        else:
            below = sum(h <= NEAR_UNIFORM * ln_v for h in distinct)
            out[pair] = (f"{below} of its {len(distinct)} points lie below {NEAR_UNIFORM * ln_v:.1f} nats; above, "
                         f"the policy is near uniform over its vocabulary (ln V = {ln_v:.1f}) and no law is offered")
    return out


def table2_cells(rows: list[dict]) -> tuple[float, dict[tuple[str, str], dict]]:
    """(temperature nearest 1, {(head, task): row}) of the RS rows (all rows when none is RS)."""
    rs = [r for r in rows if r["method"] == "rs"] or rows
    temperature = min({r["temperature"] for r in rs}, key=lambda t: abs(t - 1.0))
    return temperature, {(r["head"], r["task"]): r for r in rs if r["temperature"] == temperature}


def table2(rows: list[dict]) -> tuple[float, list[dict]]:
    """RS acceptance (%) per head x task at the temperature nearest 1 (the paper's Table 2 layout)."""
    temperature, cells = table2_cells(rows)
    out = {}
    for (head, task), r in cells.items():
        out.setdefault(head, {"head": head})[task] = 100 * r["acceptance_rate"]
    return temperature, list(out.values())


def write_tables(run_dir: Path, rows: list[dict], fits: list[dict]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_csv(run_dir / "table.csv", rows)
    (run_dir / "table.json").write_text(json.dumps(rows, indent=1) + "\n")
    (run_dir / "fits.json").write_text(json.dumps(fits, indent=1) + "\n")
    _, t2 = table2(rows)
    _write_csv(run_dir / "table2.csv", t2)


def _write_csv(path: Path, rows: list[dict]) -> None:
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
