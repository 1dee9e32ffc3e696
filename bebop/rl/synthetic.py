"""Synthetic RL runs: realistic-looking run directories without training anything.

They exist so the dashboard can be previewed (and tested) before any real run does, and they are
written through the same `RunWriter` and `SpecCounters` a real run uses, so every stream, name and
counter is the real thing; only the numbers are simulated. The simulation follows PAPER §3 on purpose:

- the policy's entropy drifts over the run (RL changes it) and per-token entropies are heavy-tailed
  around that mean, as real token entropies are;
- each drafted token is accepted with probability α(H) = a - b·H: target-only (TO) and RS with a CE/KL
  head have a steep b, RS with a TV-trained head is almost flat; an online-CE strategy slowly drags the
  head back toward the CE behaviour (finding 4);
- generation time follows the accept length (tokens per verify step over the cost of a verify step),
  so MTP runs are faster by roughly the theoretical speedup.

    bebop preview runs/preview            # five finished runs of the paper's comparisons
    bebop preview runs/preview --live 1   # ... plus one that grows by a step every second
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch

from bebop.losses import OBJECTIVES
from bebop.metrics import ENTROPY_BIN_EDGES, SpecCounters
from bebop.rl.config import MODES, MTP_STRATEGIES, ROLLOUTS
from bebop.runlog import RunWriter
from bebop.runlog.setup import rl_setup

ROWS = 32  # rollouts decoded together per step
_WORDS = [" Let", " x", " =", " 3", " +", " 4", " so", " the", " answer", " is", " 7", ".", " We", " add",
          " both", " sides", " then", " 12", " -", " 5", " check", ":", " true", " step", "\n"]


@dataclass(frozen=True)
class SyntheticConfig:
    """One simulated run. Acceptance per draft token is clip(accept_a - accept_b·H, 0.02, 0.99)."""

    name: str = "synthetic"
    task: str = "math"
    rollout: str = "rs"
    mtp_objective: str | None = "e2e_tv"
    mtp_strategy: str | None = "frozen"
    gamma: int = 3
    mode: str = "async"
    steps: int = 60
    drafts_per_step: int = 96
    samples_per_step: int = 2
    sample_tokens: int = 40
    entropy_start: float = 0.25  # nats; the mean policy entropy at the first and at the last step
    entropy_end: float = 0.6
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rollout not in ROLLOUTS:
            raise ValueError(f"rollout must be one of {ROLLOUTS}, got {self.rollout!r}")
        if self.rollout != "none" and self.mtp_objective not in OBJECTIVES:
            raise ValueError(f"mtp_objective must be one of {OBJECTIVES} for rollout {self.rollout!r}")
        if self.rollout != "none" and self.mtp_strategy not in MTP_STRATEGIES:
            raise ValueError(f"mtp_strategy must be one of {MTP_STRATEGIES} for rollout {self.rollout!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        for field_name in ("gamma", "steps", "drafts_per_step", "sample_tokens"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{field_name} must be >= 1, got {getattr(self, field_name)}")
        if self.samples_per_step < 0:
            raise ValueError(f"samples_per_step must be >= 0, got {self.samples_per_step}")
        if not (self.entropy_start > 0 and self.entropy_end > 0):
            raise ValueError("entropy_start and entropy_end must be > 0 nats")

    @classmethod
    def tiny(cls) -> SyntheticConfig:
        return cls(name="tiny", steps=8, drafts_per_step=16, samples_per_step=1, sample_tokens=12)

    @property
    def accept_law(self) -> tuple[float, float]:
        """(a, b) of α = a - b·H for this rollout/objective, as measured (README, the four findings):
        RS accepts at least what TO does at every entropy (finding 2), TO falls faster with entropy (RS's slope
        about 0.7x TO's), and a TV-trained head under RS is almost flat."""
        if self.rollout == "to":
            return 0.95, 0.60
        if self.mtp_objective in ("tv", "e2e_tv"):
            return 0.93 if self.mtp_objective == "e2e_tv" else 0.91, 0.04
        return 0.95, 0.42


def preview_configs(steps: int = 60) -> list[SyntheticConfig]:
    """The paper's comparisons: no MTP, TO, RS with a CE head, RS with an e2e TV head (frozen and online CE)."""
    return [
        SyntheticConfig(name="no-mtp", rollout="none", mtp_objective=None, mtp_strategy=None, steps=steps, seed=1),
        SyntheticConfig(name="to-ce", rollout="to", mtp_objective="ce", steps=steps, seed=2),
        SyntheticConfig(name="rs-ce", rollout="rs", mtp_objective="ce", steps=steps, seed=3),
        SyntheticConfig(name="rs-e2e_tv", rollout="rs", mtp_objective="e2e_tv", steps=steps, seed=4),
        SyntheticConfig(name="rs-e2e_tv-online-ce", rollout="rs", mtp_objective="e2e_tv",
                        mtp_strategy="online-ce", steps=steps, seed=5),
    ]


class SyntheticRun:
    """Writes a simulated run step by step (`advance`), so tests can grow a run while it is watched."""

    def __init__(self, run_dir: str | Path, config: SyntheticConfig, *, resume: bool = False) -> None:
        self.config = config
        self.writer = RunWriter(run_dir, config, kind="rl", name=config.name, resume=resume,
                                meta_extra={"synthetic": True, **self.setup}, entropy_bin_edges=ENTROPY_BIN_EDGES)
        self.generator = torch.Generator().manual_seed(config.seed)
        last = self.writer.last_step
        self.step = 0 if last is None else last + 1
        self.time_s, self.tokens = 0.0, 0
        self.online_drift = 0.0  # how far online CE updates have pulled a TV head toward CE behaviour

    @property
    def setup(self) -> dict:
        """meta.json's setup keys, as a real RL run writes them."""
        cfg = self.config
        return rl_setup(task=cfg.task, rollout=cfg.rollout, mode=cfg.mode, mtp_objective=cfg.mtp_objective,
                        mtp_strategy=cfg.mtp_strategy, gamma=cfg.gamma)

    @property
    def path(self) -> Path:
        return self.writer.path

    def _alpha(self, entropy: torch.Tensor) -> torch.Tensor:
        a, b = self.config.accept_law
        b = b + self.online_drift * (0.42 - b)
        return (a - b * entropy).clamp(0.02, 0.99)

    def _token_entropy(self, mean_entropy: float, shape: tuple[int, ...]) -> torch.Tensor:
        # Exponential: most tokens near zero entropy and a long tail, the shape of real token entropies.
        return torch.empty(shape, dtype=torch.float64).exponential_(1.0 / mean_entropy, generator=self.generator)

    def _uniform(self, *shape: int) -> torch.Tensor:
        return torch.rand(shape, generator=self.generator, dtype=torch.float64)

    def advance(self, n: int = 1) -> int:
        """Write `n` more steps; returns the next step number."""
        for _ in range(n):
            self._write_step()
            self.step += 1
        return self.step

    def _write_step(self) -> None:
        cfg, t = self.config, self.step
        progress = min(1.0, t / max(1, cfg.steps - 1))
        noise = self._uniform(4) - 0.5  # [4]
        mean_h = cfg.entropy_start + (cfg.entropy_end - cfg.entropy_start) * progress + 0.04 * float(noise[0])
        if cfg.rollout != "none" and cfg.mtp_strategy == "online-ce":
            self.online_drift = min(1.0, self.online_drift + 1.5 / cfg.steps)
        record: dict = {"step": t}
        tokens_per_verify = 1.0
        if cfg.rollout != "none":
            counters = self._spec_counters(mean_h)
            record.update(counters.to_dict())
            tokens_per_verify = 1.0 + counters.num_accepted_tokens / counters.num_drafts
        response_len = 180.0 + 60.0 * progress + 20.0 * float(noise[1])
        new_tokens = int(response_len * ROWS)
        # A verify step costs a bit more than a plain step, a draft step a fraction of one: the engine's counters.
        plain_step_s = ROWS / 900.0
        num_steps = max(1, round(response_len / tokens_per_verify))
        speculative = cfg.rollout != "none"
        record.update({"engine/num_steps": num_steps, "engine/prefill_s": 0.0, "engine/advance_s": 0.0,
                       "engine/draft_s": num_steps * cfg.gamma * 0.06 * plain_step_s if speculative else 0.0,
                       "engine/verify_s": num_steps * (1.05 if speculative else 1.0) * plain_step_s})
        gen = record["engine/draft_s"] + record["engine/verify_s"]
        update = 3.2 + 0.3 * float(noise[2])
        step_time = gen + update if cfg.mode == "sync" else max(gen, update) + 0.4
        self.time_s += step_time
        self.tokens += new_tokens
        record.update({
            "time": self.time_s, "tokens": self.tokens,
            "critic/score/mean": 0.15 + 0.65 * (1 - math.exp(-3.0 * progress)) + 0.08 * float(noise[3]),
            "actor/entropy": mean_h, "actor/pg_loss": 0.05 * float(noise[1]), "actor/grad_norm": 0.8 + float(noise[2]),
            "actor/ppo_kl": 1e-3 * (1 + float(noise[0])), "response_length/mean": response_len,
            "timing_s/gen": gen, "timing_s/update_actor": update, "timing_s/step": step_time,
            "perf/throughput": new_tokens / step_time,
        })
        if cfg.rollout != "none" and cfg.mtp_strategy != "frozen":
            objective = cfg.mtp_strategy.removeprefix("online-")
            record[f"mtp/loss/{objective}"] = 1.2 - 0.3 * progress + 0.05 * float(noise[3])
            record["mtp/d_tv_mean"] = 0.12 + 0.08 * self.online_drift
            record["mtp/online_update"] = 1
        self.writer.log("train", record)
        for _ in range(cfg.samples_per_step):
            self.writer.log("samples", self._sample(mean_h, float(record["critic/score/mean"])))
        self.writer.status(step=t, message=f"step {t + 1}/{cfg.steps}")

    def _spec_counters(self, mean_h: float) -> SpecCounters:
        cfg = self.config
        counters = SpecCounters(cfg.gamma, "to" if cfg.rollout == "to" else "rs", ENTROPY_BIN_EDGES)
        entropy = self._token_entropy(mean_h, (cfg.drafts_per_step, cfg.gamma))  # [B, γ]
        passed = self._uniform(cfg.drafts_per_step, cfg.gamma) < self._alpha(entropy)  # [B, γ]
        num_accepted = passed.long().cumprod(dim=1).sum(dim=1)  # [B] accepted up to the first rejection
        counters.update(num_accepted, entropy)
        return counters

    def _sample(self, mean_h: float, reward: float) -> dict:
        cfg = self.config
        n = cfg.sample_tokens
        entropy = self._token_entropy(mean_h, (n,))  # [n]
        words = torch.randint(len(_WORDS), (n,), generator=self.generator).tolist()
        origin = ["plain"] * n
        if cfg.rollout != "none":
            passed = (self._uniform(n) < self._alpha(entropy)).tolist()
            i, depth = 1, 0  # the first token after the prompt is a plain target sample
            while i < n:
                if depth == cfg.gamma:
                    origin[i], depth = "bonus", 0
                elif passed[i]:
                    origin[i], depth = "accepted", depth + 1
                else:
                    origin[i], depth = "recovered", 0
                i += 1
        a, b = (self.step % 9) + 2, (self.step % 7) + 3
        return {"step": self.step, "prompt": f"What is {a} + {b}?", "pieces": [_WORDS[w] for w in words],
                "origin": origin, "entropy": [round(float(h), 4) for h in entropy], "reward": round(reward, 3)}

    def close(self, state: str = "finished") -> None:
        self.writer.close(state)

    def __enter__(self) -> SyntheticRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.writer.__exit__(exc_type, exc, tb)


def write_synthetic_run(run_dir: str | Path, config: SyntheticConfig, *, state: str = "finished") -> Path:
    """Write a whole simulated run and close it with `state` ("running" leaves it open, heartbeat fresh)."""
    run = SyntheticRun(run_dir, config)
    run.advance(config.steps)
    if state != "running":
        run.close(state)
    return run.path


def write_preview_runs(root: str | Path, steps: int = 60) -> list[Path]:
    """The five runs of `preview_configs` under `root`, one directory each."""
    return [write_synthetic_run(Path(root) / cfg.name, cfg) for cfg in preview_configs(steps)]
