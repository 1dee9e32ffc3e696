"""A policy's start reward on reasoning-gym tasks across difficulty settings: where RL has room to climb
(`bebop task-sweep`; the choice it made for SmolLM2 is docs/tasks.md).

    config = TaskSweepConfig(tasks=grid_specs("chain_sum", ["min_terms+max_terms=2,3"]), temperatures=(1.0, 0.0))
    rows = sweep(model, tokenizer, config)          # one row per (task, temperature)

Each task's held-out problems (`GymTask.heldout`: questions RL never trains on), the same `num_problems` for every
temperature, are answered through bebop's engine with the jobs' prompt format (`bebop.data.prompts.job_prompt_format`:
the chat template when the tokenizer has one) and rewarded by the task, so a row is what an RL step would see at
that setting. Temperature 0 is greedy. Plain decoding: speculative rollouts sample the same distribution.

A row holds, each rate with its 95% interval (`bebop.metrics`):
    reward          the mean reward (partial credit counts), Wilson's score interval with n = the problems: exact in
                    form for 0/1 rewards, and conservative for partial credit, since a reward in [0, 1] with mean m
                    has variance at most m(1 - m) (a bootstrap would give [0, 0] to a setting that scored 0 of 64)
    solved          the share of full-credit answers, Wilson
    stated          the share of completions that stated an answer at all (`gym.stated_answer` found one), Wilson
    answer_line     the share that wrote bebop's `answer: ...` line, Wilson
    length          the mean completion length in tokens, and the share that ran to max_new_tokens
    delta           reward minus the task's first temperature's, Newcombe's interval from the two Wilson ones; it
                    treats them as independent, which the shared problems make conservative (their results correlate)
Problems are independent draws, so the intervals hold for the held-out question distribution at that setting; at
T > 0 each problem has one sample, so they include the sampling noise a single RL rollout has.

Run directory (kind "task-sweep"): meta.json, a `cells` stream with one record per row as it finishes, a `samples`
stream with a few completions per row, table.json and table.csv.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from bebop.device import check_device_name
from bebop.data.prompts import PromptOptions, check_prompt_fields, job_prompt_format
from bebop.data.tasks import check_task_names
from bebop.data.tasks.gym import SMOLLM2_TASK, GymTask, answer_line, is_number, stated_answer
from bebop.data.tasks.gym_spec import PREFIX, is_gym_spec
from bebop.engine import Engine, GenerationConfig
from bebop.metrics import rate_difference_interval, rate_interval
from bebop.play import complete
from bebop.runlog.session import RunSession
from bebop.runlog.setup import one_or_all, setup_keys

SWEEP_SEED = 4_242  # problems come from the held-out split, and from a seed no other job draws with
SAMPLES_PER_ROW = 4  # completions written to the samples stream per row


@dataclass(frozen=True)
class TaskSweepConfig(PromptOptions):  # + prompt_key, answer_key, chat_template, system_prompt
    tasks: tuple[str, ...] = (SMOLLM2_TASK,)
    temperatures: tuple[float, ...] = (1.0, 0.0)  # 0 = greedy
    num_problems: int = 64
    max_new_tokens: int = 32
    seed: int = 0
    threads: int = 1
    device: str = "auto"
    dtype: str = "auto"

    def __post_init__(self) -> None:
        check_prompt_fields(self)
        if not isinstance(self.tasks, tuple) or not self.tasks:
            raise ValueError(f"tasks must be a non-empty tuple of gym specs, got {self.tasks!r}")
        for name in self.tasks:
            if not is_gym_spec(name):
                raise ValueError(f"task-sweep sweeps reasoning-gym tasks ({PREFIX}NAME?FIELD=VALUE&...), got {name!r}")
        check_task_names(self.tasks)
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"a task is named twice: {list(self.tasks)}")
        if not self.temperatures or any(not (isinstance(t, (int, float)) and 0 <= t < math.inf)
                                        for t in self.temperatures):
            raise ValueError(f"temperatures must be finite and >= 0 (0 = greedy), got {self.temperatures!r}")
        for name in ("num_problems", "max_new_tokens", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TaskSweepConfig.{name} must be a positive int, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"TaskSweepConfig.seed must be a non-negative int, got {self.seed!r}")
        check_device_name(self.device)
        if self.dtype not in ("auto", "bf16", "fp32"):
            raise ValueError(f"TaskSweepConfig.dtype must be 'auto', 'bf16' or 'fp32', got {self.dtype!r}")

    @classmethod
    def tiny(cls, **overrides) -> "TaskSweepConfig":
        """Seconds on the embedded default: two settings, four problems, eight tokens."""
        return cls(**{"tasks": (SMOLLM2_TASK, "gym:chain_sum?min_terms=3&max_terms=3&max_digits=1"),
                      "num_problems": 4, "max_new_tokens": 8, **overrides})


def grid_specs(dataset: str, axes: list[str]) -> tuple[str, ...]:
    """The gym specs of a grid: each axis `FIELD[+FIELD...]=V1,V2,...` sets its fields to each value in turn (tied
    fields take the same value: `min_terms+max_terms=2,3` is exactly two terms, then exactly three), and the grid is
    every combination, the first axis slowest."""
    levels = []
    for axis in axes:
        fields, sep, values = axis.partition("=")
        if not sep or not fields or not values or "" in fields.split("+") or "" in values.split(","):
            raise ValueError(f"grid axis {axis!r} is not FIELD[+FIELD...]=V1,V2,...")
        levels.append([[(field, value) for field in fields.split("+")] for value in values.split(",")])
    specs = []
    for combination in itertools.product(*levels):
        pairs = [f"{field}={value}" for cell in combination for field, value in cell]
        specs.append(f"{PREFIX}{dataset}" + ("?" + "&".join(pairs) if pairs else ""))
    return tuple(specs)


def sweep(model, tokenizer, config: TaskSweepConfig, run: RunSession | None = None, log=None) -> list[dict]:
    """One row per (task, temperature) in config order (module docstring); with `run` (opened by
    `bebop.runlog.session` and begun), each row and a few samples go to its streams; `log(row)` after each, if given."""
    engine, fmt = Engine(model), job_prompt_format(config, tokenizer)
    writer = None if run is None else run.writer
    rows = []
    for name in config.tasks:
        task = GymTask(name).heldout()
        examples = task.sample(config.num_problems, seed=SWEEP_SEED + config.seed)
        first = None
        for temperature in config.temperatures:
            start = time.perf_counter()
            gen = GenerationConfig(max_new_tokens=config.max_new_tokens, temperature=float(temperature), gamma=0,
                                   seed=config.seed)
            completions, _ = complete(engine, tokenizer, task, examples, gen, prompt_format=fmt)
            texts = [c.text for c in completions]
            rewards = torch.tensor(task.rewards(examples, texts), dtype=torch.float64)  # [N]
            row = {"task": name, "temperature": float(temperature),
                   **summarize(rewards, examples, completions, config.max_new_tokens)}
            first = row if first is None else first
            row.update(delta_columns(row, first))
            row["wall_s"] = time.perf_counter() - start
            rows.append(row)
            if writer is not None:
                writer.log("cells", row)
                for e, text in list(zip(examples, texts))[:SAMPLES_PER_ROW]:
                    writer.log("samples", {"task": name, "temperature": row["temperature"], "prompt": e.prompt,
                                           "answer": e.answer, "completion": text})
                writer.status(message=f"{name} T={temperature:g}", rows=len(rows))
            if log is not None:
                log(row)
    return rows


def summarize(rewards: torch.Tensor, examples, completions, max_new_tokens: int) -> dict:
    """A row's rates and their intervals (module docstring) from its rewards [N] and completions."""
    n = len(completions)
    solved = int((rewards >= 1.0).sum())
    stated = sum(stated_answer(c.text, is_number(e.answer)) is not None for e, c in zip(examples, completions))
    line = sum(answer_line(c.text) is not None for c in completions)
    lengths = [len(c.tokens) for c in completions]
    out = {"num_problems": n}
    for key, k in (("reward", float(rewards.sum())), ("solved", solved), ("stated", stated), ("answer_line", line)):
        out[key], (out[f"{key}_lo"], out[f"{key}_hi"]) = k / n, rate_interval(k, n)
        out[f"num_{key}"] = k
    out["length"] = sum(lengths) / n
    out["at_limit"] = sum(length >= max_new_tokens for length in lengths) / n
    return out


def delta_columns(row: dict, reference: dict) -> dict:
    """The row's mean reward minus the reference row's, with Newcombe's interval (module docstring)."""
    lo, hi = rate_difference_interval(row["num_reward"], row["num_problems"], reference["num_reward"],
                                      reference["num_problems"])
    return {"delta": row["reward"] - reference["reward"], "delta_lo": lo, "delta_hi": hi}


def sweep_setup(config: TaskSweepConfig) -> dict:
    """The sweep's setup keys for meta.json: plain decoding, no head."""
    return setup_keys(task=one_or_all(config.tasks), rollout="none", mtp_objective=None, mtp_strategy=None,
                      gamma=None, mode=None)


def write_table(run_dir: Path, rows: list[dict]) -> None:
    """table.json and table.csv beside the run's streams."""
    (run_dir / "table.json").write_text(json.dumps(rows, indent=1) + "\n")
    with open(run_dir / "table.csv", "w", newline="") as f:
        out = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        out.writeheader()
        out.writerows(rows)
