"""Run untrusted Python (a policy's program) in a separate, locked-down process.

A policy under RL writes whatever raises its reward, so the verifier assumes every program is
hostile: infinite loops, huge allocations, imports, file and socket access, fork bombs, deep
recursion, gigabytes of output. Each run gets its own `python -I -S -B` process and several
independent layers, so one bypass is not enough to touch the host:

    process     new session (so the whole group can be killed), empty environment, cwd a fresh
                temp dir deleted afterwards, stdout/stderr to files (never an unbounded pipe)
    privileges  when started as root, the child drops to uid/gid `config.uid` (nobody) before
                running anything untrusted, so it can write nothing the host owns
    limits      RLIMIT_CPU, RLIMIT_AS (memory), RLIMIT_FSIZE (output and files), RLIMIT_NOFILE,
                RLIMIT_NPROC = 0 (no fork), RLIMIT_CORE = 0; plus a wall-clock timeout
    builtins    the program runs with a small builtins dict: no open/exec/eval/compile/input/
                type/getattr, and `__import__` admits only `config.modules` (pre-imported)
    audit hook  installed before the program runs (PEP 578; cannot be removed): blocks socket.*,
                subprocess, os.system/exec/spawn/fork/kill and every other os.* event, ctypes,
                gc/sys introspection, `open` of any path outside the temp dir, a second exec or
                any compile, and any import outside the allowlist, even via object-graph escapes

The child reports "ready" on a private pipe once privileges and limits are in place, and closes it
before it even compiles the program,
so a setup failure (an infrastructure error, raised as RuntimeError) is never confused with a
failing program, which simply returns a non-zero `returncode` or `timed_out`.
Task verifiers add an AST pre-check in front of this (see `bebop.data.tasks.code`); this module runs any
source it is given.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

_READY = b"ok"

# Runs in the child. Everything before `sys.addaudithook` is trusted setup; the program itself only ever
# sees `safe` as its builtins.
_BOOTSTRAP = r"""
import builtins, json, os, resource, sys
cfg = json.loads(sys.argv[1])
for name in cfg["modules"]:
    __import__(name)
with open(cfg["source"], encoding="utf-8") as f:
    source = f.read()
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(cfg["uid"])
    os.setuid(cfg["uid"])

def limit(name, soft, hard=None, required=True):
    try:
        resource.setrlimit(getattr(resource, name), (soft, soft if hard is None else hard))
    except (AttributeError, ValueError, OSError):
        if required:
            raise

limit("RLIMIT_CORE", 0)
limit("RLIMIT_CPU", cfg["cpu_s"], cfg["cpu_s"] + 1)
limit("RLIMIT_FSIZE", cfg["file_bytes"])
limit("RLIMIT_NOFILE", cfg["open_files"])
limit("RLIMIT_AS", cfg["memory_bytes"], required=False)  # not enforceable on macOS
limit("RLIMIT_NPROC", 0, required=False)
os.write(cfg["ready_fd"], b"ok")  # setup done: what fails from here on is the program's doing
os.close(cfg["ready_fd"])
try:
    code = compile(source, "<sandbox>", "exec")
except BaseException as err:  # SyntaxError, or RecursionError/MemoryError on absurd nesting
    code = err
SAFE = (
    "abs all any ascii bin bool chr dict divmod enumerate filter float format frozenset hash hex int "
    "isinstance iter len list map max min next oct ord pow print range repr reversed round set slice "
    "sorted str sum tuple zip ArithmeticError AssertionError AttributeError Exception IndexError KeyError "
    "LookupError MemoryError NameError OverflowError RecursionError RuntimeError StopIteration TypeError "
    "ValueError ZeroDivisionError"
).split()
allowed = frozenset(cfg["modules"])
real_import = builtins.__import__

def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level or name not in allowed:
        raise ImportError(f"sandbox: import of {name!r} is not allowed")
    return real_import(name, globals, locals, fromlist, level)

safe = {name: getattr(builtins, name) for name in SAFE}
safe["__import__"] = guarded_import
work = os.getcwd() + os.sep
blocked = tuple(cfg["blocked_events"])
execs = [0]

def hook(event, args):
    if event == "open":
        path = args[0]
        if not isinstance(path, str) or not os.path.abspath(path).startswith(work):
            raise PermissionError(f"sandbox: open({path!r}) outside the work directory")
    elif event == "exec":
        execs[0] += 1
        if execs[0] > 1:
            raise PermissionError("sandbox: exec is blocked")
    elif event == "import":
        if args[0] not in allowed:
            raise ImportError(f"sandbox: import of {args[0]!r} is blocked")
    elif event.startswith(blocked):
        raise PermissionError(f"sandbox: {event} is blocked")

sys.addaudithook(hook)
status = 1
if isinstance(code, BaseException):
    sys.stderr.write(f"{type(code).__name__}: {code}\n")
else:
    try:
        exec(code, {"__builtins__": safe, "__name__": "__main__"})
        status = 0
    except BaseException as err:
        sys.stderr.write(f"{type(err).__name__}: {err}\n"[:2000])
try:
    sys.stdout.flush()
    sys.stderr.flush()
except BaseException:
    status = 1
os._exit(status)
"""

BLOCKED_EVENTS = (
    "os.", "socket.", "subprocess.", "_posixsubprocess", "shutil.", "ctypes.", "pty.", "resource.",
    "gc.", "sys.", "signal.", "mmap.", "fcntl.", "_thread.", "compile", "code.__new__", "function.__new__",
    "cpython.", "marshal.", "pickle.", "builtins.input", "builtins.breakpoint", "urllib.", "http.",
    "ftplib.", "smtplib.", "poplib.", "imaplib.", "nntplib.", "telnetlib.", "webbrowser.", "syslog.",
    "sqlite3.", "tempfile.", "glob.", "setopencode", "winreg.", "msvcrt.", "_winapi.",
)  # fmt: skip


@dataclass(frozen=True)
class SandboxConfig:
    timeout_s: float = 5.0  # wall clock, from spawn to kill
    cpu_s: int = 2  # RLIMIT_CPU (SIGXCPU at cpu_s, SIGKILL one second later)
    memory_mb: int = 256  # RLIMIT_AS
    max_file_bytes: int = 1_000_000  # RLIMIT_FSIZE: caps stdout, stderr and any file it writes
    max_output_bytes: int = 64_000  # how much of stdout/stderr is read back
    max_open_files: int = 16  # RLIMIT_NOFILE
    modules: tuple[str, ...] = ("math",)  # importable by the program
    uid: int = 65534  # dropped to when the host runs as root
    python: str = field(default_factory=lambda: sys.executable)

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_file_bytes", "max_output_bytes", "max_open_files"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_open_files < 4:
            raise ValueError(f"max_open_files must be >= 4 (stdio plus one), got {self.max_open_files}")
        if any(not m.isidentifier() for m in self.modules):
            raise ValueError(f"modules must be top-level module names, got {self.modules}")
        if self.uid <= 0:
            raise ValueError(f"uid must be a non-root uid, got {self.uid}")

    @classmethod
    def tiny(cls) -> "SandboxConfig":
        return cls(timeout_s=2.0, cpu_s=1, memory_mb=128, max_file_bytes=100_000, max_output_bytes=10_000)


@dataclass(frozen=True)
class SandboxResult:
    returncode: int  # 0 = ran to the end; negative = killed by that signal
    stdout: str
    stderr: str
    timed_out: bool  # the wall-clock limit killed it
    truncated: bool  # stdout or stderr was longer than max_output_bytes
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def run_python(source: str, *, config: SandboxConfig | None = None) -> SandboxResult:
    """Run `source` as a program in a fresh sandboxed process; never raises on what the program does."""
    if not isinstance(source, str):
        raise ValueError(f"source must be a str, got {type(source).__name__}")
    config = config or SandboxConfig()
    root = Path(tempfile.mkdtemp(prefix="bebop-sandbox-"))
    try:
        work = root / "work"
        work.mkdir()
        (root / "source.py").write_text(source, encoding="utf-8", errors="replace")
        if os.geteuid() == 0:
            root.chmod(0o711)  # the dropped uid may pass through root/ into work/ but not list or read it
            os.chown(work, config.uid, config.uid)
        return _spawn(config, root, work)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_many(
    sources: Sequence[str], *, config: SandboxConfig | None = None, max_workers: int | None = None
) -> list[SandboxResult]:
    """`run_python` over many programs with at most `max_workers` processes alive at once."""
    workers = max_workers or min(4, os.cpu_count() or 1)
    if workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda s: run_python(s, config=config), sources))


def _spawn(config: SandboxConfig, root: Path, work: Path) -> SandboxResult:
    ready_r, ready_w = os.pipe()
    args = {
        "source": str(root / "source.py"),
        "modules": list(config.modules),
        "uid": config.uid,
        "cpu_s": config.cpu_s,
        "memory_bytes": config.memory_mb << 20,
        "file_bytes": config.max_file_bytes,
        "open_files": config.max_open_files,
        "ready_fd": ready_w,
        "blocked_events": list(BLOCKED_EVENTS),
    }
    command = [config.python, "-I", "-S", "-B", "-c", _BOOTSTRAP, json.dumps(args)]
    start = time.monotonic()
    try:
        with open(root / "stdout", "wb") as out, open(root / "stderr", "wb") as err:
            proc = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, cwd=work, env={},
                start_new_session=True, pass_fds=(ready_w,),
            )  # fmt: skip
            os.close(ready_w)
            ready_w = -1
            exited = _wait_exit(proc.pid, config.timeout_s)
            _kill_group(proc.pid)  # before reaping, so the group id cannot have been reused
            proc.wait()
        ready = os.read(ready_r, len(_READY)) == _READY
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
    wall = time.monotonic() - start
    stdout, cut_out = _read(root / "stdout", config.max_output_bytes)
    stderr, cut_err = _read(root / "stderr", config.max_output_bytes)
    if not ready and exited:
        raise RuntimeError(f"sandbox setup failed (exit {proc.returncode}): {stderr.strip()[-500:]}")
    return SandboxResult(proc.returncode, stdout, stderr, not exited, cut_out or cut_err, wall)


def _wait_exit(pid: int, timeout_s: float) -> bool:
    """Wait until `pid` exits (leaving it unreaped) or the timeout passes; True if it exited."""
    deadline, delay = time.monotonic() + timeout_s, 0.0005
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(delay)
        delay = min(2 * delay, 0.02)
    return True


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left in the group


def _read(path: Path, limit: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    return data[:limit].decode("utf-8", errors="replace"), len(data) > limit
