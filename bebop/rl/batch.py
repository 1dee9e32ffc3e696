"""From prompts to a GRPO training batch: sample a group per prompt, generate, score, align (`Rollouts.collect`).

    examples (one per prompt, repeated group_size times, group by group)
      -> bebop.play.play                           # prompt ids, the task's stops, engine.generate
                                                        # (plain, TO or RS; multi-turn for agent tasks)
      -> task.rewards(examples, completion texts)       # texts without the stop that ended each row
      -> RolloutBatch: [N, L] tensors where position i holds token i+1 of prompt+completion

Alignment: a row is `prompt + completion`; the policy's logits at position i predict token i+1, so the
update runs the model on the whole row and reads logits[:, :-1] against tokens[:, 1:]. Completion token
j sits at target index len(prompt) - 1 + j. Only tokens the policy generated are trained on
(`policy_mask`): padding and environment replies (origin "env") are False. The behaviour log-probs are the
engine's own, taken under the sampling temperature: these are the denominators of the importance ratio,
which is what makes async RL (rollouts from a one-step-older policy) correct.

Multi-turn: for a task with an environment (`task.env`), the engine stops a row at a tool call, asks
`env(row, tokens so far)` for the reply, appends it and continues from the row's cached prefix.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from bebop.data.prompts import PromptFormat
from bebop.data.tasks import Task
from bebop.data.tokenizer import Tokenizer
from bebop.device import to_device
from bebop.engine.backend import RolloutBackend
from bebop.engine.rollout import GenerationConfig, Rollout
from bebop.play import play


@dataclass
class RolloutBatch:
    examples: list[Any]  # [N] task examples, group by group
    prompts: list[list[int]]  # [N] prompt token ids
    rollout: Rollout
    completions: list[str]  # [N] decoded completions as rewards see them (env replies included, final stop not)
    rewards: torch.Tensor  # [N] float32
    tokens: torch.Tensor  # [N, L] long: prompt + completion, right-padded
    lengths: torch.Tensor  # [N] long: real length of each row
    prompt_lengths: torch.Tensor  # [N] long
    targets: torch.Tensor  # [N, L-1] long: tokens[:, 1:]
    policy_mask: torch.Tensor  # [N, L-1] bool: target is a token the policy generated
    behaviour_logprobs: torch.Tensor  # [N, L-1] float32: log π_behaviour(target), 0 where masked
    policy_version: int  # number of updates the behaviour policy had seen
    gen_time_s: float  # generation + scoring wall time
    gen_interval: tuple[float, float]  # perf_counter() start and end of generation (overlap accounting)

    @property
    def num_policy_tokens(self) -> int:
        return int(self.policy_mask.sum())

    def to(self, device: torch.device) -> "RolloutBatch":
        """The training tensors on `device` (rollouts are built on the host: token lists, rewards from text)."""
        if self.tokens.device == torch.device(device):
            return self
        names = ("rewards", "tokens", "lengths", "prompt_lengths", "policy_mask", "behaviour_logprobs")
        moved = {name: to_device(getattr(self, name), device) for name in names}
        return dataclasses.replace(self, **moved, targets=moved["tokens"][:, 1:])


def sample_examples(task, prompts_per_step: int, group_size: int, seed: int, level: int | None = None) -> list:
    """prompts_per_step examples drawn for `seed`, each repeated group_size times (a group is contiguous)."""
    examples = task.sample(prompts_per_step, seed, level=level)
    return [e for e in examples for _ in range(group_size)]


@dataclass(frozen=True)
class Rollouts:
    """Where an RL run's batches come from: its task played through a rollout backend (bebop's engine on a snapshot
    of the policy, or vLLM: `bebop.engine.backend`), prompts in one format. `bebop.rl.build` composes it."""

    backend: RolloutBackend
    task: Task
    tokenizer: Tokenizer
    prompt_format: PromptFormat | None = None  # None: the raw text

    def collect(self, examples: Sequence[Any], config: GenerationConfig, *, policy_version: int = 0) -> RolloutBatch:
        """Generate a completion for every example, score it and build the aligned training tensors."""
        if not examples:
            raise ValueError("examples is empty: nothing to roll out")
        start = time.perf_counter()
        played = play(self.backend, self.tokenizer, self.task, examples, config, prompt_format=self.prompt_format)
        rewards = torch.tensor(self.task.rewards(list(examples), played.texts), dtype=torch.float32)  # [N]
        end = time.perf_counter()
        tensors = align(played.prompts, played.rollout, self.tokenizer.pad_id)
        return RolloutBatch(list(examples), played.prompts, played.rollout, played.texts, rewards, *tensors,
                            policy_version=policy_version, gen_time_s=end - start, gen_interval=(start, end))


def align(prompts: list[list[int]], rollout: Rollout, pad_id: int = 0):
    """(tokens [N, L], lengths [N], prompt_lengths [N], targets [N, L-1], policy_mask [N, L-1],
    behaviour_logprobs [N, L-1]) for rows prompt + completion; see the module docstring."""
    n = len(prompts)
    if len(rollout.tokens) != n:
        raise ValueError(f"rollout has {len(rollout.tokens)} rows for {n} prompts")
    lengths = [len(p) + len(c) for p, c in zip(prompts, rollout.tokens)]
    L = max(lengths)
    tokens = torch.full((n, L), pad_id, dtype=torch.long)
    mask = torch.zeros(n, L - 1, dtype=torch.bool)
    logprobs = torch.zeros(n, L - 1, dtype=torch.float32)
    for i, (prompt, completion) in enumerate(zip(prompts, rollout.tokens)):
        P, C = len(prompt), len(completion)
        tokens[i, :P] = torch.as_tensor(prompt, dtype=torch.long)
        if C == 0:
            continue
        tokens[i, P:P + C] = torch.as_tensor(completion, dtype=torch.long)
        mask[i, P - 1:P - 1 + C] = torch.as_tensor([o != "env" for o in rollout.origin[i]], dtype=torch.bool)
        logprobs[i, P - 1:P - 1 + C] = torch.as_tensor(rollout.logprobs[i], dtype=torch.float32)
    prompt_lengths = torch.tensor([len(p) for p in prompts], dtype=torch.long)
    return tokens, torch.tensor(lengths, dtype=torch.long), prompt_lengths, tokens[:, 1:], mask, logprobs
