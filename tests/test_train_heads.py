"""`scripts/train-heads`: the heads' recipe end to end (the corpus, a KL base, each objective adapted from it), run
on the tiny policy (`--smoke`), so the script that timed the recipe in docs/real-model.md cannot rot."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from script_module import load_script

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "train-heads"


def _run(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], env={**os.environ, "BEBOP_CACHE": str(cache)},
                          capture_output=True, text=True, timeout=300)


def test_the_smoke_recipe_trains_each_stage_and_writes_one_table(tmp_path):
    assert os.access(SCRIPT, os.X_OK)
    out = tmp_path / "heads"
    done = _run(str(out), "--smoke", "--objectives", "e2e_tv", "ce", cache=tmp_path / "cache")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = (out / "recipe.md").read_text()
    assert text in done.stdout  # printed and written alike
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| stage")}
    assert list(rows) == ["base", "e2e_tv", "ce"]
    for stage, cells in rows.items():
        assert (out / stage / "head.json").exists() and (out / "runs" / stage / "eval.jsonl").exists()
        assert cells[-1].count("(") == 2, cells  # --tiny evaluates after steps 2 and 4: the curve has both
        assert float(cells[-2].split()[0]) > 0.1  # peak memory in GiB, from the kernel
    assert "The recipe end to end:" in text
    # the base made the corpus; the stages after it read it (and the backbone's pass) from the cache
    first, second = done.stdout.split("$ ")[1:3]
    assert "generating 8 answers" in first and "answers read from" in second and "generating" not in second
    assert f"--init {out / 'base'}" in second and "--objective kl" in first


def test_a_stage_s_phases_add_up_to_its_wall_time(tmp_path, monkeypatch):
    monkeypatch.setenv("BEBOP_CACHE", str(tmp_path / "cache"))
    script = load_script("train-heads")
    args = script.parse([str(tmp_path / "heads"), "--smoke"])
    result = script.run_stage("base", script.stages(args)["base"], tmp_path / "heads")
    assert result["returncode"] == 0
    assert list(result["phases"]) == ["load", "corpus", "pass", "steps"]
    assert abs(sum(result["phases"].values()) - result["wall_s"]) < 1e-6
    assert all(seconds >= 0 for seconds in result["phases"].values())


def test_the_full_recipe_adapts_every_objective_from_the_kl_base(tmp_path):
    script = load_script("train-heads")
    args = script.parse([str(tmp_path / "heads"), "--objectives", "e2e_tv", "ce", "--base-steps", "7", "--steps", "9"])
    stages = script.stages(args)
    assert list(stages) == ["base", "e2e_tv", "ce"]
    base = stages["base"]
    assert base[base.index("--objective") + 1] == "kl" and base[base.index("--draft-vocab") + 1] == "8192"
    assert base[base.index("--steps") + 1] == "7" and "--init" not in base
    for objective in ("e2e_tv", "ce"):
        flags = stages[objective]
        assert flags[flags.index("--init") + 1] == str(tmp_path / "heads" / "base")
        assert flags[flags.index("--objective") + 1] == objective and flags[flags.index("--steps") + 1] == "9"
        assert flags[flags.index("--lr-schedule") + 1] == "cosine"
    # every stage trains on the same corpus: the same tasks, answers and sampling settings
    data = ("--tasks", "--num-sequences", "--max-new-tokens", "--temperature")
    assert len({tuple(flags[flags.index(d) + 1] for d in data) for flags in stages.values()}) == 1
    assert all("--data" not in flags for flags in stages.values())  # train-mtp's default: $BEBOP_CACHE/corpus
    kept = script.stages(script.parse([str(tmp_path / "heads"), "--data", str(tmp_path / "corpus")]))
    assert all(flags[flags.index("--data") + 1] == str(tmp_path / "corpus") for flags in kept.values())


def test_bad_arguments_and_a_used_out_are_refused_in_one_line_before_any_work(tmp_path):
    bad = _run(str(tmp_path / "a"), "--objectives", "mse", cache=tmp_path / "cache")
    assert bad.returncode == 2 and bad.stderr.strip().count("\n") == 0 and "unknown objective 'mse'" in bad.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "cache").exists()
    held = tmp_path / "b" / "base"
    held.mkdir(parents=True)
    (held / "head.json").write_text("{}")
    used = _run(str(tmp_path / "b"), "--smoke", cache=tmp_path / "cache")
    assert used.returncode == 2 and "already holds a head" in used.stderr and used.stderr.strip().count("\n") == 0
    assert (held / "head.json").read_text() == "{}" and not (tmp_path / "cache").exists()


def test_phase_lines_and_minutes_are_read_as_the_table_says():
    script = load_script("train-heads")
    assert script.phase_opened(b"train-mtp: math: generating 256 answers of up to 128 tokens") == "corpus"
    assert script.phase_opened(b"train-mtp: code: 256 answers read from /c/code.pt") == "corpus"
    assert script.phase_opened(b"train-mtp: the backbone's pass over the corpus, read from /c/f") == "pass"
    assert script.phase_opened(b"train-mtp: training the head (173 batches, 19 held out)") == "steps"
    assert script.phase_opened(b"train-mtp: math: 64/256 answers; 248.0 answers/min") is None
    assert script.phase_opened(b"training the head") is None  # not a status line
    assert script.minutes(59.7) == "1 min 00 s" and script.minutes(3725.2) == "62 min 05 s"
