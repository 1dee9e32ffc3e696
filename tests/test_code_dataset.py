"""Code datasets in the HumanEval / MBPP layout (`--task jsonl:PATH` with prompt, test, entry_point): rewarded by
running the completion against the row's tests in the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bebop.data import tasks
from bebop.data.tasks import CodeTestsTask, DatasetTask, program_text

SAMPLE = Path(tasks.__file__).resolve().parents[2] / "assets" / "data" / "code_sample.jsonl"
ROW = {
    "prompt": 'from typing import List\n\n\ndef total_even(numbers: List[int]) -> int:\n'
              '    """Sum of the even values.\n    >>> total_even([1, 2, 4])\n    6\n    """\n',
    "test": "def check(candidate):\n    assert candidate([1, 2, 4]) == 6\n    assert candidate([]) == 0\n"
            "    assert candidate([3, 5]) == 0\n",
    "entry_point": "total_even",
}
BODY_RIGHT = "    return sum(n for n in numbers if n % 2 == 0)\n"
BODY_WRONG = "    return sum(numbers)\n"


@pytest.fixture
def task(tmp_path):
    path = tmp_path / "he.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "entry_point": "total_even"}) + "\n")
    return tasks.get(f"jsonl:{path}")


def test_humaneval_rows_are_a_code_task_whatever_the_prompt_key(task, tmp_path):
    assert isinstance(task, CodeTestsTask)
    example = task.sample(1, seed=0)[0]
    assert example.prompt == ROW["prompt"] and example.meta["entry_point"] == "total_even"
    math_rows = tmp_path / "math.jsonl"
    math_rows.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    assert isinstance(tasks.get(f"jsonl:{math_rows}"), DatasetTask)


def test_planted_completions_are_rewarded_one_and_zero(task):
    example = task.sample(1, seed=0)[0]
    assert task.rewards([example, example], [BODY_RIGHT, BODY_WRONG]) == [1.0, 0.0]


def test_a_chat_answer_in_a_python_fence(task):
    example = task.sample(1, seed=0)[0]
    right = ("Here is the function:\n\n```python\nfrom typing import List\n\ndef total_even(numbers: List[int]) -> int:\n"
             "    return sum(x for x in numbers if x % 2 == 0)\n```\n\nIt keeps the even values.")
    wrong = right.replace("x % 2 == 0", "x % 2 == 1")
    assert task.rewards([example, example], [right, wrong]) == [1.0, 0.0]
    # the fence's own function replaces the prompt's stub; the prompt's imports stay available to it
    assert program_text(ROW["prompt"], right, "total_even").startswith(ROW["prompt"].rstrip())


def test_a_program_that_prints_no_nonce_or_escapes_fails(task):
    example = task.sample(1, seed=0)[0]
    exits_early = "    import sys\n    sys.exit(0)\n"  # blocked import: the program fails, it is not a pass
    prints_pass = BODY_WRONG + "\nprint('ok')\n"
    assert task.rewards([example, example], [exits_early, prints_pass]) == [0.0, 0.0]


def test_the_shipped_sample_is_humaneval_layout_and_original():
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    assert 20 <= len(rows) <= 40
    assert all(set(r) == {"prompt", "test", "entry_point"} for r in rows)
    assert all(f"def {r['entry_point']}(" in r["prompt"] and "def check(candidate)" in r["test"] for r in rows)
    task = tasks.get(f"jsonl:{SAMPLE}")
    examples = task.sample(len(task), seed=0)
    # a stub that returns None passes no row's tests
    assert task.rewards(examples, ["    return None\n"] * len(examples)) == [0.0] * len(examples)
