"""Code prompts in three styles, from one library of small functions (`code_library`), rewarded by their tests.

    task = bebop.data.tasks.get("code_doc")     # a signature with a docstring and an example: the body is asked for
    task = bebop.data.tasks.get("code_prose")   # the same function asked for in prose
    task = bebop.data.tasks.get("code_fix")     # the reference with one bug planted, asked to be fixed
    task.heldout()                               # the same style over functions the training split never shows

A head learns code of the styles it saw: bebop's built-in code task (`f(4)=11` pairs) taught the shipped heads
nothing about a docstring-and-signature prompt, which they then drafted badly. These three styles give a corpus that
variety without a public benchmark's problems (HumanEval, MBPP and their tests stay held out).

Rows. Each function gives `VARIANTS` rows per style: its name, constants and example inputs drawn from a generator
seeded by the function's index and the row, so the rows are the same in every process. A row is in the HumanEval
layout (`code_tests`): a prompt, a `check(candidate)` of asserts on inputs the prompt does not show, computed by the
trusted reference in-process, and the entry point. The program a completion stands for is `code_tests.program_text`
over the row's stub: the prompt itself for "doc" (the completion continues or replaces the stub), the imports alone
for "prose" and "fix" (the completion must define the function).

Bugs. "fix" plants one of `MUTATIONS` in the reference (an operator, a comparison, a bound, a constant) and keeps
the row only when the planted version gives another output than the reference on one of the row's inputs; functions
with a `while` loop are left out of "fix", where a planted bug could loop for ever in-process.

Splits. One function in HELDOUT_EVERY (by a fixed hash of its first name) is held out: `heldout()` prompts ask for
functions the training split never names, in the same style.
"""

from __future__ import annotations

import hashlib
import re

from bebop.data.tasks.base import Example, Rng
from bebop.data.tasks.code_library import FUNCTIONS, Function
from bebop.data.tasks.code_tests import CodeTestsTask

STYLES = ("doc", "prose", "fix")
SPLITS = ("train", "heldout")
HELDOUT_EVERY = 4
VARIANTS = 48  # rows per function and style
TESTS = 4  # asserted calls per row, besides the one the prompt shows
HEADER = "from typing import List\n\n"
# One planted bug: (pattern, replacement), tried in random order until one changes an output.
MUTATIONS = ((r" > ", " >= "), (r" < ", " <= "), (r" >= ", " > "), (r" <= ", " < "), (r" == ", " != "),
             (r" \+ 1\)", ")"), (r" \+ ", " - "), (r" - ", " + "), (r"\[::-1\]", ""), (r"\b1\b", "0"), (r"\b0\b", "1"),
             (r"reverse=True", "reverse=False"), (r"\.upper\(\)", ".lower()"), (r"\bmax\(", "min("),
             (r"\bmin\(", "max("), (r" \* ", " + "))


def split_of(function: Function) -> str:
    digest = hashlib.sha256(function.names[0].encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % HELDOUT_EVERY == 0 else "train"


def source(function: Function, name: str, consts: dict, body: str | None = None) -> str:
    """The function's definition (its reference body, or `body`)."""
    return f"def {name}({function.args}):\n    {(body or function.body).format(**consts)}\n"


def run(code: str, name: str, args: tuple):
    """Call `name` of trusted `code` (this module's reference or its planted bug) on `args`; an error is a value."""
    scope: dict = {}
    exec(HEADER + code, scope)  # trusted: the library's own code (module docstring), never a model's
    try:
        return scope[name](*[list(a) if isinstance(a, list) else a for a in args])
    except Exception as error:  # a planted bug may raise: that too is an output the reference does not give
        return f"error: {type(error).__name__}"


def _arguments(args: tuple) -> str:
    return ", ".join(repr(a) for a in args)


def _docstring(does: str, example: str, result) -> str:
    return f'    """Return {does}.\n    >>> {example}\n    {result!r}\n    """\n'


def make_row(function: Function, style: str, rng: Rng) -> dict | None:
    """One row of `style` for `function`, drawn from `rng` (None: a "fix" row whose planted bug changed nothing)."""
    name, consts = rng.choice(function.names), function.consts(rng)
    calls = [function.inputs(rng) for _ in range(TESTS + 1)]
    reference = source(function, name, consts)
    outputs = [run(reference, name, args) for args in calls]
    does = function.does.format(**consts)
    shown = f"{name}({_arguments(calls[0])})"
    test = "def check(candidate):\n" + "".join(f"    assert candidate({_arguments(a)}) == {o!r}\n"
                                               for a, o in zip(calls[1:], outputs[1:]))
    if style == "doc":
        prompt = f"{HEADER}def {name}({function.args}):\n{_docstring(does, shown, outputs[0])}"
        return {"prompt": prompt, "test": test, "entry_point": name, "stub": prompt}
    if style == "prose":
        prompt = (f"Write a Python function `{name}({function.args})` that returns {does}. For example, "
                  f"`{shown}` returns `{outputs[0]!r}`.\n")
        return {"prompt": prompt, "test": test, "entry_point": name, "stub": HEADER}
    for pattern, replacement in rng.sample(MUTATIONS, len(MUTATIONS)):
        body = function.body.format(**consts)
        if not re.search(pattern, body):
            continue
        buggy = source(function, name, {}, re.sub(pattern, replacement, body, count=1).replace("{", "{{")
                       .replace("}", "}}"))
        if any(run(buggy, name, args) != o for args, o in zip(calls, outputs)):
            prompt = (f"This function should return {does}, but it has a bug:\n\n```python\n{buggy}```\n\n"
                      "Fix the bug and give the corrected function.\n")
            return {"prompt": prompt, "test": test, "entry_point": name, "stub": HEADER}
    return None


class Rows:
    """A style's rows of one split, in the column layout `CodeTestsTask` reads."""

    column_names = ("prompt", "test", "entry_point", "stub")

    def __init__(self, style: str, split: str):
        self.rows = []
        for index, function in enumerate(FUNCTIONS):
            if split_of(function) != split or (style == "fix" and "while" in function.body):
                continue
            for variant in range(VARIANTS):
                row = make_row(function, style, Rng.from_seed(index * 10_000 + variant))
                if row is not None:
                    self.rows.append(row)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        return self.rows[index]


class CodeStyleTask(CodeTestsTask):
    """Functions of `code_library` asked for in one style (module docstring), one split of them."""

    def __init__(self, style: str = "doc", split: str = "train"):
        if style not in STYLES or split not in SPLITS:
            raise ValueError(f"style must be one of {STYLES} and split one of {SPLITS}, got {style!r}, {split!r}")
        self.style, self.split = style, split
        super().__init__(f"code_{style}", Rows(style, split))

    def heldout(self) -> CodeStyleTask:
        """The same style over the held-out functions (the name stays, so examples move between them)."""
        return CodeStyleTask(self.style, "heldout")

    def example(self, index: int) -> Example:
        example = super().example(index)
        return Example(prompt=example.prompt, answer="", level=1, task=self.name,
                       meta={**example.meta, "stub": self.rows[index]["stub"], "split": self.split})
