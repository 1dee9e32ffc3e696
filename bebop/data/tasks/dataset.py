"""A user's math dataset as a task (a code dataset in the HumanEval layout is `code_tests`; `dataset_task` picks): rows of a JSON-lines file, a Parquet file or a `datasets` directory.

    task = bebop.tasks.get("jsonl:data/gsm8k.jsonl")                      # columns question / answer
    task = bebop.tasks.get("parquet:train.parquet", DatasetConfig(prompt_key="problem", answer_key="solution"))
    task = bebop.tasks.get("saved/")                                      # written by Dataset.save_to_disk
    task.sample(8, seed=0)          # Example(prompt=question + "\\n", answer=the answer text, level=1, meta={"row": i})
    task.reward(example, completion)                                      # math-verify; see `answers`

The spec names the source: `jsonl:PATH`, `parquet:PATH` (read by `datasets.load_dataset`), or a directory saved
with `save_to_disk` (`datasets.load_from_disk`; of a `DatasetDict`, the split `DatasetConfig.split`). Nothing is
downloaded. The prompt column must hold text; the answer column anything that reads as text: a GSM8K solution ending
in `#### 72`, or a final answer, plain or LaTeX, or a number. A prompt gets a trailing newline when it has none, as the
built-in tasks' prompts end, so the policy answers on a line of its own.

Sampling: `sample(n, seed)` walks one seeded stream of shuffled passes over the rows: without replacement while
the pass lasts, then a fresh shuffle. One generator draws the passes in order, so `sample(k, seed)` is a prefix of
`sample(n, seed)`. A dataset is a single level (`levels == (1,)`) and has no teacher: `demonstration` (what
`bebop pretrain` trains on) raises; `train-mtp`, `eval-mtp` and `rl` let the policy answer the prompts.

Every problem (unknown spec, missing file, unreadable file, a missing key, a prompt column that is not text, no rows) is a ValueError
of one line, raised when the task is built, so a job that builds its tasks first reports it before any heavy work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from bebop.data.prompts import ANSWER_KEY, PROMPT_KEY, PromptOptions
from bebop.data.tasks.answers import gold_answer, math_rewards
from bebop.data.tasks.base import Example, Rng, RowsTask, Task
from bebop.data.tasks.code_tests import CodeTestsTask, is_code_layout

FILE_KINDS = {"jsonl": "json", "parquet": "parquet"}  # spec prefix -> the `datasets` builder that reads it
_TEXT = ("string", "large_string")


@dataclass(frozen=True)
class DatasetConfig:
    prompt_key: str = PROMPT_KEY  # GSM8K's column names
    answer_key: str = ANSWER_KEY
    split: str = "train"  # the split of a saved DatasetDict (files load as one split)

    def __post_init__(self) -> None:
        for name in ("prompt_key", "answer_key", "split"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"DatasetConfig.{name} must be a non-empty string, got {getattr(self, name)!r}")


def dataset_config(options: PromptOptions) -> DatasetConfig:
    """The columns a job config (its `PromptOptions`) reads its dataset tasks with."""
    return DatasetConfig(prompt_key=options.prompt_key, answer_key=options.answer_key)


def is_dataset_spec(spec: str) -> bool:
    """Whether `spec` names a dataset (`jsonl:PATH`, `parquet:PATH` or an existing directory), not a built-in."""
    kind, sep, _ = spec.partition(":")
    return bool(sep) and kind in FILE_KINDS or Path(spec).expanduser().is_dir()


def dataset_task(spec: str, config: DatasetConfig | None = None) -> Task:
    """The task a dataset spec names: rows in the HumanEval / MBPP layout (`code_tests.CODE_COLUMNS`) are code run
    against their tests, whatever `config`'s column names say; any other rows are math read with them."""
    config = config or DatasetConfig()
    rows = read_rows(spec, config)
    if is_code_layout(rows.column_names):
        return CodeTestsTask(spec, rows)
    return DatasetTask(spec, config, rows=rows)


def load_rows(spec: str, config: DatasetConfig):
    """The `datasets.Dataset` a spec names, checked: both keys exist, the prompts are text, there are rows."""
    rows = read_rows(spec, config)
    _check_columns(spec, rows, config)
    return rows


def read_rows(spec: str, config: DatasetConfig):
    """The `datasets.Dataset` a spec names (its split `config.split` for a saved DatasetDict), unchecked."""
    import datasets

    kind, sep, path = spec.partition(":")
    quiet = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # "Generating train split" is noise around the one line a bad file gets
    try:
        if sep and kind in FILE_KINDS:
            if not Path(path).expanduser().is_file():
                raise ValueError(f"task {spec!r}: no such file {path!r}")
            if kind == "jsonl":
                check_json_lines(spec, Path(path).expanduser())
            rows = datasets.load_dataset(FILE_KINDS[kind], data_files=str(Path(path).expanduser()), split="train")
        elif Path(spec).expanduser().is_dir():
            rows = _pick_split(spec, datasets.load_from_disk(str(Path(spec).expanduser())), config.split)
        else:
            raise ValueError(f"unknown task {spec!r}: not a built-in task, jsonl:PATH, parquet:PATH or a "
                             "directory saved with datasets' save_to_disk")
    except ValueError:
        raise
    except Exception as err:  # datasets' own errors (not a dataset directory, a bad Parquet file) as one line
        raise ValueError(f"task {spec!r}: cannot read it: {_first_line(err)}") from err
    finally:
        if quiet:
            datasets.enable_progress_bars()
    return rows


def check_json_lines(spec: str, path: Path) -> None:
    """One line naming the first row that is not a JSON object (what `datasets` reports as "An error occurred while
    generating the dataset"), or saying the file has no rows at all."""
    rows = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line.rstrip())
            except json.JSONDecodeError as err:
                raise ValueError(f"task {spec!r}: line {number} is not JSON ({err.msg} at column {err.colno})") from err
            if not isinstance(row, dict):
                raise ValueError(f"task {spec!r}: line {number} is a JSON {type(row).__name__}, not an object "
                                 "with one field per column")
            rows += 1
    if rows == 0:
        raise ValueError(f"task {spec!r} has no rows: the file is empty")


def _first_line(err: BaseException) -> str:
    """The first line of the first message along the error's causes (datasets wraps arrow's with an empty one)."""
    while err is not None:
        if str(err).strip():
            return f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"
        err = err.__cause__ or err.__context__
    return "unknown error"


def _pick_split(spec: str, loaded, split: str):
    if not hasattr(loaded, "keys"):  # a Dataset, not a DatasetDict
        return loaded
    if split not in loaded:
        raise ValueError(f"task {spec!r} has no split {split!r}; its splits: {sorted(loaded.keys())}")
    return loaded[split]


def _check_columns(spec: str, rows, config: DatasetConfig) -> None:
    columns = list(rows.column_names)
    for what, key in (("prompt", config.prompt_key), ("answer", config.answer_key)):
        if key not in columns:
            raise ValueError(f"task {spec!r} has no {what} column {key!r} (--{what}-key); its columns: {columns}")
    dtype = getattr(rows.features[config.prompt_key], "dtype", type(rows.features[config.prompt_key]).__name__)
    if dtype not in _TEXT:  # answers may be numbers or mixed: `example` keeps them as text
        raise ValueError(f"task {spec!r}: the prompt column {config.prompt_key!r} holds {dtype}, not text")
    if len(rows) == 0:
        raise ValueError(f"task {spec!r} has no rows")


class DatasetTask(RowsTask):
    """Prompts and reference answers from a user's dataset, rewarded by math-verify."""

    levels = (1,)

    def __init__(self, spec: str, config: DatasetConfig | None = None, *, rows=None):
        self.config = config or DatasetConfig()
        self.name = spec  # what examples and run logs carry; `get(task.name, task.config)` rebuilds the task
        if rows is None:
            self.rows = load_rows(spec, self.config)
        else:  # read already, by `dataset_task`
            _check_columns(spec, rows, self.config)
            self.rows = rows

    def example(self, index: int) -> Example:
        """Row `index` as an Example; the answer is kept as text so run logs always serialise it."""
        row = self.rows[index]
        prompt, answer = row[self.config.prompt_key], row[self.config.answer_key]
        prompt = prompt if prompt.endswith("\n") else prompt + "\n"
        return Example(prompt=prompt, answer="" if answer is None else str(answer), level=1, meta={"row": index},
                       task=self.name)

    def reward(self, example: Example, completion: str) -> float:
        return self.rewards([example], [completion])[0]

    def rewards(self, examples: Sequence[Example], completions: Sequence[str]) -> list[float]:
        if len(examples) != len(completions):
            raise ValueError(f"got {len(examples)} examples but {len(completions)} completions")
        for example in examples:
            self._check(example)
        return math_rewards([gold_answer(e.answer) for e in examples], list(completions))

    def _demonstrate(self, example: Example, rng: Rng, wrong: bool) -> str:
        raise ValueError(f"task {self.name!r} is a dataset: it has no teacher for demonstrations (bebop pretrain "
                         "trains on the built-in tasks only); train-mtp, eval-mtp and rl use its prompts")
