"""Reference runs (issue 45, item 5): a finished `bebop rl` run packed without its checkpoint
(`scripts/pack-reference-run`, `bebop.runlog.pack`), found again by `bebop.reference_runs()`, copied by `bebop
preview` beside its synthetic runs, served by `bebop dashboard --reference`; and the runs bebop ships, packed whole.

The stand-in run is a real `bebop rl` on the embedded default, made once (tests/reference_run.py)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from cli_checks import one_error_line
from reference_run import COMMIT, NAME, command, finished_run, packed_root

import bebop
from bebop.cli import main
from bebop.commands import dashboard
from bebop.files import CHECKPOINT
from bebop.rl import shadow_points, shadow_summary
from bebop.runlog import list_runs, load_run
from bebop.runlog.pack import PROVENANCE_KEYS, head_commit, pack_run
from bebop.runlog.reference import (PROVENANCE, REFERENCE_DIR, provenance, provenance_line, reference_runs,
                                    regenerate)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "pack-reference-run"
READ = {"meta.json", "status.json", "train.jsonl", "samples.jsonl", "shadow.jsonl"}  # what the readers read


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _copy_run(tmp_path: Path, **status) -> Path:
    """The stand-in run copied, with a mirror folder and a stray temporary file beside it, status fields changed."""
    run = Path(shutil.copytree(finished_run(), tmp_path / "run"))
    (run / "tensorboard").mkdir()
    (run / "tensorboard" / "events.out").write_bytes(b"x" * 100)
    (run / ".status.json.1234.tmp").write_text("{}")
    if status:
        (run / "status.json").write_text(json.dumps({**json.loads((run / "status.json").read_text()), **status}))
    return run


def _script(*args: str, into: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "BEBOP_REFERENCE_RUNS": str(into)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


# ------------------------------------------------------------------------------------------------------ packing
def test_a_packed_run_keeps_what_the_readers_read_and_drops_the_checkpoint(tmp_path):
    run = _copy_run(tmp_path)
    packed = pack_run(run, "learn", command=command(), commit=COMMIT, root=tmp_path / "refs")
    target = tmp_path / "refs" / "learn"
    assert packed.path == target and {p.name for p in target.iterdir()} == READ | {PROVENANCE}
    assert all((target / f).read_bytes() == (run / f).read_bytes() for f in READ)  # byte for byte
    assert set(packed.dropped) == {CHECKPOINT, "tensorboard", ".status.json.1234.tmp"}
    assert packed.dropped[CHECKPOINT] == (run / CHECKPOINT).stat().st_size and packed.dropped["tensorboard"] == 100
    assert packed.size == sum(p.stat().st_size for p in target.iterdir()) < 2**20
    before, after = load_run(run), load_run(target)
    assert after.state == "finished" and after.meta == before.meta
    for stream in ("train", "samples", "shadow"):
        pd.testing.assert_frame_equal(after.streams[stream], before.streams[stream])
    pd.testing.assert_frame_equal(shadow_points(target), shadow_points(run))  # what notebooks 01 and 04 draw
    assert set(shadow_summary(target)["head"]) == {"rollout", "ce", "online-tv:e2e_tv", "online-ce:e2e_tv"}
    made = provenance(target)
    assert tuple(made) == PROVENANCE_KEYS and made["command"] == command() and made["commit"] == COMMIT
    assert made["wall_s"] > 0 and made["resumes"] == 0 and made["machine"]["cores"] >= 1
    assert made["machine"]["device"] == before.meta["device"] and made["dropped"] == sorted(packed.dropped)
    assert made["created"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(before.meta["created"]))


def test_the_script_packs_and_prints_what_it_kept_and_dropped(tmp_path):
    into = tmp_path / "refs"
    done = _script(str(_copy_run(tmp_path)), "learn", "--command", command(), "--commit", COMMIT, into=into)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"packed {tmp_path / 'run'} into {into / 'learn'} (")
    assert lines[0].endswith(f"made at {COMMIT[:12]}")
    assert {line.split()[1] for line in lines[1:] if line.split()[0] == "kept"} == READ | {PROVENANCE}
    assert {line.split()[1] for line in lines[1:] if line.split()[0] == "dropped"} == \
        {CHECKPOINT, "tensorboard", ".status.json.1234.tmp"}
    assert reference_runs(into) == {"learn": into / "learn"}


@pytest.mark.parametrize("case, expected", [
    ("running", "is running, not finished: pack a run once its job has ended"),
    ("failed", "is failed, not finished"),
    ("not a run", "is not a run directory (no meta.json)"),
    ("no shadow", "is not an RL run with a shadow stream"),
    ("taken", "already exists: pass --force to replace it"),
    ("not a reference run", "already exists: it is not a reference run: not replaced"),
    ("bad name", "NAME must be a plain folder name"),
    ("no command", "--command must be the command that made the run"),
])
def test_the_script_refuses_with_one_line_and_writes_nothing(tmp_path, case, expected):
    into, name, force, cmd = tmp_path / "refs", "learn", [], command()
    run = _copy_run(tmp_path, **({"state": case, "heartbeat": time.time()} if case in ("running", "failed") else {}))
    if case == "not a run":
        (run / "meta.json").unlink()
    if case == "no shadow":
        (run / "shadow.jsonl").unlink()
    if case == "taken":
        shutil.copytree(packed_root() / NAME, into / name)
    if case == "not a reference run":
        (into / name).mkdir(parents=True)
        (into / name / "mine.txt").write_text("a user's file")
        force = ["--force"]
    name = "../learn" if case == "bad name" else name
    cmd = "  " if case == "no command" else cmd
    before = _snapshot(tmp_path)
    done = _script(str(run), name, "--command", cmd, "--commit", COMMIT, *force, into=into)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("pack-reference-run: error: ")
    assert expected in done.stderr
    assert _snapshot(tmp_path) == before


def test_force_replaces_a_reference_run_whole(tmp_path):
    into = tmp_path / "refs"
    shutil.copytree(packed_root() / NAME, into / "learn")
    (into / "learn" / "leftover.jsonl").write_text("{}\n")
    done = _script(str(_copy_run(tmp_path)), "learn", "--command", "bebop rl again", "--commit", COMMIT, "--force",
                   into=into)
    assert done.returncode == 0, done.stderr
    assert not (into / "learn" / "leftover.jsonl").exists()
    assert provenance(into / "learn")["command"] == "bebop rl again"
    assert sorted(p.name for p in into.iterdir()) == ["learn"]  # no scratch folder left beside it


def _git(repo: Path, *args: str, when: float | None = None) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    if when is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"@{int(when)} +0000"
    return subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_the_commit_is_heads_unless_head_came_after_the_run(tmp_path):
    repo, started = tmp_path / "repo", 1_800_000_000
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "before", when=started - 60)
    before = _git(repo, "rev-parse", "HEAD")
    assert head_commit(repo, started=started) == before
    _git(repo, "commit", "-q", "--allow-empty", "-m", "after", when=started + 60)
    with pytest.raises(ValueError, match=f"committed after the run started .*pass --commit .*last one before it on "
                                         f"this branch: {before}"):
        head_commit(repo, started=started)
    with pytest.raises(ValueError, match="not a git checkout"):
        head_commit(tmp_path / "elsewhere", started=started)


# ------------------------------------------------------------------------------------------------ finding them
def test_reference_runs_lists_packed_runs_by_name_and_says_how_to_make_them_again(tmp_path, monkeypatch):
    root = Path(shutil.copytree(packed_root(), tmp_path / "refs"))
    shutil.copytree(finished_run(), root / "unpacked")  # a run without provenance is not a reference run
    (root / "README.md").write_text("not a run")
    assert reference_runs(root) == {NAME: root / NAME}
    assert reference_runs(tmp_path / "missing") == {}
    monkeypatch.setenv("BEBOP_REFERENCE_RUNS", str(root))
    assert bebop.reference_runs() == {NAME: root / NAME} and bebop.reference_runs is reference_runs
    monkeypatch.delenv("BEBOP_REFERENCE_RUNS")
    assert reference_runs() == reference_runs(REFERENCE_DIR)
    lines = regenerate(root / NAME).splitlines()
    assert lines[:3] == [f"git checkout {COMMIT}", command(), "git checkout -"]
    assert lines[3].startswith(f"scripts/pack-reference-run {finished_run()} {NAME} --command ")
    assert lines[3].endswith(f"--commit {COMMIT} --force")
    line = provenance_line(root / NAME)
    assert line.startswith(f"`{command()}` at commit 0123456789ab, started 20") and " cores, device cpu)" in line


def test_git_commits_what_is_packed_into_the_package():
    """`runs/` is ignored at any depth (a user's runs), but not the package's own reference runs."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    for path, ignored in (("bebop/assets/runs/smollm2-learn/shadow.jsonl", False), ("runs/real/meta.json", True)):
        done = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", path], capture_output=True)
        assert done.returncode == (0 if ignored else 1), (path, done.stderr)


def test_the_runs_bebop_ships_are_packed_whole_and_small():
    """Whatever bebop/assets/runs holds is a reference run (the folder's README aside) that every reader opens, with
    its provenance, no checkpoint, and a few MiB in all. Vacuous until the SmolLM2 runs are dropped in."""
    shipped = reference_runs(REFERENCE_DIR)
    others = sorted(p.name for p in REFERENCE_DIR.iterdir() if p.name not in shipped) if REFERENCE_DIR.is_dir() else []
    assert others in ([], ["README.md"]), f"bebop/assets/runs holds what is not a reference run: {others}"
    for name, path in shipped.items():
        run = load_run(path)
        assert run.state == "finished" and run.meta["kind"] == "rl" and not (path / CHECKPOINT).exists(), name
        assert {p.name for p in path.iterdir()} <= {"meta.json", "status.json", PROVENANCE} | \
            {p.name for p in path.glob("*.jsonl")}, name
        made = provenance(path)
        assert tuple(made) == PROVENANCE_KEYS and made["command"].startswith("bebop rl ") and len(made["commit"]) == 40
        assert not shadow_points(run).empty and not shadow_summary(run, n_bootstrap=10).empty, name
    total = sum(p.stat().st_size for path in shipped.values() for p in path.iterdir())
    assert total < 16 * 2**20, f"the reference runs are {total / 2**20:.1f} MiB"


# ------------------------------------------------------------------------------------------------ preview, dashboard
def test_preview_copies_the_reference_runs_beside_the_synthetic_ones(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BEBOP_REFERENCE_RUNS", str(packed_root()))
    root = tmp_path / "pv"
    assert main(["preview", str(root), "--steps", "3"]) == 0
    copy = root / "reference" / NAME
    out = capsys.readouterr().out.splitlines()
    assert out[1] == f"copied the reference runs bebop ships (real RL runs, not synthetic): {copy}"
    assert _snapshot(copy) == _snapshot(packed_root() / NAME)
    runs = {info.path.relative_to(root).as_posix(): info for info in list_runs(root)}
    assert len(runs) == 6 and f"reference/{NAME}" in runs and not runs[f"reference/{NAME}"].meta.get("synthetic")
    before = _snapshot(root)
    assert main(["preview", str(root), "--steps", "3"]) == 2
    assert f"{copy} already hold preview runs: pass --force" in one_error_line(capsys)
    assert _snapshot(root) == before
    (copy / "train.jsonl").write_text("")  # replaced whole under --force
    assert main(["preview", str(root), "--steps", "3", "--force"]) == 0
    assert _snapshot(copy) == _snapshot(packed_root() / NAME)
    capsys.readouterr()
    assert main(["preview", str(tmp_path / "bare"), "--steps", "3", "--no-reference"]) == 0
    assert "reference" not in capsys.readouterr().out and not (tmp_path / "bare" / "reference").exists()


def test_preview_never_replaces_a_users_run_where_a_reference_run_would_go(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BEBOP_REFERENCE_RUNS", str(packed_root()))
    root = tmp_path / "pv"
    mine = Path(shutil.copytree(finished_run(), root / "reference" / NAME))  # a real run of the user's, same name
    before = _snapshot(root)
    for force in ([], ["--force"]):
        assert main(["preview", str(root), "--steps", "3", *force]) == 2
        assert f"{mine} exists and is not a preview run" in one_error_line(capsys)
        assert _snapshot(root) == before  # nothing written beside it either


def test_preview_without_reference_runs_writes_what_it_always_did(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BEBOP_REFERENCE_RUNS", str(tmp_path / "none"))
    assert main(["preview", str(tmp_path / "pv"), "--steps", "3"]) == 0
    out = capsys.readouterr().out.splitlines()  # what it wrote, then how to open it
    assert len(out) == 2 and out[1].startswith(f"open them: bebop dashboard --runs {tmp_path / 'pv'}")
    assert not (tmp_path / "pv" / "reference").exists()


def test_dashboard_reference_serves_the_shipped_runs_where_they_lie(tmp_path, monkeypatch):
    parser = argparse.ArgumentParser()
    dashboard.add_arguments(parser)
    monkeypatch.setenv("BEBOP_REFERENCE_RUNS", str(packed_root()))
    assert dashboard.runs_root(parser.parse_args(["--reference"])) == packed_root().resolve()
    with pytest.raises(ValueError, match="--reference and --runs name two roots"):
        dashboard.runs_root(parser.parse_args(["--reference", "--runs", str(tmp_path)]))
    monkeypatch.setenv("BEBOP_REFERENCE_RUNS", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="no reference run is shipped in"):
        dashboard.runs_root(parser.parse_args(["--reference"]))


def test_a_short_commit_is_written_as_its_full_hash(tmp_path):
    from bebop.runlog.pack import full_commit

    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "commit", "-q", "--allow-empty", "-m", "made it", when=1_800_000_000)
    sha = _git(repo, "rev-parse", "HEAD")
    assert full_commit(repo, sha[:7]) == sha and full_commit(repo, "HEAD") == sha
    with pytest.raises(ValueError, match="is not a commit of"):
        full_commit(repo, "deadbee")
