"""User datasets as tasks (jsonl, parquet, save_to_disk) and the math-verify reward."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from bebop import tasks
from bebop.data.tasks import DatasetConfig, DatasetTask, check_task_names
from bebop.data.tasks.answers import final_answer, gold_answer, math_reward, math_rewards
from bebop.rl.config import RLConfig

SAMPLE = Path(__file__).resolve().parents[1] / "bebop" / "assets" / "data" / "gsm8k_sample.jsonl"
ROWS = [{"question": f"Tom has {n} apples and buys 2 more. How many now?", "answer": f"{n}+2=<<{n}+2={n + 2}>>"
         f"{n + 2}\n#### {n + 2}"} for n in range(1, 8)]


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f"jsonl:{path}"


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, str]:
    """The same rows as a jsonl file, a parquet file (written by pandas) and a save_to_disk directory."""
    import datasets
    import pandas as pd

    root = tmp_path_factory.mktemp("data")
    pd.DataFrame(ROWS).to_parquet(root / "rows.parquet")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(root / "saved"))
    datasets.DatasetDict({"test": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(root / "splits"))
    return {"jsonl": write_jsonl(root / "rows.jsonl", ROWS), "parquet": f"parquet:{root / 'rows.parquet'}",
            "disk": str(root / "saved"), "splits": str(root / "splits")}


@pytest.mark.parametrize("gold", ["Natalia sold 48/2 = <<48/2=24>>24 clips.\n#### 42", "42"])
@pytest.mark.parametrize("completion", ["so the answer is 42.", "\\boxed{42}", "we get 40+2 = 42\n#### 42",
                                        "so the answer is 42.<|im_end|>", "\\boxed{42}<eos>\\boxed{7}"])
def test_reward_gsm8k_right(gold, completion):
    assert math_reward(gold_answer(gold), completion) == 1.0


@pytest.mark.parametrize("completion", ["so the answer is 41.", "\\boxed{43}", "42 apples, then 3 more: 45",
                                        "", "\\boxed{{{", "#### ", "<|im_end|>", None, 42])
def test_reward_wrong_or_malformed_is_zero(completion):
    assert math_reward("42", completion) == 0.0


def test_reward_latex_and_text_answers():
    assert gold_answer("\\frac{1}{2}") == "\\frac{1}{2}"
    assert math_reward("\\frac{1}{2}", "so x = \\boxed{\\frac12}") == 1.0
    assert math_reward("\\frac{1}{2}", "the answer is 0.5") == 1.0  # math-verify equates the two
    assert math_reward("\\frac{1}{2}", "\\boxed{\\frac{1}{3}}") == 0.0
    assert math_reward("\\sqrt{2}", "\\boxed{\\sqrt 2}<|im_end|>") == 1.0
    assert math_reward("yes", "after checking:\nYes.") == 1.0  # math-verify cannot parse it: exact match
    assert math_reward("yes", "no") == 0.0
    assert final_answer("a \\boxed{x^{2}} b\n#### 3") == "x^{2}" and final_answer("w\n#### 5<eos>9") == " 5"


def test_rewards_off_the_main_thread_equal_the_main_threads():
    golds = ["42", "\\frac{1}{2}", "7", "yes"]
    completions = ["\\boxed{42}", "0.5", "answer: 8", "Yes"]
    here = math_rewards(golds, completions)
    there: dict = {}
    worker = threading.Thread(target=lambda: there.update(scores=math_rewards(golds, completions)))
    worker.start()
    worker.join()
    assert here == there["scores"] == [1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "disk"])
def test_sources_round_trip(sources, kind):
    task = tasks.get(sources[kind])
    assert isinstance(task, DatasetTask) and len(task) == len(ROWS) and task.name == sources[kind]
    examples = task.sample(len(ROWS), seed=0)
    assert sorted(e.meta["row"] for e in examples) == list(range(len(ROWS)))  # one pass: no repeats
    for e in examples:
        row = ROWS[e.meta["row"]]
        assert (e.prompt, e.answer, e.level, e.task) == (row["question"] + "\n", row["answer"], 1, task.name)
        right, wrong = gold_answer(row["answer"]), int(gold_answer(row["answer"])) + 1
        assert task.reward(e, f"{row['question']} so {right}.") == 1.0
        assert task.rewards([e, e], [f"\\boxed{{{wrong}}}", f"\\boxed{{{right}}}"]) == [0.0, 1.0]
    json.dumps([e.to_dict() for e in examples])  # run logs write examples as JSON


def test_sampling_seeded_prefix_stable_and_cycling(sources):
    task = tasks.get(sources["jsonl"])
    long = task.sample(3 * len(ROWS) + 2, seed=5)
    assert long == task.sample(3 * len(ROWS) + 2, seed=5)
    assert task.sample(4, seed=5) == long[:4]
    assert [e.meta["row"] for e in task.sample(len(ROWS), seed=6)] != [e.meta["row"] for e in long[:len(ROWS)]]
    for p in range(3):  # every pass over the rows is a permutation
        assert sorted(e.meta["row"] for e in long[p * len(ROWS):(p + 1) * len(ROWS)]) == list(range(len(ROWS)))
    with pytest.raises(ValueError, match="level must be one of"):
        task.sample(2, seed=0, level=2)
    with pytest.raises(ValueError, match="seed"):
        task.sample(2, seed=-1)
    with pytest.raises(ValueError, match="no teacher"):
        task.demonstration(long[0], __import__("torch").Generator())


def test_custom_keys_and_splits(tmp_path, sources):
    spec = write_jsonl(tmp_path / "custom.jsonl", [{"problem": "What is 1/2 + 0?", "solution": "\\frac{1}{2}"},
                                                    {"problem": "What is 6 * 7?", "solution": 42}])
    task = tasks.get(spec, DatasetConfig(prompt_key="problem", answer_key="solution"))
    by_row = {e.meta["row"]: e for e in task.sample(2, seed=0)}
    assert by_row[1].answer == "42" and by_row[0].prompt == "What is 1/2 + 0?\n"
    assert task.reward(by_row[0], "\\boxed{\\frac12}") == 1.0 and task.reward(by_row[1], "it is 42") == 1.0
    assert len(tasks.get(sources["splits"], DatasetConfig(split="test"))) == len(ROWS)
    with pytest.raises(ValueError, match=r"has no split 'train'; its splits: \['test'\]"):
        tasks.get(sources["splits"])


def test_misuse_is_one_clear_line(tmp_path, sources):
    cases = {
        "jsonl:" + str(tmp_path / "nope.jsonl"): "no such file",
        "parquet:" + str(tmp_path / "nope.parquet"): "no such file",
        "chess": r"unknown task 'chess'.*jsonl:PATH",
        str(tmp_path / "not_a_dir"): "unknown task",
        write_jsonl(tmp_path / "bad.jsonl", [{"q": "x", "answer": "1"}]): r"no prompt column 'question' "
                                                                           r"\(--prompt-key\); its columns: \['q', 'answer'\]",
        write_jsonl(tmp_path / "nums.jsonl", [{"question": 3, "answer": "1"}]): "holds int64, not text",
    }
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "broken.jsonl").write_text("{not json\n")
    cases["jsonl:" + str(tmp_path / "broken.jsonl")] = r"line 1 is not JSON \(Expecting property name"
    for spec, message in cases.items():
        with pytest.raises(ValueError, match=message) as err:
            tasks.get(spec)
        assert "\n" not in str(err.value), spec
    with pytest.raises(ValueError, match="no answer column 'label'.*its columns: \\['question', 'answer'\\]"):
        tasks.get(sources["jsonl"], DatasetConfig(answer_key="label"))
    with pytest.raises(ValueError, match="has no rows: the file is empty"):
        tasks.get("jsonl:" + str(tmp_path / "empty.jsonl"))
    with pytest.raises(ValueError, match="must be a DatasetConfig"):
        tasks.get(sources["jsonl"], tasks.MathConfig())
    with pytest.raises(ValueError, match="must be a non-empty string"):
        DatasetConfig(prompt_key="")


def test_task_names_are_checked_without_reading_and_built_once(sources, tmp_path):
    missing = "jsonl:" + str(tmp_path / "missing.jsonl")
    assert check_task_names(["math", sources["jsonl"]]) == ("math", sources["jsonl"])  # no read
    with pytest.raises(ValueError, match="no such file"):  # a missing file is refused at once, before torch loads
        check_task_names(["math", missing])
    # A job gets each task it names with its dataset columns; a built-in keeps its own default config.
    columns = DatasetConfig(prompt_key="question")
    built = {name: tasks.get(name, columns) for name in ["math", sources["jsonl"], sources["disk"]]}
    assert len(built[sources["jsonl"]]) == len(ROWS) and built["math"].name == "math"
    with pytest.raises(ValueError, match="no prompt column 'problem'"):
        tasks.get(sources["parquet"], DatasetConfig(prompt_key="problem"))
    with pytest.raises(ValueError, match="no such file"):
        tasks.get(missing)
    with pytest.raises(ValueError, match="unknown task"):
        check_task_names(["math", "chess"])
    with pytest.raises(ValueError, match="no task given"):
        check_task_names([])
    assert RLConfig(task=sources["jsonl"]).task == sources["jsonl"] and RLConfig(task=sources["disk"]).task
    with pytest.raises(ValueError, match="unknown task 'chess'"):
        RLConfig(task="chess")


def test_shipped_sample_loads_and_its_answers_verify():
    assert SAMPLE.is_file()
    task = tasks.get(f"jsonl:{SAMPLE}")
    assert len(task) >= 40
    examples = task.sample(len(task), seed=0)
    for e in examples:
        assert e.answer.rsplit("####", 1)[1].strip().isdigit() and e.prompt.isascii() and e.answer.isascii()
        assert task.reward(e, e.answer) == 1.0  # the worked solution itself ends in its answer
        assert task.reward(e, f"so the answer is \\boxed{{{int(gold_answer(e.answer)) + 1}}}") == 0.0
