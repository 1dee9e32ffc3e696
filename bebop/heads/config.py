"""`TrainMTPConfig`: one pre-RL head training run (bebop.heads.train), validated up front."""

from __future__ import annotations

import math
import warnings
from dataclasses import InitVar, dataclass
from typing import ClassVar

from bebop.checks import OBJECTIVES, PRECISIONS, check_choice
from bebop.device import check_device_name
from bebop.data.prompts import PromptOptions, check_prompt_fields
from bebop.data.tasks import check_task_names

LR_SCHEDULES = ("constant", "cosine")
# Prompts per engine call while the corpus is generated: a few dozen rows keep a CPU's step near its best tokens/s,
# and each call's padded batch (rows that finish early idle until the longest does) small.
GENERATION_ROWS = 64


def learning_rate(config: TrainMTPConfig, step: int) -> float:
    """The learning rate of 0-based `step`: a linear warmup over `warmup_frac` of the steps, then the peak `lr`
    (constant) or a half cosine from it down to 0 at the last step (cosine: a run ends where it settled)."""
    warmup = max(1, round(config.warmup_frac * config.steps))
    if step < warmup:
        return config.lr * (step + 1) / warmup
    if config.lr_schedule == "constant":
        return config.lr
    done = (step + 1 - warmup) / max(1, config.steps - warmup)
    return config.lr * 0.5 * (1 + math.cos(math.pi * done))


@dataclass(frozen=True)
class TrainMTPConfig(PromptOptions):  # + prompt_key, answer_key, chat_template, system_prompt
    objective: str = "e2e_tv"
    depth: int = 5
    temperature: float = 1.0
    tasks: tuple[str, ...] = ("math", "code", "agent")
    num_sequences: int = 480  # self-generated sequences (per run, all tasks together)
    max_new_tokens: int = 240
    # How the corpus is generated (bebop.heads.corpus): a head spec that drafts while the policy writes it, verified
    # by RS at depth corpus_gamma (an int, or "auto"), which leaves the answers' distribution the policy's
    # (None: plain sampling); and the prompts per engine call.
    corpus_head: str | None = None
    corpus_gamma: int | str = 3
    corpus_rows: int = GENERATION_ROWS
    heldout_fraction: float = 0.1
    steps: int = 250
    batch_size: int = 16
    length_bucket: int = 32  # each batch's length rounded up to a multiple (bebop.heads.data: fewer shapes, less heap)
    lr: float = 1e-3
    warmup_frac: float = 0.03
    lr_schedule: str = "constant"  # after the warmup: "constant", or "cosine" down to 0 at the last step
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    eval_every: int = 50
    checkpoint_every: int = 50  # steps between checkpoints (0 = only at the end); --resume continues from the last
    init_from_backbone: bool = True
    init_head: str | None = None  # a head directory (save_head) to adapt instead of starting fresh
    # K: draft over the K ids carrying the most of the policy's probability on the corpus (bebop.draft_vocab);
    # None: the whole vocabulary (or, adapting a head that has one, its draft vocabulary)
    draft_vocab: int | None = None
    # fused features (bebop.models.mtp): backbone layers whose residual streams the head reads beside the top hidden,
    # cached once with the backbone's pass; () reads the top hidden alone (or, adapting a head, the init head's)
    feature_layers: tuple[int, ...] = ()
    # decoder layers in the head's block (bebop.models.mtp): None is 1 for a fresh head, the init head's when adapting;
    # adapting a shallower head grows it, each added layer starting as the identity
    head_layers: int | None = None
    seed: int = 0
    dtype: str = "auto"  # the compute dtype (CLI --dtype): "auto" | "bf16" | "fp32"
    device: str = "auto"  # "auto" (CUDA when present) | "cpu" | "cuda" | "cuda:N"
    threads: int = 1
    autocast: InitVar[str | None] = None  # the compute dtype's earlier name, still read (with a deprecation note)
    # Fields a resumed run may change (`bebop.runlog.session.config_changes`); any other difference is refused.
    RESUMABLE: ClassVar[tuple[str, ...]] = ("steps", "threads", "eval_every", "checkpoint_every")
    RENAMED: ClassVar[dict[str, str]] = {"autocast": "dtype"}  # earlier names of a saved config's keys

    def __post_init__(self, autocast: str | None = None) -> None:
        if autocast is not None:
            warnings.warn("TrainMTPConfig.autocast is now TrainMTPConfig.dtype", DeprecationWarning, stacklevel=3)
            object.__setattr__(self, "dtype", autocast)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; valid objectives: {', '.join(OBJECTIVES)}")
        check_prompt_fields(self)
        check_task_names(self.tasks)  # a dataset is read once, where the job builds its tasks
        for name in ("depth", "num_sequences", "max_new_tokens", "steps", "batch_size", "eval_every", "threads",
                     "corpus_rows", "length_bucket"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"TrainMTPConfig.{name} must be a positive int, got {getattr(self, name)!r}")
        if isinstance(self.checkpoint_every, bool) or not isinstance(self.checkpoint_every, int) \
                or self.checkpoint_every < 0:
            raise ValueError(f"TrainMTPConfig.checkpoint_every must be a non-negative int, got {self.checkpoint_every!r}")
        if not (isinstance(self.temperature, (int, float)) and 0 < self.temperature < math.inf):
            raise ValueError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if not 0 < self.heldout_fraction < 1 or not 0 <= self.warmup_frac < 1:
            raise ValueError("heldout_fraction must be in (0, 1) and warmup_frac in [0, 1)")
        if not self.lr > 0 or not self.grad_clip > 0:
            raise ValueError(f"lr and grad_clip must be > 0, got lr={self.lr}, grad_clip={self.grad_clip}")
        if self.draft_vocab is not None and (isinstance(self.draft_vocab, bool) or not isinstance(self.draft_vocab, int)
                                             or self.draft_vocab < 1):
            raise ValueError(f"TrainMTPConfig.draft_vocab must be a positive int or None, got {self.draft_vocab!r}")
        if self.corpus_gamma != "auto" and (isinstance(self.corpus_gamma, bool) or not isinstance(self.corpus_gamma, int)
                                            or self.corpus_gamma < 1):
            raise ValueError(f"TrainMTPConfig.corpus_gamma must be a positive int or 'auto', got {self.corpus_gamma!r}")
        if self.corpus_head is not None and (not isinstance(self.corpus_head, str) or not self.corpus_head):
            raise ValueError(f"TrainMTPConfig.corpus_head must be a head spec or None, got {self.corpus_head!r}")
        if not isinstance(self.feature_layers, tuple) or any(isinstance(t, bool) or not isinstance(t, int) or t < 0
                                                             for t in self.feature_layers) \
                or list(self.feature_layers) != sorted(set(self.feature_layers)):
            raise ValueError(f"TrainMTPConfig.feature_layers must be increasing layer indices, got {self.feature_layers!r}")
        if self.head_layers is not None and (isinstance(self.head_layers, bool) or not isinstance(self.head_layers, int)
                                             or self.head_layers < 1):
            raise ValueError(f"TrainMTPConfig.head_layers must be a positive int or None, got {self.head_layers!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        check_choice(self, "dtype", PRECISIONS)
        check_device_name(self.device)

    @classmethod
    def tiny(cls, objective: str = "e2e_tv") -> TrainMTPConfig:
        return cls(objective=objective, depth=3, tasks=("math",), num_sequences=8, max_new_tokens=24, steps=4,
                   batch_size=4, eval_every=2, heldout_fraction=0.25)

    def data_key(self) -> dict:
        """The settings that fix the self-generated data (a --data cache must match them and the policy)."""
        names = ("temperature", "tasks", "num_sequences", "max_new_tokens", "seed", "prompt_key", "answer_key",
                 "chat_template", "system_prompt")
        key = {k: getattr(self, k) for k in names}
        if self.corpus_head is not None:  # other samples of the same distribution: only where set (keys stay)
            key.update(corpus_head=self.corpus_head, corpus_gamma=self.corpus_gamma)
        if self.corpus_rows != GENERATION_ROWS:
            key["corpus_rows"] = self.corpus_rows
        return key
