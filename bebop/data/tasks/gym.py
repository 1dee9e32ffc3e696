"""reasoning-gym datasets as bebop tasks: procedural problems with a difficulty knob, generated and scored offline.

    task = bebop.data.tasks.get("gym:chain_sum?max_terms=2&max_digits=1")   # the spec: `gym_spec`
    task.sample(8, seed=0)        # Example(prompt=the dataset's question + "\\n", answer="7", level=1, meta=...)
    task.reward(example, "4 + 3 = 7")                                        # 1.0, the dataset's own scorer
    task.heldout().sample(64, seed=0)                                        # problems RL never trains on

Prompt: the dataset's question as it is, then a newline. Its questions already ask for what their scorer reads
("State the final answer to the following arithmetic problem: 4 + 3 ="), and it reads the same as a chat user turn
or as a raw prompt. No answer-format instruction is added, by measurement (docs/tasks.md): on SmolLM2-135M-Instruct
(chat template, 48 held-out two-term one-digit chain sums) asking for a final line `answer: <your answer>` cut the
mean reward at T = 1 from 26% to 5% and greedy from 25% to 7%, and the model wrote that line in at most 2 of 48.

Answer extraction (what the scorer is handed): the text of the last `answer:` line (bebop's rule, `base`; case and
markdown emphasis aside), else, when the reference answer is a number, the last number in the completion, else its
last non-empty line. Last rather than first number, by the same measurement: the model answers "8 - 1 = 7" or "the
answer to 5 + 1 is 6", where the first number is an operand; at T = 1 the first number scored 6%, the last 26%.

Reward: the dataset's own `score_answer(answer, entry)`: 1.0 for the right answer, partial credit for some near
misses (chain_sum: len(gold)/len(answer) when the answer contains the gold, e.g. 0.5 for "-7" when it is 7), 0.0
otherwise and for no answer. Malformed output is 0.0, never an error.

Problems: item i of the stream for `seed` is reasoning-gym's item with seed `seed * STREAM + i` (its datasets draw
item j of seed s from `random.Random(s + j)`), so `sample(k, seed)` is a prefix of `sample(n, seed)` and streams of
different seeds share no item seed (within 2^20 draws each). Splits: a question is held out when the SHA-256 of its
text falls in one of HELDOUT_EVERY buckets, else it is a training question; each split's stream keeps only its own
questions, so train and held-out share no question even where a small setting has only a few hundred distinct ones
(two one-digit terms: 200, 46 held out), which disjoint seed ranges alone would not ensure. A dataset is a single
level (`levels == (1,)`): the difficulty is in the spec. It has no teacher: `demonstration` raises (`bebop pretrain`
teaches the built-ins).
"""

from __future__ import annotations

import hashlib
import re

from bebop.data.tasks.base import Example, Rng, Task, strip_completion
from bebop.data.tasks.gym_spec import GymSpec, parse_spec, require_gym

# SmolLM2-135M-Instruct's task (docs/tasks.md): two one-digit terms, the cell of `bebop task-sweep` where it starts at
# 17% mean reward at T = 1 and greedy is 26 points better (minimum terms and digits are 2 and 1 by default)
SMOLLM2_TASK = "gym:chain_sum?max_terms=2&max_digits=1"
SPLITS = ("train", "heldout")
STREAM = 1 << 20  # item seeds per task seed: streams of different seeds overlap only past 2^20 draws
HELDOUT_EVERY = 4  # one question in 4 (by the hash of its text) is held out
MAX_DRAWS = 32  # draws per wanted problem before a split counts as (nearly) empty; about 4 are needed
_ANSWER_LINE = re.compile(r"^[ \t*_#>]*answer[ \t*_]*:[ \t*_]*(.*?)[ \t*_.]*$", re.IGNORECASE | re.MULTILINE)
_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")


def split_of(question: str) -> str:
    """"heldout" for one question text in HELDOUT_EVERY (a fixed hash, the same in every process), else "train"."""
    digest = hashlib.sha256(question.encode("utf-8")).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % HELDOUT_EVERY == 0 else "train"


def answer_line(completion: str) -> str | None:
    """The text of the completion's last non-empty `answer:` line, or None."""
    if not isinstance(completion, str):
        return None
    found = [m.strip() for m in _ANSWER_LINE.findall(strip_completion(completion)) if m.strip()]
    return found[-1] if found else None


def stated_answer(completion: str, numeric: bool) -> str | None:
    """What the completion answers (module docstring): its last `answer:` line, else its last number when the
    reference answer is a number (`numeric`), else its last non-empty line; None when there is nothing."""
    line = answer_line(completion)
    if line is not None or not isinstance(completion, str):
        return line
    text = strip_completion(completion)
    if numeric:
        numbers = _NUMBER.findall(text)
        return numbers[-1] if numbers else None
    lines = [t.strip() for t in text.splitlines() if t.strip()]
    return lines[-1] if lines else None


def is_number(text: str) -> bool:
    """Whether a reference answer is one number (then a completion without an answer line answers its last one)."""
    return _NUMBER.fullmatch(text.strip()) is not None


class GymTask(Task):
    """One reasoning-gym dataset at the difficulty its spec sets, one split of its questions."""

    levels = (1,)

    def __init__(self, spec: str | GymSpec, split: str = "train"):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.spec = spec if isinstance(spec, GymSpec) else parse_spec(spec)
        self.name = spec if isinstance(spec, str) else spec.text  # what examples and run logs carry
        self.split = split
        factory = require_gym()
        # The scorer only: its seed and size do not matter (`score_answer` reads the entry it is handed).
        self._scorer = factory.create_dataset(self.spec.dataset, seed=0, size=1, **self.spec.config)

    def heldout(self) -> "GymTask":
        """The same dataset and settings, its held-out questions (the name stays, so examples move between them)."""
        task = GymTask(self.spec, "heldout")
        task.name = self.name
        return task

    def sample(self, n: int, seed: int, *, level: int | None = None) -> list[Example]:
        """n problems of this split, the stream for `seed` (module docstring)."""
        self._check_sample(n, level)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        draws = MAX_DRAWS * n + HELDOUT_EVERY * 16  # ample for a split of 1/HELDOUT_EVERY of the questions
        dataset = require_gym().create_dataset(self.spec.dataset, seed=seed * STREAM, size=draws,
                                               **self.spec.config)
        out = []
        for index in range(draws):
            if len(out) == n:
                break
            item = dataset[index]
            if split_of(item["question"]) == self.split:
                out.append(self._to_example(item, seed * STREAM + index))
        if len(out) < n:
            raise ValueError(f"task {self.name!r}: {len(out)} {self.split} problems in {draws} draws, {n} wanted: "
                             "these settings leave too few distinct questions to split")
        return out

    def _to_example(self, item: dict, item_seed: int) -> Example:
        prompt = item["question"].rstrip() + "\n"  # no format instruction: module docstring
        meta = {"question": item["question"], "metadata": item["metadata"], "item_seed": item_seed,
                "split": self.split}
        return Example(prompt=prompt, answer=str(item["answer"]), level=1, meta=meta, task=self.name)

    def reward(self, example: Example, completion: str) -> float:
        """The dataset's score of the stated answer (0.0 when there is none, or when the scorer fails on it)."""
        self._check(example)
        answer = stated_answer(completion, numeric=is_number(example.answer))
        if answer is None:
            return 0.0
        entry = {"question": example.meta["question"], "answer": example.answer,
                 "metadata": example.meta["metadata"]}
        try:
            return float(self._scorer.score_answer(answer, entry))
        except Exception:  # a scorer's parse of odd model text is its problem, never the RL step's
            return 0.0

    def _demonstrate(self, example: Example, rng: Rng, wrong: bool) -> str:
        raise ValueError(f"task {self.name!r} comes from reasoning-gym: it has no teacher for demonstrations "
                         "(bebop pretrain trains on the built-in tasks); train-mtp, eval-mtp and rl use its prompts")
