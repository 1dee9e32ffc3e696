"""Code: write a tiny Python function `f(x)` that matches input/output examples.

    prompt:  "write f with f(4)=11, f(0)=3, f(7)=17\\n"
    some demonstrations (all correct, drawn per solution):
        def f(x):                   def f(x):              f = lambda x: 3 + 2 * x
            return 2*x+3              y = x*2 + 3
                                      return y

Families by level: 1 = one operation (x+a, x-a, x*a); 2 = two (a*x+b, x*x+a, (x+a)*b); 3 = a branch
or a modulus (piecewise, x%a+b, |x-a|). The prompt shows `shown_tests` pairs; the verifier also checks
`hidden_tests` more, so a lookup table of the shown pairs fails. Demonstrations vary the expression
form (operand order, x*x or x**2, expanded or factored, ternary or if-block), the body style (return,
a named intermediate, a lambda), the indentation and the operator spacing.

Verification never trusts the program: `check_program` accepts only a small AST subset (no imports,
no attribute access, no names starting with "_", calls only to a few builtins or the program's own
functions, nothing that shadows a builtin, top level only defs and assignments), then the program runs
in `bebop.data.tasks.sandbox` with a harness that prints a per-run nonce and the outputs. A wrong
demonstration perturbs one constant so that at least one checked output differs.
"""

from __future__ import annotations

import ast
import builtins
import re
import secrets
from dataclasses import dataclass, field
from typing import Callable, Sequence

from bebop.data.tasks.base import Example, Rng, Task, strip_completion
from bebop.data.tasks.sandbox import SandboxConfig, SandboxResult, run_many

ALLOWED_CALLS = frozenset({"abs", "min", "max", "range", "sum", "len", "int", "sorted", "list", "divmod"})
_NODES = (
    ast.Module, ast.FunctionDef, ast.arguments, ast.arg, ast.Return, ast.Assign, ast.AugAssign, ast.If,
    ast.For, ast.While, ast.Break, ast.Continue, ast.Pass, ast.IfExp, ast.BinOp, ast.UnaryOp, ast.BoolOp,
    ast.Compare, ast.Call, ast.Name, ast.Constant, ast.List, ast.Tuple, ast.Subscript, ast.Slice,
    ast.ListComp, ast.GeneratorExp, ast.comprehension, ast.Lambda, ast.expr_context, ast.operator,
    ast.unaryop, ast.cmpop, ast.boolop,
)  # fmt: skip
_BUILTIN_NAMES = frozenset(dir(builtins))
_OPERATOR = re.compile(r"\s*(\*\*|//|<=|>=|==|!=|[+\-*%<>])\s*")


class ProgramRejected(ValueError):
    """The program is outside the accepted Python subset; the reason says which rule it broke."""


def check_program(source: str, *, max_chars: int = 600, max_nodes: int = 300) -> ast.Module:
    """Parse `source` and accept it only if it is a small, import-free, attribute-free program defining f."""
    if not isinstance(source, str) or not source.strip():
        raise ProgramRejected("empty program")
    if len(source) > max_chars:
        raise ProgramRejected(f"program longer than {max_chars} characters")
    try:
        tree = ast.parse(source, mode="exec")
        nodes = list(ast.walk(tree))
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise ProgramRejected(f"does not parse: {type(err).__name__}") from None
    if len(nodes) > max_nodes:
        raise ProgramRejected(f"more than {max_nodes} syntax nodes")
    defined = {a.arg for a in nodes if isinstance(a, ast.arg)}
    defined |= {n.name for n in nodes if isinstance(n, ast.FunctionDef)}
    defined |= {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    if bad := sorted(n for n in defined if n.startswith("_") or n in _BUILTIN_NAMES):
        raise ProgramRejected(f"defines reserved names {bad}")
    for node in nodes:
        _check_node(node, defined)
    if any(not isinstance(s, (ast.FunctionDef, ast.Assign)) for s in tree.body):
        raise ProgramRejected("only function definitions and assignments may appear at top level")
    top = {s.name for s in tree.body if isinstance(s, ast.FunctionDef)}
    top |= {t.id for s in tree.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
    if "f" not in top:
        raise ProgramRejected("the program does not define f at top level")
    return tree


def _check_node(node: ast.AST, defined: set[str]) -> None:
    if not isinstance(node, _NODES):
        raise ProgramRejected(f"{type(node).__name__} is not allowed")
    if isinstance(node, ast.Name) and node.id not in defined and node.id not in ALLOWED_CALLS:
        raise ProgramRejected(f"unknown name {node.id!r}")
    if isinstance(node, ast.Call) and (node.keywords or not isinstance(node.func, ast.Name)):
        raise ProgramRejected("calls must be plain f(args) calls by name")
    if isinstance(node, ast.FunctionDef) and (node.decorator_list or node.returns):
        raise ProgramRejected("decorators and annotations are not allowed")
    if isinstance(node, ast.arguments) and (node.vararg or node.kwarg or node.kwonlyargs or node.defaults):
        raise ProgramRejected("functions take plain positional arguments only")
    if isinstance(node, ast.arg) and node.annotation is not None:
        raise ProgramRejected("annotations are not allowed")
    if isinstance(node, ast.Constant) and not isinstance(node.value, (int, float, str, type(None))):
        raise ProgramRejected(f"constant of type {type(node.value).__name__} is not allowed")


@dataclass(frozen=True)
class Family:
    """A family of target functions: parameters, the reference, and equivalent ways to write it."""

    name: str
    level: int
    draw: Callable[[Rng], dict]
    value: Callable[[dict, int], int]
    exprs: Callable[[dict], list[str]]  # equivalent one-line expressions of x
    blocks: Callable[[dict], list[list[str]]] = lambda p: []  # equivalent def bodies; "\t" = one indent
    perturb: tuple[str, ...] = ("a",)  # parameters whose +-1 change alters some output
    split: str | None = None  # parameter the shown inputs must straddle (x <= p and x > p both shown)


FAMILIES = (
    Family("add", 1, lambda r: {"a": r.integer(1, 9)}, lambda p, x: x + p["a"],
           lambda p: [f"x+{p['a']}", f"{p['a']}+x"]),
    Family("sub", 1, lambda r: {"a": r.integer(1, 9)}, lambda p, x: x - p["a"], lambda p: [f"x-{p['a']}"]),
    Family("mul", 1, lambda r: {"a": r.integer(2, 5)}, lambda p, x: x * p["a"],
           lambda p: [f"x*{p['a']}", f"{p['a']}*x"]),
    Family("affine", 2, lambda r: {"a": r.integer(2, 5), "b": r.integer(1, 9)}, lambda p, x: p["a"] * x + p["b"],
           lambda p: [f"{p['a']}*x+{p['b']}", f"x*{p['a']}+{p['b']}", f"{p['b']}+{p['a']}*x"], perturb=("a", "b")),
    Family("square", 2, lambda r: {"a": r.integer(1, 9)}, lambda p, x: x * x + p["a"],
           lambda p: [f"x*x+{p['a']}", f"x**2+{p['a']}", f"{p['a']}+x*x"]),
    Family("shift_mul", 2, lambda r: {"a": r.integer(1, 5), "b": r.integer(2, 4)}, lambda p, x: (x + p["a"]) * p["b"],
           lambda p: [f"(x+{p['a']})*{p['b']}", f"{p['b']}*(x+{p['a']})", f"x*{p['b']}+{p['a'] * p['b']}"],
           perturb=("a", "b")),
    Family("piecewise", 3, lambda r: {"a": r.integer(1, 9), "b": r.integer(2, 6), "c": r.integer(2, 4)},
           lambda p, x: x + p["a"] if x > p["b"] else x * p["c"],
           lambda p: [f"x+{p['a']} if x>{p['b']} else x*{p['c']}", f"x*{p['c']} if x<={p['b']} else x+{p['a']}"],
           lambda p: [[f"if x>{p['b']}:", f"\treturn x+{p['a']}", f"return x*{p['c']}"],
                      [f"if x<={p['b']}:", f"\treturn x*{p['c']}", "else:", f"\treturn x+{p['a']}"]],
           split="b"),
    Family("mod", 3, lambda r: {"a": r.integer(2, 5), "b": r.integer(1, 9)}, lambda p, x: x % p["a"] + p["b"],
           lambda p: [f"x%{p['a']}+{p['b']}", f"{p['b']}+x%{p['a']}"], perturb=("b",)),
    Family("absdiff", 3, lambda r: {"a": r.integer(2, 7)}, lambda p, x: abs(x - p["a"]),
           lambda p: [f"abs(x-{p['a']})", f"abs({p['a']}-x)", f"max(x-{p['a']}, {p['a']}-x)"],
           lambda p: [[f"if x>{p['a']}:", f"\treturn x-{p['a']}", f"return {p['a']}-x"]], split="a"),
)  # fmt: skip
_BY_NAME = {f.name: f for f in FAMILIES}


@dataclass(frozen=True)
class CodeConfig:
    levels: tuple[int, ...] = (1, 2, 3)
    shown_tests: int = 3  # input/output pairs written in the prompt
    hidden_tests: int = 2  # further pairs only the verifier checks
    max_input: int = 9  # test inputs are distinct integers in 0..max_input
    max_program_chars: int = 600
    sandbox: SandboxConfig = field(default_factory=lambda: SandboxConfig(timeout_s=3.0, cpu_s=1, memory_mb=128))
    max_workers: int | None = None  # sandbox processes alive at once in `rewards` (None: min(4, cpus))

    def __post_init__(self) -> None:
        known = sorted({f.level for f in FAMILIES})
        if not self.levels or any(lv not in known for lv in self.levels):
            raise ValueError(f"levels must be a non-empty subset of {known}, got {self.levels}")
        if self.shown_tests < 2 or self.hidden_tests < 0:
            raise ValueError(f"need shown_tests >= 2, hidden_tests >= 0; got {self.shown_tests}, {self.hidden_tests}")
        if self.max_input + 1 < self.shown_tests + self.hidden_tests or self.max_input < 7:
            raise ValueError(f"max_input={self.max_input} must be >= 7 and leave room for distinct test inputs")

    @classmethod
    def tiny(cls) -> "CodeConfig":
        return cls(levels=(1, 2), hidden_tests=1, sandbox=SandboxConfig.tiny(), max_workers=2)


class CodeTask(Task):
    name = "code"

    def __init__(self, config: CodeConfig | None = None):
        self.config = config or CodeConfig()
        self.levels = tuple(self.config.levels)

    def _example(self, rng: Rng, level: int) -> Example:
        family = rng.choice([f for f in FAMILIES if f.level == level])
        params = family.draw(rng)
        xs = self._inputs(rng, family, params)
        tests = [[x, family.value(params, x)] for x in xs]
        shown = ", ".join(f"f({x})={y}" for x, y in tests[: self.config.shown_tests])
        reference = _program(family.exprs(params)[0], "    ", "return")
        meta = {"family": family.name, "params": params, "tests": tests, "shown": self.config.shown_tests}
        return Example(prompt=f"write f with {shown}\n", answer=reference, level=level, meta=meta, task=self.name)

    def _inputs(self, rng: Rng, family: Family, params: dict) -> list[int]:
        n, shown = self.config.shown_tests + self.config.hidden_tests, self.config.shown_tests
        for _ in range(64):
            xs = rng.sample(range(self.config.max_input + 1), n)
            if family.split is None:
                return xs
            cut = params[family.split]
            if any(x <= cut for x in xs[:shown]) and any(x > cut for x in xs[:shown]):
                return xs
        raise RuntimeError(f"could not draw inputs straddling {family.split}={params[family.split]}")

    def _demonstrate(self, example: Example, rng: Rng, wrong: bool) -> str:
        family, params = _BY_NAME[example.meta["family"]], dict(example.meta["params"])
        if wrong:
            params = self._perturbed(rng, family, params, example.meta["tests"])
        return _render(rng, family, params)

    def _perturbed(self, rng: Rng, family: Family, params: dict, tests: list[list[int]]) -> dict:
        for _ in range(64):
            key = rng.choice(family.perturb)
            changed = {**params, key: max(1, params[key] + rng.choice((-1, 1)))}
            if any(family.value(changed, x) != y for x, y in tests):
                return changed
        raise RuntimeError(f"could not perturb {family.name} {params} into a wrong program")

    def reward(self, example: Example, completion: str) -> float:
        return self.rewards([example], [completion])[0]

    def rewards(self, examples: Sequence[Example], completions: Sequence[str]) -> list[float]:
        """Verify a batch: AST check here, then the survivors in parallel sandboxes."""
        if len(examples) != len(completions):
            raise ValueError(f"got {len(examples)} examples but {len(completions)} completions")
        jobs = []  # (index, source, expected last line)
        for i, (example, completion) in enumerate(zip(examples, completions)):
            self._check(example)
            program = strip_completion(completion).strip() if isinstance(completion, str) else ""
            try:
                check_program(program, max_chars=self.config.max_program_chars)
            except ProgramRejected:
                continue
            jobs.append((i, *_harnessed(program, example.meta["tests"])))
        results = run_many([s for _, s, _ in jobs], config=self.config.sandbox, max_workers=self.config.max_workers)
        scores = [0.0] * len(examples)
        for (i, _, expected), result in zip(jobs, results):
            scores[i] = 1.0 if _passed(result, expected) else 0.0
        return scores


def _harnessed(program: str, tests: list[list[int]]) -> tuple[str, str]:
    """The program plus a harness line; the expected output line starts with a nonce the program cannot know."""
    nonce = secrets.token_hex(8)  # not a modelling choice: only unguessability matters, so no Generator
    inputs, outputs = [x for x, _ in tests], [y for _, y in tests]
    return f"{program}\nprint({nonce!r}, repr([f(x) for x in {inputs!r}]))\n", f"{nonce} {outputs!r}"


def _passed(result: SandboxResult, expected: str) -> bool:
    lines = result.stdout.strip().splitlines()
    return result.ok and bool(lines) and lines[-1] == expected


def _render(rng: Rng, family: Family, params: dict) -> str:
    indent, spaced = rng.choice(("    ", "  ")), rng.chance(0.5)
    space = (lambda s: _OPERATOR.sub(r" \1 ", s)) if spaced else (lambda s: s)
    options = [("expr", e) for e in family.exprs(params)] + [("block", b) for b in family.blocks(params)]
    kind, body = rng.choice(options)
    if kind == "block":
        return "\n".join(["def f(x):"] + [indent + space(line).replace("\t", indent) for line in body])
    return _program(space(body), indent, rng.choice(("return", "var", "lambda")), rng.choice(("y", "r", "out")))


def _program(expr: str, indent: str, style: str, var: str = "y") -> str:
    if style == "lambda":
        return f"f = lambda x: {expr}"
    if style == "var":
        return f"def f(x):\n{indent}{var} = {expr}\n{indent}return {var}"
    return f"def f(x):\n{indent}return {expr}"
