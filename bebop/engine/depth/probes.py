"""The depth controller's probes (docs/draft-depth.md, Probes): now and then a rows bucket runs another depth than its
best, so that no estimate goes stale; what each probe cost beyond the best depth sets when the next may run, so that
probing costs at most `budget` of the bucket's time."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Probe:
    bucket: int
    tick: int  # the bucket's decision count when it began
    gamma: int
    best_cost: float  # seconds of a step at the best depth, when it began
    best_value: float  # the best depth's tokens/s per row, when it began
    left: int  # steps still to run
    extra: float = 0.0  # seconds spent so far beyond what the best depth would take for the same tokens

    def charge(self, seconds: float, num_accepted: list[int]) -> None:
        """One of its steps took `seconds`: count what the best depth would not have spent on the same tokens."""
        emitted = 1 + sum(num_accepted) / max(len(num_accepted), 1)
        self.extra += seconds - emitted / self.best_value if self.best_value > 0 else 0.0
        self.left -= 1


@dataclass
class ProbeSchedule:
    every: int  # the fewest decisions of a bucket between two probes (0: never probe)
    budget: float  # the share of a bucket's time its probes may cost beyond its best depth's
    running: Probe | None = None  # the probe under way
    _billed: Probe | None = None  # a plain probe whose head catch-up is still to pay
    _next: dict[int, int] = field(default_factory=dict)  # per bucket: the tick from which the next probe is due
    _turns: dict[int, int] = field(default_factory=dict)  # per bucket: probes so far (whose turn the next one is)

    def due(self, bucket: int, tick: int) -> bool:
        return self.every > 0 and tick >= self._next.get(bucket, self.every)

    def turn(self, bucket: int) -> int:
        """Counts a new probe at `bucket` and returns its number there (1, 2, ...): probes take turns."""
        self._turns[bucket] = turn = self._turns.get(bucket, 0) + 1
        return turn

    def end(self) -> None:
        probe, self.running = self.running, None
        self._schedule(probe)
        self._billed = probe if probe.gamma == 0 else None  # the head is behind: the next draft catches it up

    def bill(self, switch_s: float) -> None:
        """Called with each step's catch-up of the head: after a plain probe, that catch-up is the probe's cost too."""
        if self._billed is not None:
            self._billed.extra += switch_s
            self._schedule(self._billed)
            self._billed = None

    def _schedule(self, probe: Probe) -> None:
        """The next probe of its bucket waits until what this one cost beyond the best depth is `budget` of the time."""
        budget = self.budget * probe.best_cost  # seconds of probe cost per step of the bucket
        paid = probe.extra > 0 and budget > 0
        gap = math.ceil(probe.extra / budget) if paid else self.every
        self._next[probe.bucket] = probe.tick + min(max(gap, self.every), 16 * self.every)
