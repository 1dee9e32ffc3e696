"""`RLConfig`: everything one GRPO run needs, validated up front so a typo fails before any work.

`method` is how rollouts are decoded ("none" = plain decoding, "to" / "rs" = speculative with the MTP head,
target-only or rejection-sampling verification; the CLI's `--rollout`, and the field's name before), `mtp` is what
happens to the head during RL ("frozen", the paper's recipe; "online-tv" / "online-ce" train it on each
step's fresh rollouts with its own optimiser), `mode` is "async" (generation of step t+1 overlaps the
update of step t) or "sync".

`entropy_coef` / `entropy_target` are the GRPO loss's entropy bonus (TRL's names; a constant coefficient, or its
adaptive rule toward a target entropy, with TRL's bounds and step: `bebop.rl.entropy_control`). `shadow_heads`
names heads scored on every step's rollouts beside the run's own (`bebop.rl.shadow_spec`, `bebop.rl.shadow`).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from typing import Any, ClassVar

from bebop.checks import PRECISIONS, check_choice, check_ints, check_number
from bebop.device import check_device_name
from bebop.data.prompts import PromptOptions, check_prompt_fields
from bebop.data.tasks import check_task_names
from bebop.engine.config import ADAPTIVE, GenerationConfig, deepest
from bebop.rl.entropy_control import COEF_DELTA, COEF_MAX, COEF_MIN
from bebop.rl.shadow_spec import parse_shadow_specs

TASKS = ("math", "code", "agent")
ROLLOUTS = ("none", "to", "rs")  # RLConfig.method's values: how rollouts are decoded
MTP_STRATEGIES = ("frozen", "online-tv", "online-ce")
MODES = ("async", "sync")
BACKENDS = ("bebop", "vllm")  # who generates the rollouts: bebop's engine, or an in-process vLLM (bebop.engine.vllm)
PRESETS = ("quick", "full")
# The fields each preset sets (the rest are RLConfig's defaults).
PRESET_VALUES = {
    "quick": dict(steps=16, prompts_per_step=8, group_size=4, max_new_tokens=96, lr=3e-5, checkpoint_every=4),
    "full": dict(steps=200, prompts_per_step=16, group_size=8, max_new_tokens=160, lr=2e-5, checkpoint_every=20),
}
RENAMED = {"rollout": "method", "gen_dtype": "dtype"}  # earlier field names, still read: keyword arguments (with a
# deprecation note), a saved config's keys


@dataclass(frozen=True)
class RLConfig(PromptOptions):  # + prompt_key, answer_key, chat_template, system_prompt
    # Fields a resumed run may change (`bebop.runlog.session.config_changes`); any other difference is refused.
    RESUMABLE: ClassVar[tuple[str, ...]] = ("steps", "threads", "checkpoint_every", "samples_per_step",
                                            "micro_batch_tokens", "share_prompts", "device")
    RENAMED: ClassVar[dict[str, str]] = RENAMED

    task: str = "math"
    method: str = "rs"  # how rollouts are decoded: one of ROLLOUTS
    mtp: str = "frozen"
    mode: str = "async"
    steps: int = 20
    prompts_per_step: int = 8
    group_size: int = 4  # completions per prompt; advantages are normalised within a group
    max_new_tokens: int = 96  # per completion, environment replies included
    temperature: float = 1.0
    # draft depth for "to" / "rs"; "auto": chosen per engine step in 0..max_gamma; "rows": each row's, per step
    gamma: int | str = 3
    max_gamma: int = 5  # with gamma="auto" or "rows": the deepest draft a step (a row) may take
    lr: float = 1e-4
    grad_clip: float = 1.0
    clip_eps: float = 0.2
    kl_coef: float = 0.0  # > 0 adds β·KL(π_θ ‖ π_ref) against a frozen copy of the starting policy
    mtp_lr: float = 1e-4  # online strategies: the head's own optimiser
    mtp_grad_clip: float = 1.0
    mtp_depth: int | None = None  # chain depth of the online head loss; None: the depth rollouts draft (online_depth)
    level: int | None = None  # task difficulty level (None = the task's mix)
    checkpoint_every: int = 5  # steps between checkpoints (0 = only at the end)
    samples_per_step: int = 4  # completions logged to the `samples` stream per step
    seed: int = 0
    dtype: str = "auto"  # the compute dtype (rollout snapshot, update autocast): "auto" (bf16 where fast) | fp32 | bf16
    threads: int | None = None  # torch threads per phase; None = half the cores (generation and update each)
    micro_batch_tokens: int = 2048  # computed tokens per update micro-batch of prompt groups (0 = one batch)
    share_prompts: bool = True  # the update computes each prompt once per group (False: once per row)
    device: str = "auto"  # "auto" (CUDA when present) | "cpu" | "cuda" | "cuda:N"; a resume may change it
    backend: str = "bebop"  # rollouts from "bebop"'s engine or "vllm" (colocated, weights pushed after each update)
    entropy_coef: float = 0.0  # the loss's entropy bonus c (0: none); with entropy_target, the adaptive rule's start
    entropy_target: float | None = None  # nats: TRL's adaptive rule raises c while the entropy is at or below it
    entropy_coef_min: float = COEF_MIN  # the adaptive rule's bounds on c and its step per RL step (TRL's defaults)
    entropy_coef_max: float = COEF_MAX
    entropy_coef_delta: float = COEF_DELTA
    shadow_heads: tuple[str, ...] = ()  # [LABEL=][STRATEGY:]HEAD each: scored on every step's rollouts

    def __post_init__(self) -> None:
        check_task_names((self.task,))  # a built-in, a dataset file that exists or a gym spec; read where it is got
        check_choice(self, "method", ROLLOUTS, label="rollout method")
        for name, options in (("mtp", MTP_STRATEGIES), ("mode", MODES), ("backend", BACKENDS),
                              ("dtype", PRECISIONS)):
            check_choice(self, name, options)
        self._check_depth()
        check_ints(self, ("steps", "prompts_per_step"), low=1)
        check_ints(self, ("mtp_depth", "threads"), low=1, also=(None,))
        check_ints(self, ("group_size",), low=2)  # GRPO compares within a group
        check_ints(self, ("checkpoint_every", "samples_per_step", "seed", "micro_batch_tokens"), low=0)
        for name in ("lr", "mtp_lr", "kl_coef"):
            check_number(self, name, low=0)
        for name in ("grad_clip", "mtp_grad_clip"):
            check_number(self, name, low=0, open_low=True)
        check_number(self, "clip_eps", low=0, high=1, open_low=True, open_high=True)
        check_prompt_fields(self)
        check_device_name(self.device)
        if not isinstance(self.share_prompts, bool):
            raise ValueError(f"RLConfig.share_prompts must be a bool, got {self.share_prompts!r}")
        if self.mtp != "frozen" and self.method == "none":
            raise ValueError(f"mtp={self.mtp!r} trains the head during RL, which needs rollout method (--rollout) "
                             "'to' or 'rs' (with 'none' there is no head)")
        self._check_entropy_fields()
        if isinstance(self.shadow_heads, str) or not all(isinstance(s, str) for s in self.shadow_heads):
            raise ValueError(f"RLConfig.shadow_heads must be a sequence of head specs, got {self.shadow_heads!r}")
        object.__setattr__(self, "shadow_heads", tuple(self.shadow_heads))  # a saved config's list reads back
        parse_shadow_specs(self.shadow_heads)

    def _check_depth(self) -> None:
        """What the engine is asked for is checked by building it, once (`generation`, the template every rollout
        call's config is made from: max_new_tokens, temperature, γ, max_gamma, method, by the engine's rules, under
        this config's names); what RL adds is checked here."""
        check_ints(self, ("gamma",), low=1, also=ADAPTIVE)  # plain decoding is --rollout none, not γ 0
        check_number(self, "temperature", low=0, open_low=True)  # RL samples: no greedy rollouts
        if self.gamma in ADAPTIVE and self.backend == "vllm":
            raise ValueError(f"RLConfig.gamma {self.gamma!r} chooses depths in bebop's engine, and vLLM's "
                             "speculative config fixes it at start: with RLConfig.backend 'vllm' give an int depth "
                             "(RLConfig.gamma 3, say)")
        try:
            self.generation  # built here, carried from here on
        except ValueError as err:
            raise ValueError(str(err).replace("GenerationConfig.", "RLConfig.")) from None

    def _check_entropy_fields(self) -> None:
        check_number(self, "entropy_coef", low=-math.inf, high=math.inf, open_low=True, open_high=True)
        check_number(self, "entropy_coef_min", low=0)  # TRL's rule is a floor: a negative c would penalise
        check_number(self, "entropy_coef_max", low=self.entropy_coef_min, high=math.inf, open_high=True)
        check_number(self, "entropy_coef_delta", low=0, high=math.inf, open_low=True, open_high=True)
        if self.entropy_target is not None:
            check_number(self, "entropy_target", low=0, high=math.inf, open_high=True)
            check_number(self, "entropy_coef", low=self.entropy_coef_min, high=self.entropy_coef_max)

    @property
    def batch_size(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def uses_head(self) -> bool:
        return self.method != "none"

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "RLConfig":
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; valid names: {list(PRESETS)}")
        return getattr(cls, name)(**overrides)

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> "RLConfig":
        """The config a run saved (`to_dict`: config.json, a checkpoint), its earlier field names read as today's."""
        return cls(**renamed(saved, note=False))

    @classmethod
    def quick(cls, **overrides: Any) -> "RLConfig":
        """A few minutes on 2 CPU cores with the embedded default."""
        return cls(**{**PRESET_VALUES["quick"], **renamed(overrides)})

    @classmethod
    def full(cls, **overrides: Any) -> "RLConfig":
        """A longer run (tens of minutes on CPU; minutes on a GPU)."""
        return cls(**{**PRESET_VALUES["full"], **renamed(overrides)})

    @classmethod
    def tiny(cls, **overrides: Any) -> "RLConfig":
        """Seconds per run, for tests."""
        base = dict(steps=3, prompts_per_step=2, group_size=2, max_new_tokens=12, gamma=2,
                    lr=1e-3, checkpoint_every=1, samples_per_step=2, dtype="fp32", threads=1)
        return cls(**{**base, **renamed(overrides)})

    @cached_property
    def generation(self) -> GenerationConfig:
        """The engine's `GenerationConfig` of this run's rollouts, the one place an RL config becomes one, built (and
        so checked) once when the config is made: method "none" is plain decoding (γ 0, no draft to verify), else
        the run's method and depth; under γ "auto" the engine's depth controller chooses each step's γ in
        0..max_gamma. Its seed is the run's: the rollout backend is built from it as it is, and each step's call
        from it with that step's and rank's seed (`Trainer`: `dataclasses.replace(generation, seed=...)`)."""
        drafts = {"gamma": self.gamma, "method": self.method} if self.uses_head else {"gamma": 0}
        return GenerationConfig(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                                max_gamma=self.max_gamma, seed=self.seed, **drafts)

    @property
    def draft_depth(self) -> int:
        """As deep as rollouts draft: gamma, or max_gamma under "auto" (the depth shadow heads are scored at)."""
        return deepest(self.gamma, self.max_gamma)

    @property
    def online_depth(self) -> int:
        """The online head loss's chain depth: mtp_depth, else as deep as rollouts draft (`draft_depth`)."""
        return self.draft_depth if self.mtp_depth is None else self.mtp_depth

    def replace(self, **changes: Any) -> "RLConfig":
        return replace(self, **renamed(changes))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def renamed(fields: dict[str, Any], *, note: bool = True) -> dict[str, Any]:
    """`fields` with earlier field names (`RENAMED`) spelt as today's; `note`: a deprecation note for each (keyword
    arguments; a saved config's keys are read quietly)."""
    for old in fields.keys() & RENAMED.keys():
        if note:
            warnings.warn(f"RLConfig.{old} is now RLConfig.{RENAMED[old]}", DeprecationWarning, stacklevel=3)
    return {RENAMED.get(k, k): v for k, v in fields.items()}
