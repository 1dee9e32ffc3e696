"""Verifiable task families mirroring the paper's workloads (math, code, agent) and a user's own datasets.

    task = bebop.data.tasks.get("math")
    examples = task.sample(8, seed=0)                     # Example(prompt, answer, level, meta, task)
    text = task.demonstration(examples[0], torch.Generator().manual_seed(0), error_rate=0.2)
    task.reward(examples[0], text)                        # 1.0 or 0.0
    task.stop_strings                                     # ("<eos>",) or ("<eos>", "</call>") for agent

A dataset is a spec instead of a name: `get("jsonl:PATH")`, `get("parquet:PATH")` or `get(DIR)` for a directory
saved with `datasets`' `save_to_disk`, with a `DatasetConfig` for its column names (see `dataset`); rows in the
HumanEval / MBPP layout (prompt, test, entry_point) are code rewarded by their tests (see `code_tests`).
A reasoning-gym dataset is `get("gym:chain_sum?max_terms=2&max_digits=1")`: its config fields set the difficulty (see
`gym_spec`; reasoning-gym is the optional extra `bebop[gym]`), its held-out questions are `task.heldout()` (see `gym`).

See `base` for the shared contract, and each module for its texts, levels and verifier.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from bebop.data.tasks.agent import AgentConfig, AgentEnv, AgentTask, tool_mask
from bebop.data.tasks.base import Example, Rng, Task, parse_answer, strip_completion
from bebop.data.tasks.code import CodeConfig, CodeTask, ProgramRejected, check_program
from bebop.data.tasks.code_tests import CodeTestsConfig, CodeTestsTask, program_text
from bebop.data.tasks.dataset import (FILE_KINDS, DatasetConfig, DatasetTask, dataset_config, dataset_task,
                                      is_dataset_spec)
from bebop.data.tasks.gym import GymTask
from bebop.data.tasks.gym_spec import GymSpec, is_gym_spec, parse_spec
from bebop.data.tasks.math import MathConfig, MathTask

TASKS = {"math": (MathTask, MathConfig), "code": (CodeTask, CodeConfig), "agent": (AgentTask, AgentConfig)}


def get(name: str, config: MathConfig | CodeConfig | AgentConfig | DatasetConfig | None = None) -> Task:
    """The task `name` names: a built-in ("math" | "code" | "agent") or a dataset spec ("jsonl:PATH" |
    "parquet:PATH" | a `save_to_disk` directory), with its default config unless one is given. A `DatasetConfig`
    (the columns a job reads its datasets with, `dataset_config`) leaves a built-in at its default config, so a job
    gets every task it names the same way. A dataset is read here: a ValueError of one line for a missing or unreadable
    file, a key the dataset lacks (naming its columns) or an empty dataset."""
    if not isinstance(name, str):
        raise ValueError(f"a task name must be a string, got {type(name).__name__}")
    if is_gym_spec(name):  # the spec is the whole config (a job's dataset columns do not apply to it)
        if config is not None and not isinstance(config, DatasetConfig):
            raise ValueError(f"task {name!r} takes its settings in the spec, not a {type(config).__name__}")
        return GymTask(name)
    if name in TASKS:
        task_cls, config_cls = TASKS[name]
        config = None if isinstance(config, DatasetConfig) else config
    elif is_dataset_spec(name):
        task_cls, config_cls = DatasetTask, DatasetConfig
    else:
        raise ValueError(f"unknown task {name!r}; valid names: {sorted(TASKS)}, or a dataset: jsonl:PATH, "
                         "parquet:PATH or a directory saved with datasets' save_to_disk, or gym:NAME?FIELD=VALUE&...")
    if config is not None and not isinstance(config, config_cls):
        raise ValueError(f"config for {name!r} must be a {config_cls.__name__}, got {type(config).__name__}")
    return dataset_task(name, config) if task_cls is DatasetTask else task_cls(config)


def check_task_names(names: Sequence[str]) -> tuple[str, ...]:
    """The task names a config holds, each a built-in or a dataset spec: a ValueError of one line for an unknown
    name or none at all. Nothing is read here: a dataset's file and columns are checked once, where the job gets its
    tasks (`get`); only that a dataset file exists, which is cheap."""
    names = tuple(names)
    if not names:
        raise ValueError(f"no task given; valid names: {sorted(TASKS)}, or a dataset spec")
    for name in names:
        if is_gym_spec(name):
            parse_spec(name)  # the dataset and its settings, checked against its config (no problem is drawn)
        elif not isinstance(name, str) or name not in TASKS and not is_dataset_spec(name):
            get(name)  # the one-line refusal of a name that is neither
        elif name.partition(":")[0] in FILE_KINDS and not Path(name.partition(":")[2]).expanduser().is_file():
            raise ValueError(f"task {name!r}: no such file {name.partition(':')[2]!r}")  # cheap: refused at once
    return names


__all__ = [
    "TASKS", "get", "check_task_names", "dataset_config", "Example", "Task", "Rng", "parse_answer", "strip_completion",
    "MathTask", "MathConfig",
    "CodeTask", "CodeConfig", "ProgramRejected", "check_program", "AgentTask", "AgentConfig", "AgentEnv", "tool_mask",
    "DatasetTask", "DatasetConfig", "is_dataset_spec", "dataset_task", "CodeTestsTask", "CodeTestsConfig",
    "program_text", "GymTask", "GymSpec", "is_gym_spec", "parse_spec",
]  # fmt: skip
