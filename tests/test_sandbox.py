"""The sandbox against hostile programs: each one fails inside its limits and leaves the host untouched.

These run raw programs (no AST pre-check), so every layer below the code task's verifier is exercised.
Programs that "escape" the restricted builtins walk the object graph to the real `sys`, `posix` and
builtins; the audit hook, rlimits and the privilege drop must still stop them.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile

import pytest

from bebop.data.tasks.sandbox import SandboxConfig, SandboxResult, run_many, run_python

# The wall-clock limit is generous, so that a program that should finish does so on a loaded machine (CI runs other
# installs beside the tests); the one test of that limit sets a short one (WALL_LIMITED).
CONFIG = SandboxConfig(timeout_s=10.0, cpu_s=1, memory_mb=128, max_file_bytes=50_000, max_output_bytes=5_000)
WALL_LIMITED = dataclasses.replace(CONFIG, timeout_s=1.5)

# Reaches the unrestricted world from inside the restricted builtins: `sys`, `posix`, real builtins `B`.
ESCAPE = """
def real_globals():
    todo = [().__class__.__base__]
    while todo:
        c = todo.pop()
        try:
            todo.extend(c.__subclasses__())
        except TypeError:
            pass
        try:
            g = c.__init__.__globals__
        except AttributeError:
            continue
        if 'sys' in g and '__builtins__' in g:
            return g
g = real_globals()
sys = g['sys']
posix = sys.modules['posix']
B = g['__builtins__'] if isinstance(g['__builtins__'], dict) else g['__builtins__'].__dict__
print('escaped')
"""


@pytest.fixture(autouse=True)
def private_tempdir(tmp_path, monkeypatch):
    """Sandboxes make their temp dirs here, so the test can see that each one is deleted."""
    root = tmp_path / "sandboxes"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    yield root
    assert list(root.iterdir()) == [], "a sandbox temp dir was left behind"


def run(source: str, config: SandboxConfig = CONFIG) -> SandboxResult:
    result = run_python(source, config=config)
    assert result.wall_s < config.timeout_s + 1.0, "the sandbox overran its own wall-clock limit"
    return result


def test_benign_program_runs_and_its_output_comes_back():
    result = run("import math\nprint('hi', math.isqrt(49), sum(range(5)))")
    assert result.ok and result.stdout == "hi 7 10\n" and result.stderr == ""


def test_files_inside_the_work_dir_are_allowed():
    write = "f = B['open']('note.txt', 'w')\nf.write('kept')\nf.close()\n"
    result = run(ESCAPE + write + "print(B['open']('note.txt').read())")
    assert result.ok and result.stdout.split() == ["escaped", "kept"]


def test_syntax_error_is_a_failed_run_not_an_exception():
    result = run("def f(:\n")
    assert not result.ok and "SyntaxError" in result.stderr


def test_infinite_loop_is_killed():
    result = run("while True:\n    pass")
    assert not result.ok and (result.timed_out or result.returncode < 0)


def test_blocking_without_cpu_hits_the_wall_clock_limit():
    result = run(ESCAPE + "sys.modules['time'].sleep(60)", WALL_LIMITED)
    assert result.timed_out and not result.ok


def test_huge_allocation_fails_with_memory_error():
    result = run("x = [0] * (10 ** 9)\nprint('allocated')")
    assert not result.ok and "MemoryError" in result.stderr and "allocated" not in result.stdout


def test_deep_recursion_fails():
    assert not run("def f(n):\n    return f(n + 1)\nf(0)").ok
    nested = run("x = []\nfor i in range(10 ** 6):\n    x = [x]\nprint(repr(x)[:10])")
    assert not nested.ok


def test_printing_gigabytes_is_capped():
    result = run("while True:\n    print('x' * 100000)")
    assert not result.ok and result.truncated
    assert len(result.stdout) <= CONFIG.max_output_bytes


@pytest.mark.parametrize("source", ["import os", "import socket", "import subprocess", "__import__('ctypes')"])
def test_imports_outside_the_allowlist_fail(source):
    result = run(source)
    assert not result.ok and "ImportError" in result.stderr


@pytest.mark.parametrize("name", ["open", "exec", "eval", "compile", "getattr", "type", "input", "globals"])
def test_dangerous_builtins_are_absent(name):
    result = run(f"{name}")
    assert not result.ok and "NameError" in result.stderr


def test_escaped_file_writes_outside_the_work_dir_are_blocked(tmp_path):
    canary = tmp_path / "canary.txt"
    for attempt in (
        f"B['open']({str(canary)!r}, 'w').write('pwned')",
        f"posix.open({str(canary)!r}, 65)",  # O_WRONLY | O_CREAT
        "B['open']('../escape.txt', 'w').write('pwned')",
    ):
        result = run(ESCAPE + attempt)
        assert result.stdout.startswith("escaped"), "the escape itself should work; the hook must stop the write"
        assert not result.ok and "PermissionError" in result.stderr
    assert not canary.exists()


def test_escaped_reads_outside_the_work_dir_are_blocked():
    result = run(ESCAPE + "print(B['open']('/etc/passwd').read())")
    assert not result.ok and "root:" not in result.stdout


def test_escaped_processes_and_signals_are_blocked(tmp_path):
    canary = tmp_path / "system.txt"
    attempts = {
        "os.system": f"posix.system('touch {canary}')",
        "os.fork": "while True:\n    posix.fork()",  # fork bomb
        "os.kill": f"posix.kill({os.getpid()}, 9)",  # kill the host
        "os.exec": "posix.execv('/bin/sh', ['sh', '-c', 'touch /tmp/x'])",
        "os.listdir": "print(posix.listdir('/'))",
    }
    for event, attempt in attempts.items():
        result = run(ESCAPE + attempt)
        assert not result.ok and f"{event} is blocked" in result.stderr, (event, result.stderr)
    assert not canary.exists()  # and this process is still alive to check


def test_escaped_sockets_and_native_modules_are_blocked():
    for attempt in (
        "B['__import__']('socket').socket()",
        "S = B['type']('S', (), {'name': '_socket', 'origin': 'x'})\nsys.modules['_imp'].create_dynamic(S())",
    ):
        result = run(ESCAPE + attempt)
        assert not result.ok and "ImportError" in result.stderr


def test_escaped_exec_and_introspection_are_blocked():
    for attempt, needle in (("B['exec']('print(1)')", "compile is blocked"), ("sys._getframe()", "sys._getframe")):
        result = run(ESCAPE + attempt)
        assert not result.ok and needle in result.stderr


def test_environment_is_empty_and_privileges_dropped():
    result = run(ESCAPE + "print(','.join(k.decode() for k in posix.environ), posix.getuid())")
    assert result.ok
    environ, uid = result.stdout.split()[1:]
    assert set(environ.split(",")) <= {"LC_CTYPE"}  # only what Python's locale coercion (PEP 538) sets itself
    assert "PATH" in os.environ and "PATH" not in environ
    if os.geteuid() == 0:
        assert int(uid) == CONFIG.uid


def test_run_many_keeps_order_and_isolates_programs():
    sources = [f"print({i} * {i})" for i in range(6)] + ["while True:\n    pass"]
    results = run_many(sources, config=CONFIG, max_workers=2)
    assert [r.stdout.strip() for r in results[:6]] == [str(i * i) for i in range(6)]
    assert all(r.ok for r in results[:6]) and not results[6].ok


def test_config_validation():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="uid"):
        SandboxConfig(uid=0)
    with pytest.raises(ValueError, match="modules"):
        SandboxConfig(modules=("os.path",))
    with pytest.raises(ValueError, match="source must be a str"):
        run_python(b"print(1)")
