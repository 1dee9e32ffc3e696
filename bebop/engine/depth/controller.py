"""`DepthConfig` and `DepthController`: the draft depth γ of each engine step chosen from measured per-position
acceptance and a measured step-cost table (the rule: `bebop.engine.depth`; how each factor is measured and how the
controller copes with a shared machine: docs/draft-depth.md). Pure host-side state.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

from bebop.checks import check_ints, check_number
from bebop.engine.depth.cells import Cell, fitted_line, row_bucket
from bebop.engine.depth.choice import Choice
from bebop.engine.depth.estimates import Values
from bebop.engine.depth.probes import Probe, ProbeSchedule


@dataclass(frozen=True)
class DepthConfig:
    max_gamma: int  # K: γ is chosen from 0..K
    cost_window: int = 9  # steps behind each cost cell's moving median
    load_window: int = 5  # recent steps behind the load factor's moving median
    settle: int = 5  # steps after which a drafting depth is priced by its own cell, not by its bucket's line
    optimism: float = 2.0  # standard errors added to a drafting depth's tokens/s when choosing among them
    noise_prior: float = 0.15  # step-to-step spread of log seconds assumed until the controller has measured it
    acceptance_decay: float = 0.98  # per observed step: how fast old acceptance counts fade
    probe_every: int = 16  # the fewest steps of a bucket between two probes (0: never probe)
    probe_budget: float = 0.01  # the share of a bucket's time its probes may cost beyond its best depth's
    probe_steps: int = 4  # steps a probe runs in a row (a fresh median; one catch-up of the head for them all)
    prior_weight: float = 1.0  # pseudo-drafts of the prior behind each α_i estimate
    margin: float = 0.05  # plain decoding is chosen while its estimated tokens/s is within this share of the best's

    def __post_init__(self) -> None:
        check_ints(self, ("max_gamma", "cost_window", "load_window", "probe_steps"), low=1)
        check_ints(self, ("settle",), low=2)
        check_ints(self, ("probe_every",), low=0)
        check_number(self, "acceptance_decay", low=0, high=1, open_low=True)
        check_number(self, "probe_budget", low=0, high=1, open_low=True)
        check_number(self, "margin", low=0, high=1, open_high=True)
        check_number(self, "optimism", low=0)
        for name in ("prior_weight", "noise_prior"):
            check_number(self, name, low=0, open_low=True)


@dataclass(eq=False)
class DepthController:
    """Chooses γ per step from measured acceptance and step costs (docs/draft-depth.md); one learns across calls."""

    config: DepthConfig
    _reached: list[float] = field(init=False)
    _accepted: list[float] = field(init=False)
    _cells: dict[tuple[int, int], Cell] = field(init=False)
    _steps: dict[int, int] = field(init=False)  # decisions per bucket (the probe schedule's clock)
    _probing: ProbeSchedule = field(init=False)  # when each bucket may probe next, and the probe under way
    _observed: int = field(init=False, default=0)  # observations so far (how old a cell's measurement is)
    _loads: deque = field(init=False)  # recent steps' seconds over their cells' (the load factor's window)
    load: float = field(init=False, default=1.0)  # how much slower the machine runs now than the cells' reference
    _spreads: deque = field(init=False)  # |log(seconds / their cell's)| of recent steps of settled cells
    noise: float = field(init=False)  # the step-to-step spread of log seconds (its median absolute deviation)
    # Caches (the controller runs before every engine step, so a step at few rows must not wait on it): each bucket's
    # own costs per depth, until one of its cells changes; E[accepted | γ] per depth, until acceptance is learnt.
    _own_costs: dict[int, list[float | None]] = field(init=False)
    _expected: list[float] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        k = self.config.max_gamma
        self._reached, self._accepted = [0.0] * k, [0.0] * k
        self._cells, self._steps, self._own_costs = {}, {}, {}
        self._probing = ProbeSchedule(self.config.probe_every, self.config.probe_budget)
        self._loads = deque(maxlen=self.config.load_window)
        self._spreads, self.noise = deque(maxlen=64), self.config.noise_prior

    @property
    def max_gamma(self) -> int:
        return self.config.max_gamma

    # ---- estimates ----------------------------------------------------------------------------------
    def alphas(self) -> list[float]:
        """α_i per draft position [K]: decayed accepted / reached, shrunk towards the previous position's (0.5 at
        position 0) by `prior_weight` pseudo-drafts."""
        out, prior, w = [], 0.5, self.config.prior_weight
        for reached, accepted in zip(self._reached, self._accepted):
            prior = (accepted + w * prior) / (reached + w)
            out.append(prior)
        return out

    def expected_accepted(self, gamma: int) -> float:
        """E[accepted | γ] = Σ_{j≤γ} Π_{i≤j} α_i (PAPER §2)."""
        if self._expected is None:
            self._expected, survive = [0.0], 1.0
            for a in self.alphas():
                survive *= a
                self._expected.append(self._expected[-1] + survive)
        return self._expected[gamma]

    def cost(self, rows: int, gamma: int) -> float | None:
        """Seconds of a step at `rows` rows and depth γ: this bucket's own estimate (`_own`), else one scaled from the
        nearest bucket that prices γ and a depth priced here, else its best case; None without a price (a depth to
        measure: docs/draft-depth.md, Exploration)."""
        bucket = row_bucket(rows)
        own = self._own(bucket, gamma)
        if own is not None:
            return self.load * own
        here = self._priced_here(bucket)
        for other in sorted({b for b, _ in self._cells} - {bucket}, key=lambda b: (abs(math.log(b / bucket)), b)):
            there = self._own(other, gamma)
            shared = [g for g in here if self._own(other, g) is not None]
            if there is not None and shared:  # a drafting depth scales a drafting one: same side of the head
                ref = min(shared, key=lambda g: ((g == 0) != (gamma == 0), abs(g - gamma)))
                return self.load * self._own(bucket, ref) * there / self._own(other, ref)
        # Deeper than any drafting depth measured here or in a bucket that shares one: its best case, the least a
        # deeper draft can cost, the dearest shallower drafting depth's (docs/draft-depth.md, Step costs).
        below = [self._own(bucket, g) for g in here if 0 < g < gamma]
        if len(below) >= 2:  # (γ = 1 and 2 are measured first: Exploration)
            return self.load * max(below)
        return None

    def _own(self, bucket: int, gamma: int) -> float | None:
        """γ's cost at `bucket` at the reference load from that bucket's cells of >= 2 steps alone (None: none): its
        cell (a drafting depth: once settled, or while the only one), else the bucket's drafting line."""
        if bucket not in self._own_costs:
            cells = {g: cell for (b, g), cell in self._cells.items() if b == bucket and cell.count >= 2}
            drafting, depths = {g: cell for g, cell in cells.items() if g > 0}, range(self.config.max_gamma + 1)
            costs = [cells[g].seconds if g in cells else None for g in depths]
            # The line prices the unsettled depths up to the deepest drafting cell, not beyond (cost()).
            unsettled = [g for g in range(1, max(drafting, default=0) + 1) if not self._settled(bucket, g)]
            if len(drafting) >= 2 and unsettled:
                for g, seconds in zip(unsettled, fitted_line(drafting, unsettled)):
                    costs[g] = seconds
            self._own_costs[bucket] = costs
        return self._own_costs[bucket][gamma]

    def _priced_here(self, bucket: int) -> list[int]:
        return [g for g in range(self.config.max_gamma + 1) if self._own(bucket, g) is not None]

    def _settled(self, bucket: int, gamma: int) -> bool:
        cell = self._cells.get((bucket, gamma))
        return cell is not None and cell.count >= self.config.settle

    def _values(self, rows: int) -> Values:
        depths = range(self.config.max_gamma + 1)
        return Values.of([self.cost(rows, g) for g in depths], [self.expected_accepted(g) for g in depths])

    def _value(self, rows: int, gamma: int) -> float | None:
        """γ's tokens/s per row at `rows` rows (None: no price, or one of 0 s)."""
        cost = self.cost(rows, gamma)
        return (1.0 + self.expected_accepted(gamma)) / cost if cost is not None and cost > 0 else None

    # ---- the decision -------------------------------------------------------------------------------
    def choose(self, rows: int) -> int:
        return self.decide(rows).gamma

    def decide(self, rows: int) -> Choice:
        """The depth of the next step at `rows` active rows, with its reasons."""
        bucket, k, margin = row_bucket(rows), self.config.max_gamma, self.config.margin
        tick = self._steps.get(bucket, 0)
        self._steps[bucket] = tick + 1
        running = self._probing.running
        if running is not None and running.bucket == bucket:  # a probe runs its steps in a row
            return self._choice(rows, running.gamma, probe=True)
        if running is not None:  # the rows left its bucket: it ends here
            self._probing.end()
        values = self._values(rows)
        best = values.best(margin)
        measuring = best in values.to_measure
        # A side of the head (plain decoding, or drafting) this bucket has not measured yet is priced by another
        # bucket's ratio, which rows move (the fewer rows, the less a draft costs against a plain step): measure
        # its best estimate before trusting the other side.
        other = [g for g in values.depths if (g == 0) != (best == 0)]
        if not measuring and other and all((g == 0) == (best == 0) for g in self._priced_here(bucket)):
            return self._choice(rows, values.best(margin, among=other), probe=True)
        pick = best
        if best > 0 and not measuring:  # among drafting depths, the benefit of the doubt to the least measured
            pick = max((g for g in range(1, k + 1) if g in values.priced),
                       key=lambda g: (self._optimistic(bucket, g, values.priced[g]), -g))
        if self._probing.due(bucket, tick) and not measuring:
            gamma = self._probe_depth(bucket, pick, values.priced)
            self._probing.running = Probe(bucket, tick, gamma, self.cost(rows, pick), values.priced[pick],
                                          self.config.probe_steps)
            return self._choice(rows, gamma, probe=True)
        return self._choice(rows, pick, probe=measuring or pick != best)

    def _probe_depth(self, bucket: int, pick: int, priced: dict[int, float]) -> int:
        """Probes take turns (docs/draft-depth.md, Probes): the stalest of plain decoding and `pick`'s neighbours,
        then the priced depth with the highest raised tokens/s."""
        k = self.config.max_gamma
        if self._probing.turn(bucket) % 2:
            return min({g for g in (0, pick - 1, pick + 1) if 0 <= g <= k and g != pick},
                       key=lambda g: (self._last(bucket, g), g))
        return max((g for g in range(k + 1) if g != pick and g in priced),
                   key=lambda g: (self._optimistic(bucket, g, priced[g]), -self._last(bucket, g), -g))

    def _optimistic(self, bucket: int, gamma: int, value: float) -> float:
        """`value` (tokens/s) raised by `optimism` standard errors of γ's estimate (docs/draft-depth.md, Doubt)."""
        cell = self._cells.get((bucket, gamma))
        steps = len(cell.recent) if self._settled(bucket, gamma) else 1
        return value * math.exp(self.config.optimism * self.noise / math.sqrt(steps))

    def _last(self, bucket: int, gamma: int) -> int:
        """The observation count when γ was last measured at `bucket`; -1 if never (the stalest of all)."""
        cell = self._cells.get((bucket, gamma))
        return -1 if cell is None else cell.last

    def _choice(self, rows: int, gamma: int, *, probe: bool) -> Choice:
        return Choice(gamma, rows, row_bucket(rows), self.expected_accepted(gamma), self.cost(rows, gamma), probe)

    # ---- learning -----------------------------------------------------------------------------------
    def observe(self, rows: int, gamma: int, seconds: float, num_accepted: list[int], switch_s: float = 0.0) -> None:
        """Learn from one finished step: `rows` rows at depth γ took `seconds`; row b accepted num_accepted[b] of
        its γ drafts (so it reached positions 0..min(n_b, γ-1) and had 0..n_b-1 accepted). `switch_s` of the
        seconds went to catching the head up after plain steps: a price of switching depth, not of γ, so the cost
        table leaves it out and a probe's schedule counts it."""
        if not 0 <= gamma <= self.config.max_gamma:
            raise ValueError(f"gamma must lie in 0..{self.config.max_gamma}, got {gamma}")
        if not seconds >= switch_s >= 0:
            raise ValueError(f"need seconds >= switch_s >= 0, got seconds={seconds}, switch_s={switch_s}")
        if gamma > 0 and not all(0 <= n <= gamma for n in num_accepted):
            raise ValueError(f"num_accepted must lie in 0..gamma={gamma}, got {num_accepted}")
        self._probing.bill(switch_s)
        probe = self._probing.running
        if probe is not None:
            probe.charge(seconds, num_accepted)
        seconds -= switch_s
        bucket = row_bucket(rows)
        cell = self._cells.setdefault((bucket, gamma), Cell(deque(maxlen=self.config.cost_window)))
        known = cell.seconds if len(cell.recent) >= 3 else None  # a cell measured enough to tell load from noise
        self._observed += 1
        cell.last = self._observed
        if known is not None:
            self._loads.append(seconds / known)
            self.load = statistics.median(self._loads)
        if self._settled(bucket, gamma):
            self._spreads.append(abs(math.log(seconds / self.load / cell.seconds)))
            if len(self._spreads) >= 8:  # 1.4826 MAD: the standard deviation of a normal, robust to slow steps
                self.noise = 1.4826 * statistics.median(self._spreads)
        cell.add(seconds / self.load)
        self._own_costs.pop(bucket, None)
        self._learn_acceptance(gamma, num_accepted)
        # A probe runs on only while its depth still looks a close competitor: the one worth a precise estimate.
        if probe is not None and (probe.left == 0 or self._behind(rows, gamma, probe)):
            self._probing.end()

    def _behind(self, rows: int, gamma: int, probe: Probe) -> bool:
        """The probed depth no longer looks a close competitor of the best: priced below it by twice the margin."""
        value = self._value(rows, gamma)
        return value is not None and value < (1 - 2 * self.config.margin) * probe.best_value

    def _learn_acceptance(self, gamma: int, num_accepted: list[int]) -> None:
        if gamma == 0:
            return
        self._expected = None
        decay = self.config.acceptance_decay
        for i in range(self.config.max_gamma):
            self._reached[i] *= decay
            self._accepted[i] *= decay
        at_least = [0] * (gamma + 2)  # at_least[i]: rows that accepted >= i drafts
        for n in num_accepted:
            at_least[n] += 1
        for i in range(gamma, -1, -1):
            at_least[i] += at_least[i + 1]
        for i in range(gamma):  # position i is reached by rows that accepted >= i, accepted by those with > i
            self._reached[i] += at_least[i]
            self._accepted[i] += at_least[i + 1]

    def cost_table(self) -> dict[tuple[int, int], float]:
        """The measured cells {(rows bucket, γ): seconds per step} (moving medians, at the current load)."""
        return {key: self.load * cell.seconds for key, cell in sorted(self._cells.items())}
