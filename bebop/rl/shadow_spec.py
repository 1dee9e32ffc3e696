"""What `--shadow-heads` names: heads scored beside an RL run's own (`bebop.rl.shadow`), read without torch so a
config is checked before anything loads.

    [LABEL=][STRATEGY:]HEAD

    HEAD       a head as `--head` takes it (a head of the policy, 'embedded' or its objective, a save_head directory)
    STRATEGY   frozen (default): the head as loaded, never changed
               online-tv / online-ce: a copy of it trained on every step's rollouts with its own optimiser (e2e TV or
               hard CE, `bebop.rl.online_mtp`), scored before its update
    LABEL      what the `shadow` stream calls it; default HEAD's name (a directory's last part), prefixed by its
               strategy when online: `ce`, `online-tv:e2e_tv`

The run's own head is always scored too, under the label `rollout` (reserved).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bebop.policy import head_label

SHADOW_STRATEGIES = ("frozen", "online-tv", "online-ce")
ROLLOUT_LABEL = "rollout"  # the run's own head in the shadow stream


@dataclass(frozen=True)
class ShadowSpec:
    label: str
    strategy: str  # one of SHADOW_STRATEGIES
    head: str  # the head spec, as --head takes it


def parse_shadow_spec(text: str) -> ShadowSpec:
    """One `--shadow-heads` entry (module docstring); ValueError naming what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"a shadow head must be a non-empty string, got {text!r}")
    label, has_label, rest = text.partition("=")
    if not has_label:
        label, rest = "", text
    prefix, has_strategy, head = rest.partition(":")
    strategy = prefix if has_strategy and prefix in SHADOW_STRATEGIES else "frozen"
    if strategy == "frozen" and not (has_strategy and prefix == "frozen"):
        head = rest  # no strategy prefix: the whole rest names the head (a path may hold ':')
    if not head or (has_label and not label):
        raise ValueError(f"shadow head {text!r}: expected [LABEL=][STRATEGY:]HEAD with STRATEGY one of "
                         f"{list(SHADOW_STRATEGIES)}")
    if not label:
        label = head_label(head) if strategy == "frozen" else f"{strategy}:{head_label(head)}"
    return ShadowSpec(label, strategy, head)


def parse_shadow_specs(texts: Sequence[str]) -> list[ShadowSpec]:
    """Every entry parsed, labels unique and none the reserved `rollout`."""
    specs = [parse_shadow_spec(t) for t in texts]
    labels = [s.label for s in specs]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ValueError(f"shadow heads labelled {repeated} more than once: name them apart with LABEL=HEAD")
    if ROLLOUT_LABEL in labels:
        raise ValueError(f"the shadow-head label {ROLLOUT_LABEL!r} is the run's own head's: choose another LABEL")
    return specs
