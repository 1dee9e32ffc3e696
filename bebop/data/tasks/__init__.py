"""Verifiable task families mirroring the paper's workloads: math, code, agent.

    task = bebop.data.tasks.get("math")
    examples = task.sample(8, seed=0)                     # Example(prompt, answer, level, meta, task)
    text = task.demonstration(examples[0], torch.Generator().manual_seed(0), error_rate=0.2)
    task.reward(examples[0], text)                        # 1.0 or 0.0
    task.stop_strings                                     # ("<eos>",) or ("<eos>", "</call>") for agent

See `base` for the shared contract, and each module for its texts, levels and verifier.
"""

from __future__ import annotations

from typing import Sequence

from bebop.data.tasks.agent import AgentConfig, AgentEnv, AgentTask, tool_mask
from bebop.data.tasks.base import Example, Rng, Task, parse_answer, strip_completion
from bebop.data.tasks.code import CodeConfig, CodeTask, ProgramRejected, check_program
from bebop.data.tasks.math import MathConfig, MathTask

TASKS = {"math": (MathTask, MathConfig), "code": (CodeTask, CodeConfig), "agent": (AgentTask, AgentConfig)}


def get(name: str, config: MathConfig | CodeConfig | AgentConfig | None = None) -> Task:
    """The task called `name` ("math" | "code" | "agent"), with its default config unless one is given."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; valid names: {sorted(TASKS)}")
    task_cls, config_cls = TASKS[name]
    if config is not None and not isinstance(config, config_cls):
        raise ValueError(f"config for {name!r} must be a {config_cls.__name__}, got {type(config).__name__}")
    return task_cls(config)



def parse_tasks(names: Sequence[str]) -> tuple[str, ...]:
    """Validate task names ("math" | "code" | "agent"); ValueError naming the unknown ones."""
    names = tuple(names)
    bad = [n for n in names if n not in TASKS]
    if bad or not names:
        raise ValueError(f"unknown task names {bad or names!r}; valid names: {sorted(TASKS)}")
    return names


__all__ = [
    "TASKS", "get", "parse_tasks", "Example", "Task", "Rng", "parse_answer", "strip_completion", "MathTask", "MathConfig",
    "CodeTask", "CodeConfig", "ProgramRejected", "check_program", "AgentTask", "AgentConfig", "AgentEnv", "tool_mask",
]  # fmt: skip
