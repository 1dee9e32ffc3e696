"""A finished RL run packed into a reference run (`scripts/pack-reference-run`; read back by `bebop.runlog.reference`).

Kept, byte for byte: what every reader reads (meta.json, status.json and each `*.jsonl` stream: `load_run`, the
dashboard's pages, `bebop.rl.shadow_points` / `shadow_summary`). Dropped: everything else, which is heavy or a copy:
the checkpoint (a policy's weights: hundreds of MB on SmolLM2), the TensorBoard / W&B mirrors, temporary files.
Written beside them: `provenance.json` (`PROVENANCE_KEYS`), so the run says how to make it again.

Refused, one line each (ValueError / FileNotFoundError / FileExistsError, as the command line reports them): a folder
that is not a run, a run that has not finished, one that is not an RL run with a `shadow` stream (what notebooks 01
and 04 read), a name that is not a plain folder name, a name already packed (unless `force`), and a HEAD committed
after the run started when no commit is given (it cannot be the commit that made the run).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bebop.files import read_json
from bebop.runlog.read import run_state
from bebop.runlog.reference import PROVENANCE, is_reference_run, reference_root

KEPT = ("meta.json", "status.json")  # and every *.jsonl stream
SHADOW = "shadow.jsonl"  # bebop.rl.shadow's stream (this floor cannot import it)
PROVENANCE_KEYS = ("command", "commit", "created", "finished", "wall_s", "resumes", "machine", "packed", "dropped")
LARGE = 8 * 2**20  # bytes past which a packed run is no longer "a few MB": the script says so
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class Packed:
    path: Path  # the reference run written
    kept: dict[str, int]  # file -> bytes, provenance.json included
    dropped: dict[str, int]  # what the run held that was left out -> bytes
    provenance: dict

    @property
    def size(self) -> int:
        return sum(self.kept.values())


def pack_run(run_dir: str | os.PathLike, name: str, *, command: str, commit: str | None = None,
             repo: str | os.PathLike | None = None, root: str | os.PathLike | None = None,
             force: bool = False) -> Packed:
    """Copy the finished RL run in `run_dir` to `root`/`name` (default root: `reference_root()`) without its
    checkpoint, with its provenance: `command` made it at `commit` (default: HEAD of the git checkout `repo`)."""
    run_dir = Path(run_dir)
    meta, status = _finished_rl_run(run_dir)
    if not NAME.fullmatch(name):
        raise ValueError(f"NAME must be a plain folder name (letters, digits, '.', '_', '-'), got {name!r}")
    if not command.strip():
        raise ValueError("--command must be the command that made the run, as it was typed")
    if commit is None:
        if repo is None:
            raise ValueError("give the commit that made the run, or the git checkout to read it from")
        commit = head_commit(repo, started=float(meta.get("created") or time.time()))
    elif repo is not None and not FULL_HASH.fullmatch(commit):
        commit = full_commit(repo, commit)
    target = Path(root if root is not None else reference_root()) / name
    if target.exists() and not (force and is_reference_run(target)):
        why = "pass --force to replace it" if is_reference_run(target) else "it is not a reference run: not replaced"
        raise FileExistsError(f"{target} already exists: {why}")
    kept, dropped = _split(run_dir)
    made = _provenance(meta, status, command.strip(), commit, dropped)
    _write(run_dir, kept, made, target)
    return Packed(target, {f: (target / f).stat().st_size for f in [*kept, PROVENANCE]}, dropped, made)


def _finished_rl_run(run_dir: Path) -> tuple[dict, dict]:
    """(meta, status) of a finished RL run with a shadow stream; refused otherwise."""
    if not (run_dir / "meta.json").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no meta.json)")
    meta = read_json(run_dir / "meta.json")
    status = read_json(run_dir / "status.json") if (run_dir / "status.json").is_file() else {}
    state = run_state(status)
    if state != "finished":
        raise ValueError(f"{run_dir} is {state}, not finished: pack a run once its job has ended (an interrupted "
                         "run: finish it with the same command plus --resume)")
    shadow = run_dir / SHADOW
    if meta.get("kind") != "rl" or not shadow.is_file() or shadow.stat().st_size == 0:
        raise ValueError(f"{run_dir} is not an RL run with a shadow stream: a reference run is made by `bebop rl "
                         "... --shadow-heads ...` (notebooks 01 to 04 read its shadow stream)")
    return meta, status


def _provenance(meta: dict, status: dict, command: str, commit: str, dropped: dict[str, int]) -> dict:
    """provenance.json (PROVENANCE_KEYS): the wall time runs from the run's creation to its last heartbeat, so a
    resumed run's counts the time it lay stopped (`resumes` says how often)."""
    start, end = (value if isinstance(value, (int, float)) else None
                  for value in (meta.get("created"), status.get("heartbeat")))
    return {"command": command, "commit": commit, "created": start and _iso(start), "finished": end and _iso(end),
            "wall_s": round(end - start, 1) if start and end else None,
            "resumes": len(meta.get("resumes") or []), "machine": machine(meta.get("device")),
            "packed": _iso(time.time()), "dropped": sorted(dropped)}


def _split(run_dir: Path) -> tuple[list[str], dict[str, int]]:
    """The run's files to keep (names, in order), and what is left out -> its bytes (a folder: all its files)."""
    kept, dropped = [], {}
    for path in sorted(run_dir.iterdir()):
        if path.is_file() and not path.name.startswith(".") and (path.name in KEPT or path.suffix == ".jsonl"):
            kept.append(path.name)
        else:
            files = [path] if not path.is_dir() else [p for p in path.rglob("*") if p.is_file()]
            dropped[path.name] = sum(p.lstat().st_size for p in files)
    return kept, dropped


def _write(run_dir: Path, kept: list[str], made: dict, target: Path) -> None:
    """Write the reference run beside `target` and swap it in, so a failure never leaves half a run there."""
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name in kept:
            shutil.copy2(run_dir / name, scratch / name)
        (scratch / PROVENANCE).write_text(json.dumps(made, indent=2) + "\n")
        os.chmod(scratch, 0o755)  # mkdtemp's 0700 would hide it from other users of an installed package
        if target.exists():
            shutil.rmtree(target)
        scratch.rename(target)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise


FULL_HASH = re.compile(r"[0-9a-f]{40}")  # a full hash is taken as given: a short one is resolved in the checkout


def _git(repo: str | os.PathLike, *args: str) -> str:
    return subprocess.run(["git", "-C", os.fspath(repo), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def full_commit(repo: str | os.PathLike, commit: str) -> str:
    """The full hash of `commit` (a short hash, a tag, a branch) in the git checkout `repo`, so provenance names
    one commit for good; refused when the checkout has no such commit."""
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}")
    except (OSError, subprocess.CalledProcessError):
        raise ValueError(f"--commit {commit!r} is not a commit of {repo}") from None


def head_commit(repo: str | os.PathLike, *, started: float) -> str:
    """HEAD of the git checkout `repo`: the commit that made a run started at unix time `started`, unless HEAD was
    committed after it (then refused, naming the last commit before the run as the likely one)."""
    try:
        sha, when = _git(repo, "log", "-1", "--format=%H %ct").split()
    except (OSError, subprocess.CalledProcessError) as err:
        raise ValueError(f"{repo} is not a git checkout ({err}): pass --commit") from err
    if int(when) > started:
        before = _git(repo, "rev-list", "-1", f"--before={int(started)}", "HEAD")
        hint = f" (the last one before it on this branch: {before})" if before else ""
        raise ValueError(f"HEAD {sha[:12]} was committed after the run started ({_iso(started)}): pass --commit "
                         f"with the commit that made it{hint}")
    return sha


def machine(device: str | None = None) -> dict:
    """This machine as a reference run records it (pack where the run ran): CPU model, cores this process may use,
    the platform, and the run's device (meta.json's)."""
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass  # not Linux: platform's word for it
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "platform": platform.platform(), "device": device}


def _iso(unix: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(unix))
