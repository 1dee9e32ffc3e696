"""The house's layout: floors that import only downwards, no import cycle, jobs that hold no library, files and
functions of a readable size.

Imports are read from the source (module level and inside functions alike: a late import is still a dependency),
so the test needs no import side effects and names the offending module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import bebop

PACKAGE = Path(__file__).resolve().parents[1] / "bebop"

# Each room's floor; a module may import its own floor and the ones below. The app and the CLI sit on top.
FLOORS = {
    "bebop.sampling": 0, "bebop.verify": 0, "bebop.losses": 0, "bebop.tv_tiled": 0, "bebop.metrics": 0,
    "bebop.entropy_law": 0, "bebop.device": 0, "bebop.files": 0, "bebop.distributed": 0, "bebop.runlog": 0,
    "bebop.claims": 0, "bebop.checks": 0, "bebop.draft_vocab": 0, "bebop.losses_from_hidden": 0, "bebop.speedup": 0,
    "bebop.host_memory": 0,
    "bebop.models": 1, "bebop.data.tokenizer": 1, "bebop.data.tasks": 1, "bebop.data.batches": 1,
    "bebop.data.prompts": 1,
    "bebop.plots": 1,
    "bebop.engine": 2, "bebop.vllm_plugin": 2, "bebop.default": 2, "bebop.tasks": 2,
    "bebop.play": 3, "bebop.policy": 3,
    "bebop.rl": 4, "bebop.heads": 4, "bebop.pretrain": 4,
    "bebop.commands": 5,
    "bebop.app": 6, "bebop.cli": 6, "bebop.__main__": 6,
}
# Package files that import nothing themselves (bebop's top-level API is lazy): floor 0 for the file alone.
BARE = {"bebop", "bebop.data"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> int:
    if module in BARE:
        return 0
    room = max((r for r in FLOORS if module == r or module.startswith(r + ".")), key=len)
    return FLOORS[room]


def imports(path: Path, modules: set[str]) -> set[str]:
    """The bebop modules `path` imports anywhere in its body (`from bebop.x import y` counts bebop.x.y when that is a
    module, else bebop.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("bebop")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("bebop"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if sub in modules or node.module != "bebop":
                    found.add(sub if sub in modules else node.module)
                elif a.name not in bebop.__all__:  # `from bebop import x`: a module, or a name of the lazy API
                    found.add(sub)
    missing = found - modules
    assert not missing, f"{path} imports bebop modules that do not exist: {sorted(missing)}"
    return found & modules


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: imports(p, set(files)) - {m} for m, p in files.items()}


def test_every_module_has_a_floor(graph):
    for module in graph:
        floor(module)  # raises ValueError (max of nothing) for a module in no room


def test_imports_only_point_down(graph):
    upward = [f"{m} (floor {floor(m)}) imports {d} (floor {floor(d)})"
              for m, deps in graph.items() for d in deps if floor(d) > floor(m)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle(graph):
    state: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(module: str, stack: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                cycle = stack[stack.index(dep):] + [dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, stack + [dep])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


# Jobs are argument parsing and printing: only the command line runs them. What a notebook, the app or another job
# needs lives in a library room (bebop.policy, bebop.heads, bebop.rl.compare, ...).
COMMAND_ENTRIES = {"bebop.cli", "bebop.__main__"}


def test_only_the_command_line_imports_the_jobs(graph):
    importers = sorted(m for m, deps in graph.items() for d in deps
                       if d.startswith("bebop.commands") and not m.startswith("bebop.commands")
                       and m not in COMMAND_ENTRIES)
    assert not importers, f"modules importing bebop.commands: {importers}"
    readers = [p.relative_to(PACKAGE.parent) for folder in ("notebooks", "app")
               for p in sorted((PACKAGE.parent / folder).rglob("*")) if p.suffix in (".py", ".ipynb")
               and "bebop.commands" in _code_text(p)]
    assert not readers, f"notebooks / app code importing bebop.commands: {readers}"


def test_jobs_hold_no_library():
    """A job parses and prints: a config or a result type it defined would be a library only the job can reach."""
    defined = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
               for path in sorted((PACKAGE / "commands").rglob("*.py"))
               for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ClassDef) and (any("dataclass" in ast.unparse(d) for d in node.decorator_list)
                                                      or any("NamedTuple" in ast.unparse(b) for b in node.bases))]
    assert not defined, "dataclasses under bebop/commands (their room is a library one):\n" + "\n".join(defined)


def _code_text(path: Path) -> str:
    """A file's code: a notebook's code cells (its prose may name a job's module), a script whole."""
    if path.suffix != ".ipynb":
        return path.read_text()
    import json

    cells = json.loads(path.read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


MAX_PARAMETERS = 10  # a function's, self and cls aside: past it, the caller is handing in a world, not arguments


def functions():
    """(where, node) for every function of the package: "bebop/x.py:LINE name"."""
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}", node


def test_files_and_functions_stay_readable():
    too_long = [f"{path.relative_to(PACKAGE.parent)}: {n} lines" for path in sorted(PACKAGE.rglob("*.py"))
                if (n := len(path.read_text().splitlines())) > 400]
    for where, node in functions():
        if node.end_lineno - node.lineno >= 60:
            too_long.append(f"{where}: {node.end_lineno - node.lineno + 1} lines")
        if parameters(node) > MAX_PARAMETERS:
            too_long.append(f"{where}: {parameters(node)} parameters")
    assert not too_long, "\n".join(too_long)


MANY_PARAMETERS, AT_MOST_SO_MANY = 8, 11  # the fourth house step's bar (docs/architecture.md counts them the same way)


def test_few_functions_take_more_than_eight_parameters():
    many = [where for where, node in functions() if parameters(node) > MANY_PARAMETERS]
    assert len(many) <= AT_MOST_SO_MANY, "\n".join(many)


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    return len(names) - (names[:1] in (["self"], ["cls"])) + (a.vararg is not None) + (a.kwarg is not None)


# A run is opened one way (`bebop.runlog.session`: the directory's rule, threads, device and dtype, the checkpoint read
# and diffed, the writer and its rewind): only the rooms of run directories build a writer, and only a fake run (the
# preview's synthetic runs, written as a real run's writer would write them) builds its own.
WRITERS = {"bebop/rl/synthetic.py"}


def test_runs_are_opened_one_way():
    built = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}" for path in sorted(PACKAGE.rglob("*.py"))
             if path.parent.name != "runlog" and str(path.relative_to(PACKAGE.parent)) not in WRITERS
             for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None))
             in ("RunWriter", "NullWriter")]
    assert not built, "run writers built outside bebop/runlog (open the run with bebop.runlog.session):\n" + \
        "\n".join(built)
