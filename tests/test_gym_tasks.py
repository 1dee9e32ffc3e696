"""reasoning-gym tasks (`bebop.data.tasks.gym`, `gym_spec`) and the difficulty sweep (`bebop.rl.task_sweep`,
`bebop task-sweep`): specs and their one-line errors, seeded prefix-stable streams, disjoint splits, the reward the
dataset's scorer gives to what a completion states, and the sweep's table on the embedded tiny policy."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
from cli_checks import one_error_line

pytest.importorskip("reasoning_gym")

from bebop.cli import main  # noqa: E402
from bebop.data.tasks import MathConfig, check_task_names, get  # noqa: E402
from bebop.data.tasks import gym as gym_module  # noqa: E402
from bebop.data.tasks.dataset import DatasetConfig  # noqa: E402
from bebop.data.tasks.gym import GymTask, answer_line, split_of, stated_answer  # noqa: E402
from bebop.data.tasks.gym_spec import GymSpec, parse_spec  # noqa: E402
from bebop.rl.config import RLConfig  # noqa: E402

SMALL = gym_module.SMOLLM2_TASK  # two one-digit terms: 200 distinct questions


# ----------------------------------------------------------------------------------------------- specs
def test_a_spec_sets_typed_config_fields_and_reads_back():
    spec = parse_spec("gym:basic_arithmetic?max_terms=3&operators=+,-&allow_negation=false&format_style=natural")
    assert spec == GymSpec("basic_arithmetic", (("max_terms", 3), ("operators", ("+", "-")),
                                                ("allow_negation", False), ("format_style", "natural")))
    assert parse_spec(spec.text) == spec
    assert parse_spec("gym:chain_sum") == GymSpec("chain_sum")
    assert GymSpec.tiny().text == SMALL


@pytest.mark.parametrize("spec, match", [
    ("gym:", "name a reasoning-gym dataset"),
    ("gym:chain_summ", "no dataset 'chain_summ'; did you mean chain_sum"),
    ("gym:chain_sum?num_terms=2", "no setting 'num_terms'; its settings: min_terms, max_terms"),
    ("gym:chain_sum?max_terms=two", "max_terms='two' is not an int"),
    ("gym:chain_sum?allow_negation=yes", "must be true or false"),
    ("gym:basic_arithmetic?format_style=fancy", "must be one of simple, natural"),
    ("gym:chain_sum?max_terms=1", "invalid settings: max_terms must be >= min_terms"),
    ("gym:basic_arithmetic?operators=%", "invalid settings: unsupported operator"),
    ("gym:chain_sum?seed=3", "'seed' is not a setting"),
    ("gym:chain_sum?size=3", "'size' is not a setting"),
    ("gym:chain_sum?max_terms", "'max_terms' is not FIELD=VALUE"),
    ("gym:chain_sum?max_terms=3&max_terms=4", "given twice"),
    ("gym:rearc?rng_difficulty_ranges=1,2", "which a spec cannot set"),  # a list of pairs
])
def test_a_bad_spec_is_one_line_naming_the_problem(spec, match):
    for check in (parse_spec, lambda s: check_task_names([s])):
        with pytest.raises(ValueError, match=match) as err:
            check(spec)
        assert "\n" not in str(err.value)


def test_gym_specs_are_tasks_in_every_job(tmp_path):
    assert check_task_names([SMALL, "math"]) == (SMALL, "math")
    assert isinstance(get(SMALL), GymTask) and get(SMALL).name == SMALL
    assert isinstance(get(SMALL, DatasetConfig()), GymTask)  # a job's dataset columns do not apply to it
    assert RLConfig(task=SMALL).task == SMALL
    with pytest.raises(ValueError, match="takes its settings in the spec"):
        get(SMALL, MathConfig())


def test_without_reasoning_gym_a_gym_task_is_one_line_naming_the_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # import reasoning_gym now raises ImportError
    with pytest.raises(ValueError, match=r"pip install 'bebop\[gym\]'"):
        check_task_names([SMALL])
    assert check_task_names(["math"]) == ("math",)  # nothing else needs it
    assert main(["rl", "--task", SMALL, "--out", str(tmp_path / "run")]) == 2
    assert "bebop[gym]" in one_error_line(capsys)
    assert main(["eval-mtp", "--tasks", SMALL, "--run-dir", str(tmp_path / "eval")]) == 2
    assert "bebop[gym]" in one_error_line(capsys)
    assert not (tmp_path / "run").exists() and not (tmp_path / "eval").exists()


# ----------------------------------------------------------------------------------------------- problems
def test_streams_are_seeded_and_prefix_stable():
    task = GymTask(SMALL)
    eight = task.sample(8, seed=3)
    assert task.sample(8, seed=3) == eight
    assert task.sample(3, seed=3) == eight[:3]
    assert [e.prompt for e in task.sample(8, seed=4)] != [e.prompt for e in eight]
    held = task.heldout()
    assert held.sample(3, seed=3) == held.sample(6, seed=3)[:3]
    example = eight[0]
    assert example.prompt == example.meta["question"] + "\n" and example.task == SMALL and example.level == 1
    import reasoning_gym  # the item the stream names (module docstring): the dataset's own, with its gold answer

    item = reasoning_gym.create_dataset("chain_sum", seed=example.meta["item_seed"], size=1, **task.spec.config)[0]
    assert (example.meta["question"], example.answer) == (item["question"], item["answer"])
    assert eight[1].meta["item_seed"] > example.meta["item_seed"] >= 3 * gym_module.STREAM


def test_train_and_heldout_share_no_question():
    task = GymTask(SMALL)
    train = {e.meta["question"] for e in task.sample(400, seed=0)}
    heldout = {e.meta["question"] for e in task.heldout().sample(200, seed=0)}
    assert not train & heldout
    assert len(heldout) >= 20 and len(train) >= 100  # each split covers its part of the 200 questions
    assert {split_of(q) for q in heldout} == {"heldout"} and {split_of(q) for q in train} == {"train"}


def test_smollm2s_task_is_the_cell_the_sweep_chose():
    # docs/tasks.md swept the spelled-out spec; the constant leaves the config's own minimums (2 terms, 1 digit)
    swept = GymTask("gym:chain_sum?min_terms=2&max_terms=2&min_digits=1&max_digits=1").heldout().sample(16, seed=0)
    chosen = GymTask(gym_module.SMOLLM2_TASK).heldout().sample(16, seed=0)
    assert [(e.prompt, e.answer) for e in chosen] == [(e.prompt, e.answer) for e in swept]


def test_a_split_with_no_questions_is_one_line(monkeypatch):
    monkeypatch.setattr(gym_module, "split_of", lambda question: "train")
    with pytest.raises(ValueError, match="too few distinct questions"):
        GymTask(SMALL).heldout().sample(2, seed=0)


# ----------------------------------------------------------------------------------------------- rewards
@pytest.mark.parametrize("completion, reward", [
    ("answer: 7", 1.0),  # bebop's answer line
    ("**Answer:** 7.", 1.0),  # markdown and a full stop around it
    ("answer: 7\nand then 8", 1.0),  # the answer line wins over a later number
    ("4 + 3 = 7", 1.0),  # no line: the last number, not the operand first
    ("The answer to 4 + 3 is 7.", 1.0),
    ("answer: -7", 0.5),  # chain_sum's partial credit: len("7") / len("-7")
    ("answer: 8", 0.0),
    ("4 + 3 = 8", 0.0),
    ("I do not know.", 0.0),  # no answer at all
    ("", 0.0),
])
def test_the_reward_is_the_datasets_score_of_the_stated_answer(completion, reward):
    task = GymTask(SMALL)
    example = dataclasses.replace(task.sample(1, seed=0)[0], answer="7")
    assert task.reward(example, completion) == pytest.approx(reward)


def test_stated_answers():
    assert answer_line("work\nAnswer: 12\nanswer: 13") == "13"
    assert answer_line("answer:\nno") is None and answer_line(None) is None
    assert stated_answer("5 + 1 = 6", numeric=True) == "6"
    assert stated_answer("no digits", numeric=True) is None
    assert stated_answer("thinking\nTrue\n", numeric=False) == "True"  # a text answer: the last line
    assert stated_answer("1,000 in all", numeric=True) == "1,000"


# ----------------------------------------------------------------------------------------------- the sweep
def test_grid_specs_are_every_combination():
    from bebop.rl.task_sweep import grid_specs

    assert grid_specs("chain_sum", ["min_terms+max_terms=2,3", "max_digits=1,2"]) == (
        "gym:chain_sum?min_terms=2&max_terms=2&max_digits=1", "gym:chain_sum?min_terms=2&max_terms=2&max_digits=2",
        "gym:chain_sum?min_terms=3&max_terms=3&max_digits=1", "gym:chain_sum?min_terms=3&max_terms=3&max_digits=2")
    assert grid_specs("chain_sum", []) == ("gym:chain_sum",)
    for axis in ("max_terms", "max_terms=", "+max_terms=2", "max_terms=2,"):
        with pytest.raises(ValueError, match="is not FIELD"):
            grid_specs("chain_sum", [axis])


def test_summarize_counts_rates_with_intervals():
    import torch

    from bebop.play import Completion
    from bebop.rl.task_sweep import delta_columns, summarize

    task = GymTask(SMALL)
    examples = [dataclasses.replace(e, answer="7") for e in task.sample(4, seed=0)]
    texts = ["answer: 7", "answer: -7", "so 8", "nothing"]
    completions = [Completion([1] * n, [True] * n, t, [0.0] * n, ["plain"] * n) for t, n in zip(texts, (3, 4, 4, 2))]
    rewards = torch.tensor(task.rewards(examples, texts), dtype=torch.float64)
    row = summarize(rewards, examples, completions, max_new_tokens=4)
    assert (row["reward"], row["solved"], row["stated"], row["answer_line"]) == (0.375, 0.25, 0.75, 0.5)
    assert row["length"] == 3.25 and row["at_limit"] == 0.5
    for key in ("reward", "solved", "stated", "answer_line"):
        assert 0 <= row[f"{key}_lo"] < row[key] < row[f"{key}_hi"] <= 1
    zero = {**row, "reward": 0.0, "num_reward": 0.0}
    assert summarize(torch.zeros(4, dtype=torch.float64), examples, completions, 4)["reward_hi"] > 0.3  # 0 of 4
    delta = delta_columns(row, zero)
    assert delta["delta"] == 0.375 and delta["delta_lo"] < 0.375 < delta["delta_hi"]


def test_the_sweep_on_the_tiny_policy_writes_its_table(tmp_path):
    from bebop.default import load_default
    from bebop.rl.task_sweep import TaskSweepConfig, sweep, sweep_setup, write_table
    from bebop.runlog import load_run
    from bebop.runlog.session import open_session

    config = TaskSweepConfig.tiny()  # one thread, set by the session
    default = load_default()
    with open_session(tmp_path / "run", config, kind="task-sweep").begin(sweep_setup(config)) as run:
        rows = sweep(default.model, default.tokenizer, config, run)
        write_table(tmp_path / "run", rows)
    assert [(r["task"], r["temperature"]) for r in rows] == [(t, T) for t in config.tasks for T in (1.0, 0.0)]
    run = load_run(tmp_path / "run")
    assert run.meta["kind"] == "task-sweep" and len(run.streams["cells"]) == len(rows)
    assert json.loads((tmp_path / "run" / "table.json").read_text()) == rows
    samples = run.streams["samples"]
    for row in rows:
        assert row["num_problems"] == 4 and 0 <= row["reward_lo"] <= row["reward"] <= row["reward_hi"] <= 1
        assert 0 <= row["length"] <= config.max_new_tokens
        mine = samples[(samples.task == row["task"]) & (samples.temperature == row["temperature"])]
        task = GymTask(row["task"]).heldout()
        examples = task.sample(4, seed=gym_sweep_seed(config))
        assert list(mine.prompt) == [e.prompt for e in examples]  # the held-out problems, one per sample
        assert row["reward"] == pytest.approx(sum(task.rewards(examples, list(mine.completion))) / 4)


def gym_sweep_seed(config) -> int:
    from bebop.rl.task_sweep import SWEEP_SEED

    return SWEEP_SEED + config.seed


@pytest.mark.parametrize("argv, match", [
    (["--tasks", "math"], "sweeps reasoning-gym tasks"),
    (["--grid", "max_terms=2,3"], "name the dataset"),
    (["--dataset", "chain_sum", "--tasks", SMALL], "not both"),
    (["--dataset", "chain_sum", "--grid", "terms"], "is not FIELD"),
    (["--tasks", "gym:chain_sum?terms=2"], "no setting 'terms'"),
    (["--temperatures", "-1"], "temperatures must be finite and >= 0"),
    (["--num-problems", "0"], "--num-problems must be a positive int"),
])
def test_task_sweep_misuse_is_one_line_and_exit_2(argv, match, tmp_path, capsys, monkeypatch):
    import bebop.policy

    monkeypatch.setattr(bebop.policy, "load_policy", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["task-sweep", "--run-dir", str(tmp_path / "run")] + argv) == 2
    assert match in one_error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_one_rl_step_on_a_gym_task(tmp_path):
    from bebop.runlog import load_run

    argv = ["rl", "--preset", "quick", "--task", SMALL, "--rollout", "none", "--steps", "1", "--sync", "--threads",
            "1", "--no-progress", "--out", str(tmp_path / "run")]
    assert main(argv) == 0
    run = load_run(tmp_path / "run")
    assert run.meta["task"] == SMALL and len(run.streams["train"]) == 1
    prompts = list(run.streams["samples"].prompt)
    assert prompts and {split_of(p.removesuffix("\n")) for p in prompts} == {"train"}  # RL draws training questions
    assert 0 <= run.streams["train"]["critic/score/mean"].iloc[0] <= 1
