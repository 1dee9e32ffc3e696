"""`DepthController`: the draft depth γ of each engine step, chosen live (`GenerationConfig(gamma="auto")`).

A step at depth γ over `rows` rows emits rows·(1 + E[accepted | γ]) tokens and costs cost(rows, γ) seconds, so the
controller picks, before each step,

    γ* = argmax_{γ ∈ 0..K} (1 + E[accepted | γ]) / cost(rows, γ),    E[accepted | γ] = Σ_{j≤γ} Π_{i≤j} α_i

(rows is the same for every γ, so it cancels from the argmax). Both factors are measured by the engine as it runs,
none is a constant of the machine:

  α_i           accepted / reached at draft position i, over the steps so far (PAPER α_i, conditional on the
                earlier positions), with the counts decayed per step so that acceptance that drifts during RL is
                followed. A position never reached borrows its prior from the one before it.
  cost(rows, γ) a table of seconds per engine step (draft + verify + advance), one cell per rows bucket
                (`ROW_BUCKETS`) and γ, each the median of the last `cost_window` steps measured there: a moving
                median, not a mean, because on a shared machine one step in a few takes several times as long
                (another process got the cores) and one such step must not price a depth out for good. A cell
                counts from its second step (the first carries one-off costs: allocations, kernels at a new shape),
                and while it has two is priced by the faster (slowdowns only add).
                Plain decoding is priced by its cell. A drafting depth is priced by its own cell once it has
                `settle` steps: a machine's costs are not linear in γ (a verify of 4 tokens per row may cost what
                one of 3 does, measured on CPU), so a line would misprice the depths it does not pass through.
                Before, by the least-squares line through the bucket's drafting cells, each weighted by its
                samples (each draft position adds a head pass and a verified token per row: the best guess a few
                steps allow; the head's own cost, the jump from γ = 0 to 1, stays out of it). Beyond the deepest
                depth measured (and no other bucket's measurement to scale), by the dearest shallower one: the
                least a deeper draft can cost, so that a depth is run unless even its best case cannot pay (a line
                through γ = 1 and 2 priced deeper depths out for good where a third draft cost a fraction of the
                second). A plain step runs without the head (the engine catches it up in one forward when a step
                drafts again): a price of switching, not of the depth, kept out of the table
                (`observe(switch_s=)`), counted by the probes.

Load. The load of a shared machine comes and goes (another process takes the cores, the RL update runs beside the
rollout), and it slows every depth alike, while the cells were measured at different moments: a depth measured in a
slow patch would look dear, and one measured in a quiet patch cheap, until each is measured again. So the cells are
kept at one reference load: the load factor, the moving median of how much slower than its cell says each of the
last `load_window` steps ran (steps of cells measured at least 3 times), divides each new sample and multiplies
every estimate. Depths are thus compared as if measured at the same moment; within a bucket it cancels from the argmax.

Doubt. The noise of a step's (load-adjusted) log seconds around its cell's median is measured as the controller runs
(median absolute deviation; `noise_prior` until then). Among drafting depths it runs the one whose tokens/s raised by
`optimism` standard errors (noise / sqrt(steps) for a settled cell, one step's worth for a depth priced by a line or
another bucket) is highest: a depth measured too little to be ruled out runs until it is settled or ruled out
(switching among drafting depths costs nothing). Where steps barely vary (a GPU) this is the plain argmax.

Margin. Plain decoding, the baseline MTP must never lose to, is chosen while within `margin` of the best estimate (no
doubt given to drafts here): a draft must beat the noise of measured costs and pay its switch (the head's catch-up).

Exploration. Plain decoding, γ = 1 and γ = 2 are measured first, two steps each (a γ with no estimate is worth
+inf). Each deeper depth is then priced at its best case (the cost of the dearest measured one) and run while
that makes it a contender: a deep γ whose best case cannot pay is never run to find out (where another bucket
measured it, that measurement, scaled as below, prices it instead). A bucket with nothing measured yet starts at
the depth the nearest measured bucket finds best. A cell the bucket cannot price itself is estimated from the
nearest bucket that prices both it and a depth measured here (a drafting one for a drafting depth), scaled by the
ratio of the two (what matters for the argmax is cost(rows, γ) / cost(rows, γ'): rows change the absolute cost far
more than the ratio). The ratio across the head's jump does move with rows (the fewer rows, the less a draft costs
against a plain step), so a bucket that has measured only one side of it (plain decoding, or drafting) measures the
other side's best estimate.

Probes. So that no estimate goes stale (load comes and goes; a depth priced out by a slow patch must get another
chance; while plain decoding wins nothing measures acceptance), a bucket now and then runs another depth, in turns
the one measured longest ago of plain decoding (the baseline of every choice) and the chosen depth's neighbours,
then the one with the highest raised tokens/s: up to `probe_steps` steps in a row while it looks a close competitor
(within twice the margin; a fresh median, one catch-up of the head), one step when far behind. A probe costs the
time it took beyond what the best depth would take for the same tokens, and a probe of plain decoding the head's
catch-up after it too (on CPU as dear as the plain step's own extra); the next waits until that cost is at most
`probe_budget` of the time spent since: at least `probe_every` steps, at most 16 times that
(`bebop.engine.depth_probes`).

Lossless. `choose` reads only what `observe` was given after earlier steps, never the coming step's draws, so each
step's verification sees a depth fixed before its randomness: every step emits exactly the target's law whatever
γ it runs (bebop.verify), and so does any sequence of them.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from bebop.engine.depth_cells import Cell, fitted_line
from bebop.engine.depth_probes import Probe, ProbeSchedule

# Cost-table buckets by active rows: exact where a step's cost changes most per row (few rows), then ~1.5x apart.
ROW_BUCKETS: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)


def row_bucket(rows: int) -> int:
    """The cost-table bucket of `rows` active rows: the smallest of ROW_BUCKETS >= rows (or rows itself above)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    i = bisect.bisect_left(ROW_BUCKETS, rows)
    return ROW_BUCKETS[i] if i < len(ROW_BUCKETS) else rows


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
        for name, low in (("max_gamma", 1), ("cost_window", 1), ("load_window", 1), ("settle", 2),
                          ("probe_every", 0), ("probe_steps", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
        for name, ok, span in (("acceptance_decay", 0 < self.acceptance_decay <= 1, "in (0, 1]"),
                               ("prior_weight", self.prior_weight > 0, "> 0"),
                               ("margin", 0 <= self.margin < 1, "in [0, 1)"),
                               ("optimism", self.optimism >= 0, ">= 0"),
                               ("noise_prior", self.noise_prior > 0, "> 0"),
                               ("probe_budget", 0 < self.probe_budget <= 1, "in (0, 1]")):
            if not ok:
                raise ValueError(f"{name} must be {span}, got {getattr(self, name)}")


@dataclass(frozen=True)
class Choice:
    """One decision and its reasons: the depth, the acceptance it expected and the step cost it used."""

    gamma: int
    rows: int  # active rows
    bucket: int  # their cost-table bucket
    expected_accepted: float  # E[accepted | γ] per row
    cost_s: float  # estimated seconds of this step (inf: never measured; nan: no estimate yet)
    probe: bool  # chosen to measure, not because it was the best estimate


@dataclass(eq=False)
class DepthController:
    """Chooses γ per step from measured acceptance and step costs (module docstring). Pure host-side state."""

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
    _own_costs: dict[int, list[float]] = field(init=False)
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

    def cost(self, rows: int, gamma: int) -> float:
        """Seconds of a step at `rows` rows and depth γ: this bucket's own estimate (`_own`), else one scaled from the
        nearest bucket that prices γ and a depth priced here, else its best case; else inf while no bucket prices γ
        (to explore), or nan."""
        bucket = row_bucket(rows)
        own = self._own(bucket, gamma)
        if math.isfinite(own):
            return self.load * own
        here = self._priced_here(bucket)
        buckets = {b for b, _ in self._cells}
        for other in sorted(buckets - {bucket}, key=lambda b: (abs(math.log(b / bucket)), b)):
            there = self._own(other, gamma)
            shared = [g for g in here if math.isfinite(self._own(other, g))]
            if math.isfinite(there) and shared:  # a drafting depth scales a drafting one: same side of the head
                ref = min(shared, key=lambda g: ((g == 0) != (gamma == 0), abs(g - gamma)))
                return self.load * self._own(bucket, ref) * there / self._own(other, ref)
        # Deeper than any drafting depth measured here or in a bucket that shares one: its best case, the least a
        # deeper draft can cost, the dearest shallower drafting depth's (module docstring).
        below = [self._own(bucket, g) for g in here if 0 < g < gamma]
        if len(below) >= 2:  # (γ = 1 and 2 are measured first: Exploration)
            return self.load * max(below)
        return math.inf if all(math.isnan(self._own(b, gamma)) for b in buckets) else math.nan

    def _own(self, bucket: int, gamma: int) -> float:
        """γ's cost at `bucket` at the reference load from that bucket's cells of >= 2 steps alone (nan: none):
        its cell (a drafting depth: once settled, or while the only one), else the bucket's drafting line."""
        if bucket not in self._own_costs:
            cells = {g: cell for (b, g), cell in self._cells.items() if b == bucket and cell.count >= 2}
            drafting, depths = {g: cell for g, cell in cells.items() if g > 0}, range(self.config.max_gamma + 1)
            costs = [cells[g].seconds if g in cells else math.nan for g in depths]
            # The line prices the unsettled depths up to the deepest drafting cell, not beyond (cost()).
            unsettled = [g for g in range(1, max(drafting, default=0) + 1) if not self._settled(bucket, g)]
            if len(drafting) >= 2 and unsettled:
                for g, seconds in zip(unsettled, fitted_line(drafting, unsettled)):
                    costs[g] = seconds
            self._own_costs[bucket] = costs
        return self._own_costs[bucket][gamma]

    def _priced_here(self, bucket: int) -> list[int]:
        return [g for g in range(self.config.max_gamma + 1) if math.isfinite(self._own(bucket, g))]

    def _settled(self, bucket: int, gamma: int) -> bool:
        cell = self._cells.get((bucket, gamma))
        return cell is not None and cell.count >= self.config.settle

    def _value(self, rows: int, gamma: int) -> float:
        cost = self.cost(rows, gamma)
        if math.isinf(cost):
            return math.inf
        return (1.0 + self.expected_accepted(gamma)) / cost if cost > 0 else math.inf

    # ---- the decision -------------------------------------------------------------------------------
    def choose(self, rows: int) -> int:
        return self.decide(rows).gamma

    def decide(self, rows: int) -> Choice:
        """The depth of the next step at `rows` active rows, with its reasons."""
        bucket, k = row_bucket(rows), self.config.max_gamma
        tick = self._steps.get(bucket, 0)
        self._steps[bucket] = tick + 1
        running = self._probing.running
        if running is not None and running.bucket == bucket:  # a probe runs its steps in a row
            return self._choice(rows, running.gamma, probe=True)
        if running is not None:  # the rows left its bucket: it ends here
            self._probing.end()
        values = [self._value(rows, g) for g in range(k + 1)]
        if all(math.isnan(v) for v in values):  # nothing measured here to scale from: start where the nearest
            nearest = min({b for b, _ in self._cells}, key=lambda b: (abs(math.log(b / bucket)), b))  # bucket is best
            values = [-math.inf if math.isnan(v) else v for v in (self._value(nearest, g) for g in range(k + 1))]
            return self._choice(rows, self._best(values, range(k + 1)), probe=True)
        best = self._best(values, [g for g in range(k + 1) if not math.isnan(values[g])])
        unmeasured = math.isinf(values[best])
        # A side of the head (plain decoding, or drafting) this bucket has not measured yet is priced by another
        # bucket's ratio, which rows move (the fewer rows, the less a draft costs against a plain step): measure
        # its best estimate before trusting the other side.
        other = [g for g in range(k + 1) if (g == 0) != (best == 0) and not math.isnan(values[g])]
        if not unmeasured and other and all((g == 0) == (best == 0) for g in self._priced_here(bucket)):
            return self._choice(rows, self._best(values, other), probe=True)
        pick = best
        if best > 0 and not unmeasured:  # among drafting depths, the benefit of the doubt to the least measured
            pick = max((g for g in range(1, k + 1) if math.isfinite(values[g])),
                       key=lambda g: (self._optimistic(bucket, g, values[g]), -g))
        if self._probing.due(bucket, tick) and not unmeasured:
            gamma = self._probe_depth(bucket, pick, values)
            self._probing.running = Probe(bucket, tick, gamma, self.cost(rows, pick), values[pick],
                                          self.config.probe_steps)
            return self._choice(rows, gamma, probe=True)
        return self._choice(rows, pick, probe=unmeasured or pick != best)

    def _probe_depth(self, bucket: int, pick: int, values: Sequence[float]) -> int:
        """Probes take turns (module docstring): the stalest of plain decoding and `pick`'s neighbours, then the
        depth with the highest raised tokens/s."""
        k = self.config.max_gamma
        if self._probing.turn(bucket) % 2:
            return min({g for g in (0, pick - 1, pick + 1) if 0 <= g <= k and g != pick},
                       key=lambda g: (self._last(bucket, g), g))
        return max((g for g in range(k + 1) if g != pick and math.isfinite(values[g])),
                   key=lambda g: (self._optimistic(bucket, g, values[g]), -self._last(bucket, g), -g))

    def _optimistic(self, bucket: int, gamma: int, value: float) -> float:
        """`value` (tokens/s) raised by `optimism` standard errors of γ's estimate (module docstring: Doubt)."""
        cell = self._cells.get((bucket, gamma))
        steps = len(cell.recent) if self._settled(bucket, gamma) else 1
        return value * math.exp(self.config.optimism * self.noise / math.sqrt(steps))

    def _best(self, values: Sequence[float], depths: Sequence[int]) -> int:
        """Plain decoding if it is among `depths` within `margin` of the highest tokens/s, else the depth of the
        highest, the shallowest of a tie (inf: never measured, the shallowest such first)."""
        top = max(values[g] for g in depths)
        if math.isinf(top):
            return min(g for g in depths if values[g] == top)
        if 0 in depths and values[0] >= (1 - self.config.margin) * top:
            return 0
        return max((g for g in sorted(depths) if g > 0), key=lambda g: values[g])

    def _last(self, bucket: int, gamma: int) -> int:
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
        if probe is not None and (probe.left == 0 or
                                  self._value(rows, gamma) < (1 - 2 * self.config.margin) * probe.best_value):
            self._probing.end()

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
