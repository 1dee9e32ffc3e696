"""Math: multi-step arithmetic word problems, solved step by step, ending in `answer: N`.

    prompt:  "kim has 7 cups. kim buys 4 more. kim doubles them. how many cups now?\\n"
    answer:  22
    one demonstration:             another one:
        kim starts with 7.             4+7=11
        7+4=11                         then doubles: 11*2=22
        next 11 times 2 is 22          answer: 22
        so kim has 22 cups.
        answer: 22

Level L is the number of operations (1 to 4) on small numbers (values stay in 0..max_value). The
demonstration draws, per solution: whether to restate the start, the wording of each step, operand
order, connectives, whether to add two consecutive gains first, and whether to summarise. Only the
digits are forced, so the policy's entropy lives in the reasoning, as in real math rollouts.

A wrong demonstration makes one plausible mistake (an arithmetic slip or the wrong operation for a
sentence) and carries it through consistently, so its final answer is wrong: every later step is
linear in the mistake with a non-zero factor, and the rare exact cancellation is redrawn.
"""

from __future__ import annotations

from dataclasses import dataclass

from bebop.data.tasks.base import Example, Rng, Task

NAMES = ("ann", "bob", "cal", "dan", "eve", "fay", "gus", "kim", "max", "sam", "tom", "zoe")
ITEMS = ("apples", "pens", "coins", "cards", "eggs", "books", "shells", "stamps", "cups", "rocks")
GAIN_VERBS = ("buys", "finds", "gets", "wins")
LOSS_VERBS = ("gives away", "loses", "sells", "drops")
MUL_VERBS = {2: "doubles", 3: "triples"}
_OPS = ("add", "sub", "mul")
_CONNECTIVES = ("", "then ", "next ", "now ")
_SLIPS = (-10, -2, -1, 1, 2, 10)


@dataclass(frozen=True)
class MathConfig:
    levels: tuple[int, ...] = (1, 2, 3, 4)
    max_start: int = 12  # the starting amount is drawn from 2..max_start
    max_step: int = 9  # amounts added or removed are 1..max_step
    max_value: int = 99  # every intermediate value stays within 0..max_value

    def __post_init__(self) -> None:
        if not self.levels or any(not 1 <= lv <= 4 for lv in self.levels):
            raise ValueError(f"levels must be a non-empty subset of 1..4, got {self.levels}")
        if self.max_start < 2 or self.max_step < 1:
            raise ValueError(f"need max_start >= 2 and max_step >= 1, got {self.max_start}, {self.max_step}")
        if self.max_value < self.max_start + self.max_step:
            raise ValueError(f"max_value={self.max_value} must be >= max_start + max_step")

    @classmethod
    def tiny(cls) -> "MathConfig":
        return cls(levels=(1, 2), max_start=9, max_step=5, max_value=30)


def apply(op: str, value: int, k: int) -> int:
    if op == "add":
        return value + k
    if op == "sub":
        return value - k
    if op == "mul":
        return value * k
    raise ValueError(f"op must be one of {_OPS}, got {op!r}")


class MathTask(Task):
    name = "math"

    def __init__(self, config: MathConfig | None = None):
        self.config = config or MathConfig()
        self.levels = tuple(self.config.levels)

    def _example(self, rng: Rng, level: int) -> Example:
        cfg = self.config
        name, item = rng.choice(NAMES), rng.choice(ITEMS)
        value = start = rng.integer(2, cfg.max_start)
        steps = []
        for _ in range(level):
            allowed = [op for op in _OPS if self._fits(op, value)]
            op = rng.choice(allowed)
            k = self._amount(rng, op, value)
            verb = MUL_VERBS[k] if op == "mul" else rng.choice(GAIN_VERBS if op == "add" else LOSS_VERBS)
            steps.append({"op": op, "k": k, "verb": verb})
            value = apply(op, value, k)
        sentences = [f"{name} has {start} {item}."]
        for s in steps:
            more = " more" if s["op"] == "add" else ""
            sentences.append(f"{name} {s['verb']} them." if s["op"] == "mul" else f"{name} {s['verb']} {s['k']}{more}.")
        question = rng.choice((f"how many {item} now?", f"how many {item} does {name} have?"))
        prompt = " ".join(sentences + [question]) + "\n"
        meta = {"name": name, "item": item, "start": start, "steps": steps}
        return Example(prompt=prompt, answer=value, level=level, meta=meta, task=self.name)

    def _fits(self, op: str, value: int) -> bool:
        if op == "sub":
            return value >= 1
        if op == "mul":
            return value * 2 <= self.config.max_value
        return value + 1 <= self.config.max_value

    def _amount(self, rng: Rng, op: str, value: int) -> int:
        if op == "mul":
            return rng.choice([k for k in MUL_VERBS if value * k <= self.config.max_value])
        if op == "sub":
            return rng.integer(1, min(self.config.max_step, value))
        return rng.integer(1, min(self.config.max_step, self.config.max_value - value))

    def _demonstrate(self, example: Example, rng: Rng, wrong: bool) -> str:
        for _ in range(32):
            text, final = self._solve(example, rng, wrong)
            if (final == example.answer) != wrong:
                return text
        raise RuntimeError(f"could not build a {'wrong' if wrong else 'right'} solution for {example.prompt!r}")

    def _solve(self, example: Example, rng: Rng, wrong: bool) -> tuple[str, int]:
        """One solution and its final value; with `wrong`, one step gets a slip or the wrong operation."""
        meta, steps = example.meta, example.meta["steps"]
        groups = _plan(steps, rng)
        bad_group = rng.integer(0, len(groups) - 1) if wrong else -1
        value, lines = meta["start"], []
        if rng.chance(0.4):
            lines.append(rng.choice((f"{meta['name']} starts with {value}.", f"start: {value} {meta['item']}.")))
        for g, group in enumerate(groups):
            connective = "" if g == 0 else rng.choice(_CONNECTIVES)
            if len(group) == 2:  # two gains in a row: add them first, then add the sum
                k1, k2 = steps[group[0]]["k"], steps[group[1]]["k"]
                total = k1 + k2
                lines.append(f"{connective}{rng.choice(('gains: ', 'together ', ''))}{k1}+{k2}={total}")
                op, k, verb = "add", total, "gets"
            else:
                step = steps[group[0]]
                op, k, verb = step["op"], step["k"], step["verb"]
            result = apply(op, value, k)
            if g == bad_group:
                op, result = _mistake(rng, op, value, k, result, merged=len(group) == 2)
            prefix = connective if len(group) == 1 else ""  # a merged group used it on its first line
            lines.append(prefix + _step_text(rng, op, value, k, result, verb))
            value = result
        if rng.chance(0.5):
            lines.append(rng.choice((f"so {meta['name']} has {value} {meta['item']}.", f"that makes {value}.")))
        lines.append(f"answer: {value}")
        return "\n".join(lines), value


def _plan(steps: list[dict], rng: Rng) -> list[list[int]]:
    """Group step indices; two consecutive gains may be merged into one group (an ordering choice)."""
    groups, i = [], 0
    while i < len(steps):
        pair = i + 1 < len(steps) and steps[i]["op"] == steps[i + 1]["op"] == "add"
        if pair and rng.chance(0.5):
            groups.append([i, i + 1])
            i += 2
        else:
            groups.append([i])
            i += 1
    return groups


def _mistake(rng: Rng, op: str, value: int, k: int, result: int, *, merged: bool) -> tuple[str, int]:
    """A plausible error: an arithmetic slip, or reading the sentence as the wrong operation."""
    if merged or rng.chance(0.5):
        return op, result + rng.choice(_SLIPS)
    wrong_op = {"add": "sub", "sub": "add", "mul": "add"}[op]
    return wrong_op, apply(wrong_op, value, k)


def _step_text(rng: Rng, op: str, a: int, k: int, r: int, verb: str) -> str:
    if op == "add":
        forms = (f"{a}+{k}={r}", f"{k}+{a}={r}", f"{a} plus {k} is {r}", f"{verb} {k}: {a}+{k}={r}")
    elif op == "sub":
        forms = (f"{a}-{k}={r}", f"{a} minus {k} is {r}", f"{verb} {k}: {a}-{k}={r}", f"{k} fewer: {a}-{k}={r}")
    else:
        forms = (f"{a}*{k}={r}", f"{k}*{a}={r}", f"{a} times {k} is {r}", f"{verb}: {a}*{k}={r}")
    return rng.choice(forms)
