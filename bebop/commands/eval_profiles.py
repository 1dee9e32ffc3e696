"""Named settings for `bebop eval-mtp --profile NAME`: a whole sweep in one word.

    bebop eval-mtp --profile real      # findings 1-3 on SmolLM2-135M-Instruct with its shipped ce and e2e_tv heads

A profile fills the options left at their defaults; any option given on the command line wins over it, so
`--profile real --num-prompts 64` is the real sweep with more prompts. `real`'s held-out prompts are the built-in
math task's (drawn with the eval seed, disjoint from the heads' training prompts) and bebop's HumanEval-layout code
sample, which the heads never saw; γ = 3 at T = 0.3-1.0, the temperatures that put SmolLM2's drafted positions at
0.08-2.8 nats (measured), where its heads were trained (T = 0.7) and its RL runs live (the reference runs: 0.01-2
nats at the drafted positions as GRPO learns, up to 4.1 where an entropy target pushes the policy). Above T = 1 its
entropy runs off toward the uniform distribution over 49,152 ids (6 nats at T = 1.3, 8-10 at T = 1.5-2), where
acceptance says nothing of the law. eval-mtp fits the law per task: the heads accept little of the code at any
entropy, so a line through both tasks would measure the gap between them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

CODE_SAMPLE = Path(__file__).resolve().parents[1] / "assets" / "data" / "code_sample.jsonl"
REAL_DURATION = ("over 2 hours on a 2-core CPU shared with other jobs (32 of its 40 cells took 1 h 49 min there, "
                 "70-440 s each); the progress bar shows the time left")  # docs/runs.md
PROFILES = {
    "real": dict(policy="smollm2", heads=["ce", "e2e_tv"], methods=["to", "rs"],
                 temperatures=[0.3, 0.5, 0.7, 0.85, 1.0], tasks=["math", f"jsonl:{CODE_SAMPLE}"], gamma=3,
                 num_prompts=8, max_new_tokens=32, threads=2),
}


class Untyped:
    """An option's default, marked as not given on the command line (so a profile may fill it); `apply_profile`
    unwraps it. It prints as the value, so help texts read as before."""

    def __init__(self, value):
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)

    def __str__(self) -> str:
        return str(self.value)


def add_profile_argument(parser: argparse.ArgumentParser) -> None:
    """Add --profile; call it after every option a profile sets, whose defaults it marks as untyped."""
    parser.add_argument("--profile", choices=sorted(PROFILES), default=None,
                        help="named settings for the options left at their defaults: real = SmolLM2-135M-Instruct "
                             "(--policy smollm2) with its ce and e2e_tv heads, math and code, T = 0.3-1.0 (0.08-2.8 "
                             f"nats, where its heads and RL runs live); {REAL_DURATION} (default: none)")
    keys = {k for profile in PROFILES.values() for k in profile}
    parser.set_defaults(**{k: Untyped(parser.get_default(k)) for k in keys})


def apply_profile(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with the profile's value for every option the command line did not give (a typed value wins, even one
    equal to the default), and every other untyped option's default."""
    profile = PROFILES.get(args.profile, {})
    values = {k: profile.get(k, v.value) for k, v in vars(args).items() if isinstance(v, Untyped)}
    return argparse.Namespace(**{**vars(args), **values})
