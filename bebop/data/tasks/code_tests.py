"""A user's code dataset as a task: rows in the HumanEval / MBPP layout, rewarded by running their tests.

    task = bebop.data.tasks.get("jsonl:bebop/assets/data/code_sample.jsonl")
    task.sample(8, seed=0)      # Example(prompt=the row's prompt, answer="", level=1, meta={"row", "test", "entry_point"})
    task.reward(example, completion)      # 1.0 iff check(entry_point) passes in the sandbox

A row has three text columns (HumanEval's names): `prompt` (the function's signature and docstring, with any imports
it needs), `test` (a `check(candidate)` function of asserts) and `entry_point` (the function's name). A dataset
spec whose rows have all three is read as this task whatever --prompt-key says (`bebop.data.tasks.dataset`).

What the program is. A base model continues the prompt: the completion is the function's body. A chat model answers
with the whole function, usually in a ```python fence. So the first fenced block is taken when there is one, else
the whole completion; if that code defines the entry point at the top level it is run after the prompt (whose stub,
a signature and a docstring, is a valid definition the answer replaces, and whose imports the answer may rely on),
otherwise it is the body and is run as prompt + completion. Then the row's test and `check(entry_point)`, and a
nonce printed last: a row passes iff the program exits cleanly and its last output line is the nonce, which the
program cannot know, so printing it early or exiting 0 from inside does not pass.

Unlike the built-in code task there is no AST pre-check (real solutions use attributes, methods and imports): the
sandbox (`bebop.data.tasks.sandbox`) is the whole defence, with the standard modules such solutions import.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Sequence

from bebop.data.tasks.base import Example, Rng, RowsTask, strip_completion
from bebop.data.tasks.sandbox import SandboxConfig, SandboxResult, run_many

CODE_COLUMNS = ("prompt", "test", "entry_point")
# What HumanEval / MBPP solutions and tests import; each is imported before the sandbox locks down.
MODULES = ("math", "typing", "collections", "itertools", "functools", "re", "string", "heapq", "bisect")
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[^\n]*\n(.*?)(?:```|\Z)", re.S)


def is_code_layout(columns: Sequence[str]) -> bool:
    """Whether a dataset's columns are the HumanEval / MBPP layout this task reads."""
    return all(c in columns for c in CODE_COLUMNS)


def program_text(prompt: str, completion: str, entry_point: str) -> str:
    """The program a completion stands for (see the module docstring): the fenced code or the completion, after the
    prompt, as a replacement definition when it defines `entry_point`, else as the prompt's body."""
    found = _FENCE.search(completion)
    code = found.group(1) if found else completion
    if re.search(rf"^(?:async\s+)?def\s+{re.escape(entry_point)}\s*\(", code, re.M):
        return f"{prompt.rstrip()}\n\n{code}"
    return prompt + code


@dataclass(frozen=True)
class CodeTestsConfig:
    sandbox: SandboxConfig = field(default_factory=lambda: SandboxConfig(timeout_s=10.0, cpu_s=5, memory_mb=512,
                                                                         modules=MODULES))
    max_workers: int | None = None  # sandbox processes alive at once in `rewards` (None: min(4, cpus))


class CodeTestsTask(RowsTask):
    """Prompts and tests from rows of a `datasets.Dataset` in the HumanEval layout (read by `dataset_task`)."""

    levels = (1,)

    def __init__(self, spec: str, rows, config: CodeTestsConfig | None = None):
        bad = [c for c in CODE_COLUMNS if c not in rows.column_names]
        if bad:
            raise ValueError(f"task {spec!r} lacks the code columns {bad}; its columns: {list(rows.column_names)}")
        if len(rows) == 0:
            raise ValueError(f"task {spec!r} has no rows")
        self.name, self.rows, self.config = spec, rows, config or CodeTestsConfig()

    def example(self, index: int) -> Example:
        row = self.rows[index]
        meta = {"row": index, "test": row["test"], "entry_point": row["entry_point"]}
        return Example(prompt=row["prompt"], answer="", level=1, meta=meta, task=self.name)

    def reward(self, example: Example, completion: str) -> float:
        return self.rewards([example], [completion])[0]

    def rewards(self, examples: Sequence[Example], completions: Sequence[str]) -> list[float]:
        """Run every completion against its row's tests, in parallel sandboxes."""
        if len(examples) != len(completions):
            raise ValueError(f"got {len(examples)} examples but {len(completions)} completions")
        jobs = []
        for example, completion in zip(examples, completions):
            self._check(example)
            text = strip_completion(completion) if isinstance(completion, str) else ""
            # the code a completion continues or replaces: the prompt, unless the row names another (a prompt in prose)
            stub = example.meta.get("stub", example.prompt)
            jobs.append(_harnessed(program_text(stub, text, example.meta["entry_point"]), example.meta))
        results = run_many([s for s, _ in jobs], config=self.config.sandbox, max_workers=self.config.max_workers)
        return [1.0 if _passed(r, nonce) else 0.0 for (_, nonce), r in zip(jobs, results)]

    def _demonstrate(self, example: Example, rng: Rng, wrong: bool) -> str:
        raise ValueError(f"task {self.name!r} is a dataset: it has no teacher for demonstrations (bebop pretrain "
                         "trains on the built-in tasks only); train-mtp, eval-mtp and rl use its prompts")


def _harnessed(program: str, meta: dict) -> tuple[str, str]:
    nonce = secrets.token_hex(8)  # not a modelling choice: only unguessability matters, so no Generator
    return f"{program}\n\n{meta['test']}\n\ncheck({meta['entry_point']})\nprint({nonce!r})\n", nonce


def _passed(result: SandboxResult, nonce: str) -> bool:
    lines = result.stdout.strip().splitlines()
    return result.ok and bool(lines) and lines[-1] == nonce
