"""Chat: everyday requests to an assistant (explain, advise, write, compare, rewrite), for head corpora and acceptance.

    task = bebop.data.tasks.get("chat")
    task.sample(4, seed=0)      # Example(prompt="Give me three tips for learning to swim.\\n", answer="", ...)
    task.heldout()              # requests of kinds the training split never asks

A head drafts for whatever its policy is asked; a corpus of math and code alone teaches it nothing about the prose of
an ordinary chat turn. These prompts are built from request templates and the subjects they take (`REQUESTS`), both
written here, so no data set has to be downloaded. One template in HELDOUT_EVERY (by a fixed hash of its text) is
held out: `heldout()` asks kinds of request the training split never shows.

There is no verifier for an open request: `verifiable` is False, `reward` raises (RL needs a reward; train-mtp and
eval-mtp use the prompts and the policy's answers only, and eval-mtp reports no reward for it).
"""

from __future__ import annotations

import hashlib
from typing import Sequence

from bebop.data.tasks.base import Example, Rng, Task

SPLITS = ("train", "heldout")
HELDOUT_EVERY = 4
TOPICS = ("photosynthesis", "compound interest", "the water cycle", "how vaccines work", "black holes", "inflation",
          "machine learning", "the French Revolution", "how a bicycle stays upright", "plate tectonics", "sleep",
          "recycling", "the immune system", "electric cars", "the stock market", "gravity", "rainbows", "tides",
          "the internet", "climate change", "volcanoes", "bread baking", "chess openings", "the solar system")
ACTIVITIES = ("learning to swim", "saving money", "studying for an exam", "running a first marathon", "cooking rice",
              "starting a vegetable garden", "writing a cover letter", "public speaking", "learning a language",
              "keeping a houseplant alive", "moving to a new city", "sleeping better", "training a puppy",
              "planning a road trip", "staying focused while working from home", "making friends as an adult")
PAIRS = (("a virus", "a bacterium"), ("weather", "climate"), ("a list", "a tuple in Python"), ("speed", "velocity"),
         ("a crocodile", "an alligator"), ("baking soda", "baking powder"), ("a lake", "a pond"),
         ("RAM", "storage"), ("a comet", "an asteroid"), ("a simile", "a metaphor"), ("debit", "credit"),
         ("an ocean", "a sea"), ("a frog", "a toad"), ("mass", "weight"))
SUBJECTS = ("a rainy morning", "an old lighthouse", "a cat who loves boxes", "the first day of school", "autumn leaves",
            "a robot learning to paint", "a lost umbrella", "the smell of coffee", "a city at night", "a snowstorm",
            "a friendly dragon", "the last day of summer", "a busy train station", "a garden in spring")
SENTENCES = ("hey can u send me the report asap", "the meeting got moved cause nobody could come",
             "i think we should maybe try a different approach or something", "thanks a lot for the help yesterday",
             "the product is kinda good but its too expensive", "we gotta finish this by friday no matter what",
             "sorry im late, traffic was crazy", "can we talk about the budget sometime this week")
AUDIENCES = ("a ten-year-old", "a beginner", "a busy manager", "my grandmother", "a high school student")
FORMS = ("short poem", "haiku", "two-sentence story", "limerick", "short product description", "short speech")
# (template, the slots it takes): each slot draws from the list of that name
REQUESTS = (
    ("Explain {topic} to {audience}.", ("topic", "audience")),
    ("Give me three tips for {activity}.", ("activity",)),
    ("What is the difference between {a} and {b}?", ("pair",)),
    ("Write a {form} about {subject}.", ("form", "subject")),
    ("Rewrite this sentence so it sounds professional: \"{sentence}\"", ("sentence",)),
    ("Summarize what {topic} is in two sentences.", ("topic",)),
    ("I want to get better at {activity}. Where should I start?", ("activity",)),
    ("Why does {topic} matter in everyday life?", ("topic",)),
    ("Make a short checklist for {activity}.", ("activity",)),
    ("Tell me a fun fact about {topic}.", ("topic",)),
    ("Which is more common, {a} or {b}, and why?", ("pair",)),
    ("Write a friendly text message inviting a friend to talk about {topic}.", ("topic",)),
    ("Fix the grammar in this message: \"{sentence}\"", ("sentence",)),
    ("What are common mistakes people make when {activity}?", ("activity",)),
    ("Describe {subject} in three vivid sentences.", ("subject",)),
    ("Give an analogy that explains {topic} to {audience}.", ("topic", "audience")),
)
SLOTS = {"topic": TOPICS, "audience": AUDIENCES, "activity": ACTIVITIES, "pair": PAIRS, "form": FORMS,
         "subject": SUBJECTS, "sentence": SENTENCES}


def split_of(template: str) -> str:
    digest = hashlib.sha256(template.encode()).digest()
    return "heldout" if int.from_bytes(digest[:8], "big") % HELDOUT_EVERY == 0 else "train"


class ChatTask(Task):
    """Requests drawn from the templates of one split (module docstring)."""

    name = "chat"
    levels = (1,)
    verifiable = False

    def __init__(self, split: str = "train"):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        self.split = split
        self.requests = [r for r in REQUESTS if split_of(r[0]) == split]

    def heldout(self) -> ChatTask:
        return ChatTask("heldout")

    def _example(self, rng: Rng, level: int) -> Example:
        template, slots = rng.choice(self.requests)
        fill = {}
        for slot in slots:
            value = rng.choice(SLOTS[slot])
            fill.update({"a": value[0], "b": value[1]} if slot == "pair" else {slot: value})
        return Example(prompt=template.format(**fill) + "\n", answer="", level=1, task=self.name,
                       meta={"template": template, "split": self.split})

    def reward(self, example: Example, completion: str) -> float:
        raise ValueError("task 'chat' has no verifier (open requests): train-mtp and eval-mtp use its prompts, "
                         "rl needs a task with a reward")

    def rewards(self, examples: Sequence[Example], completions: Sequence[str]) -> list[float]:
        return [self.reward(e, c) for e, c in zip(examples, completions)]

    def _demonstrate(self, example: Example, rng: Rng, wrong: bool) -> str:
        raise ValueError("task 'chat' has no teacher for demonstrations: train-mtp and eval-mtp use its prompts")
