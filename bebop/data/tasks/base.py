"""What every task family shares: the `Example` record, the `Task` interface and seeded drawing.

A task is a distribution of prompts with an exact verifier, plus a teacher:

    examples = task.sample(n, seed, level=None)     # deterministic for a seed (a prefix-stable stream)
    text     = task.demonstration(example, gen)     # a full solution, phrasing drawn from `gen`
    reward   = task.reward(example, completion)     # 1.0 or 0.0; malformed output is 0.0, never an error

The pretrainer trains on `example.prompt + demonstration + EOS`; RL samples prompts, lets the policy
complete them and scores the completion. Demonstrations vary their wording and the order of their
steps through the generator, so the policy learns a distribution with real entropy over its reasoning,
and `error_rate` mixes in plausible wrong solutions so RL has something to fix.

Completions are the generated text after the prompt, as the engine cut it (without the stop that ended it:
`bebop.engine.stops`). Text a caller decoded by hand may still hold its end-of-sequence marker: what follows it is
ignored (`strip_completion`). Every final answer is written
on a line `answer: <integer>`, and the last such line counts.

Randomness: everything is drawn through `Rng`, a thin wrapper over one `torch.Generator`, so a seed
fixes the stream and there is no global random state.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence, TypeVar

from bebop.data.tokenizer import EOS

if TYPE_CHECKING:
    import torch

T = TypeVar("T")
_ANSWER = re.compile(r"^answer: ?(-?\d{1,12}) *$", re.MULTILINE)
MAX_COMPLETION_CHARS = 4000  # no reasonable solution is longer; bounds verifier work on runaway output


@dataclass(frozen=True)
class Example:
    """One prompt with what is needed to verify it. `meta` is plain JSON data; treat it as read-only."""

    prompt: str
    answer: Any  # int for math and agent; the reference program (str) for code
    level: int
    meta: dict = field(default_factory=dict)
    task: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class Rng:
    """Integer, choice and coin draws from one `torch.Generator` (CPU), in a fixed order."""

    def __init__(self, generator: torch.Generator):
        import torch  # here: task names and specs are checked before torch loads (a job's misuse answers at once)

        if not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self.generator = generator

    @classmethod
    def from_seed(cls, seed: int) -> "Rng":
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        import torch

        return cls(torch.Generator().manual_seed(seed))

    def integer(self, low: int, high: int) -> int:
        """Uniform on [low, high], both ends included."""
        if high < low:
            raise ValueError(f"empty range [{low}, {high}]")
        import torch

        return int(torch.randint(low, high + 1, (1,), generator=self.generator).item())

    def choice(self, options: Sequence[T]) -> T:
        if not options:
            raise ValueError("cannot choose from an empty sequence")
        return options[self.integer(0, len(options) - 1)]

    def chance(self, p: float) -> bool:
        import torch

        return bool(torch.rand(1, generator=self.generator).item() < p)

    def sample(self, options: Sequence[T], k: int) -> list[T]:
        """k distinct elements, in random order."""
        if not 0 <= k <= len(options):
            raise ValueError(f"cannot draw {k} distinct elements from {len(options)}")
        import torch

        order = torch.randperm(len(options), generator=self.generator)[:k].tolist()
        return [options[i] for i in order]


def strip_completion(completion: str) -> str:
    """The completion up to its first end-of-sequence marker, at most MAX_COMPLETION_CHARS long."""
    return completion.split(EOS, 1)[0][:MAX_COMPLETION_CHARS]


def parse_answer(completion: str) -> int | None:
    """The integer on the last `answer: N` line, or None if there is none (or it is malformed)."""
    if not isinstance(completion, str):
        return None
    matches = _ANSWER.findall(strip_completion(completion))
    return int(matches[-1]) if matches else None


class Task(ABC):
    """A family of verifiable prompts. Subclasses set `name`, `levels`, and implement the three methods."""

    name: str = ""
    levels: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = (EOS,)
    env = None  # an AgentEnv for multi-turn tasks: the RL loop appends its replies to a row

    def sample(self, n: int, seed: int, *, level: int | None = None) -> list[Example]:
        """n examples; the stream for a seed is fixed, so sample(k, s) is a prefix of sample(n, s) for k < n."""
        self._check_sample(n, level)
        rng = Rng.from_seed(seed)
        return [self._example(rng, level if level is not None else rng.choice(self.levels)) for _ in range(n)]

    def demonstration(self, example: Example, generator: torch.Generator, *, error_rate: float = 0.0) -> str:
        """A complete solution as the policy should write it (no EOS); wrong with probability error_rate."""
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
        self._check(example)
        rng = Rng(generator)
        return self._demonstrate(example, rng, wrong=rng.chance(error_rate))

    def reward(self, example: Example, completion: str) -> float:
        """1.0 if the completion's final answer is right, else 0.0 (also for malformed output)."""
        self._check(example)
        return 1.0 if parse_answer(completion) == example.answer else 0.0

    def rewards(self, examples: Sequence[Example], completions: Sequence[str]) -> list[float]:
        """`reward` over a batch; tasks with expensive verifiers override this to run in parallel."""
        if len(examples) != len(completions):
            raise ValueError(f"got {len(examples)} examples but {len(completions)} completions")
        return [self.reward(e, c) for e, c in zip(examples, completions)]

    def _check_sample(self, n: int, level: int | None) -> None:
        """The arguments of `sample`, checked the same way by every task (built-in or dataset)."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        if level is not None and level not in self.levels:
            raise ValueError(f"level must be one of {self.levels} or None, got {level!r}")

    def _check(self, example: Example) -> None:
        if not isinstance(example, Example) or example.task != self.name:
            got = getattr(example, "task", type(example).__name__)
            raise ValueError(f"example must be an Example of task {self.name!r}, got {got!r}")

    def _example(self, rng: Rng, level: int) -> Example:
        """One example at `level` drawn from `rng`: what `sample` builds its stream from (a task that draws
        differently, such as a dataset's shuffled passes, overrides `sample` instead)."""
        raise NotImplementedError(f"{type(self).__name__} must implement _example or override sample")

    @abstractmethod
    def _demonstrate(self, example: Example, rng: Rng, wrong: bool) -> str: ...


class RowsTask(Task):
    """A task over a table of rows (`self.rows`, set by the subclass; `example(i)` makes row i's Example): sampled
    as a seeded stream of shuffled passes, every row once before any twice, the same rows for the same seed."""

    rows: Sequence

    def __len__(self) -> int:
        return len(self.rows)

    def sample(self, n: int, seed: int, *, level: int | None = None) -> list[Example]:
        import torch  # here, as in Rng: task names and specs are checked before torch loads

        self._check_sample(n, level)
        rng = Rng.from_seed(seed)
        order: list[int] = []
        while len(order) < n:
            order += torch.randperm(len(self.rows), generator=rng.generator).tolist()
        return [self.example(i) for i in order[:n]]

    @abstractmethod
    def example(self, index: int) -> Example:
        """Row `index` as an Example."""
