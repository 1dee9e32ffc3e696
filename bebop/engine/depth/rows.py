"""`RowDepths`: each row its own draft depth and draft source each step, under a verify-token budget that measured
step costs set for the current rows (`GenerationConfig(gamma="rows")`; the global `DepthController` is "auto").

The rule. Before a step over B rows, for each row b and draft position k = 1..K the controller predicts s_{b,k},
the probability that the row's k-th draft is reached and accepted: s_{b,k} = Π_{j≤k} α̂_{b,j}, with α̂_{b,j} the
acceptance at position j predicted from what the row emitted so far (`RowState`): for a head's draft, by the
entropy law α_j ≈ a_j + c_j·H fitted live on the drafts verified so far, H the row's recent target entropy; for a
prompt-lookup draft (where the row's suffix matches its history: `bebop.engine.lookup`), by the acceptance measured
so far at that match length (`bebop.engine.depth.row_law`). Each row drafts from the source that predicts more at
its first position. A step that verifies M drafts in all, the M largest s (each row's a prefix of its own, since s
falls along a row), emits B + Σ s tokens in expectation and costs t(B, M, G) seconds (G its deepest row) by the cost
model fitted on the steps so far (`bebop.engine.depth.row_costs`), so the controller picks

    M* = argmax_M (B + Σ_{top M} s) / t(B, M, G(M))        (M = 0: plain decoding, kept unless a draft promises
                                                             `margin` more tokens/s)

and each row drafts the positions of its own among the top M*: its depth (0: it decodes plainly in the same
forward). The step's budget is B + M* verified tokens. What the model says loses is never chosen: every M > 0 is
measured against plain decoding's own price, and chosen only above it by the margin. Probes (a plain step, or one
drafting every row to K) keep the two sides' prices fresh.

Lossless. `decide` reads the controller's state, which `observe` built from earlier steps only, and the rows'
states, which hold only what the rows already emitted (entropies of emitted tokens, lookup matches in their
histories); the engine calls it before it draws the step's random numbers or any draft. So each row's depth and
source are fixed before the step's randomness, given everything emitted so far (whichever row emitted it). For a
fixed depth d and q (a head's, or a lookup's one-hot), verification emits exactly the target's law (bebop.verify:
RS at each of the d positions, then a draw from p; d = 0 is that draw alone), so each row's next tokens have
exactly its target conditional given its prefix whatever the depth; the rows' draws are independent (their own
uniforms), so the rows' joint law is the product; by induction over steps every row's sequence has exactly the law
of sampling the target token by token. tests/test_row_depths.py checks this through the engine (chi-square over
ragged depths and sources, and greedy decoding identical to plain).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bebop.checks import check_ints, check_number
from bebop.engine.depth.cells import row_bucket
from bebop.engine.depth.choice import Choice
from bebop.engine.depth.row_costs import ProbeClock, RowCosts
from bebop.engine.depth.row_law import AcceptanceLaw


# A probe is charged at least this share of its step, however close its side's estimate: probes stay apart (at most
# one in 1 / (MIN_PROBE_LOSS · probe_budget) steps' time) when the two sides' estimates are level.
MIN_PROBE_LOSS = 0.2


@dataclass(frozen=True)
class RowState:
    """What the controller reads of a live row before a step: only what the row already emitted."""

    entropy: float  # the mean target entropy H(p) of its last few tokens (nats)
    match: int = 0  # prompt lookup's longest match ending its history (0: none, or no lookup)
    left: int | None = None  # tokens left in its budget (None: unbounded)


@dataclass(frozen=True)
class RowsConfig:
    max_gamma: int  # K: each row's depth in 0..K
    margin: float = 0.05  # a draft is chosen only when it promises this share more tokens/s than plain decoding
    lookup: bool = True  # rows may draft by prompt lookup where their suffix matches
    head: bool = True  # rows may draft by the engine's MTP head (False: prompt lookup only, a match or not)
    probe_budget: float = 0.02  # the share of a bucket's time probes of the side not chosen may lose (0: never)
    acceptance_decay: float = 0.98  # per observed step: how fast old drafts fade from the acceptance laws
    cost_decay: float = 0.95  # per observed step at a bucket: how fast old steps fade from its cost model

    def __post_init__(self) -> None:
        check_ints(self, ("max_gamma",), low=1)
        check_number(self, "probe_budget", low=0, high=1)
        if not (self.head or self.lookup):
            raise ValueError("RowsConfig needs a draft: head, lookup or both")
        check_number(self, "margin", low=0, high=1, open_high=True)
        for name in ("acceptance_decay", "cost_decay"):
            check_number(self, name, low=0, high=1, open_low=True)


@dataclass(eq=False)
class RowDepths:
    """Chooses each row's depth and source per step (the rule and its proof: the module docstring)."""

    config: RowsConfig
    per_row = True  # the engine hands `decide` each live row's `RowState`
    head_law: AcceptanceLaw = field(init=False)
    lookup_law: AcceptanceLaw = field(init=False)
    costs: RowCosts = field(init=False)
    _probes: ProbeClock = field(init=False)
    _last: tuple | None = field(init=False, default=None)  # (states, depths, lookup) of the step being run

    def __post_init__(self) -> None:
        k, decay = self.config.max_gamma, self.config.acceptance_decay
        self.head_law, self.lookup_law = AcceptanceLaw(k, decay), AcceptanceLaw(k, decay)
        self.costs, self._probes = RowCosts(self.config.cost_decay), ProbeClock(self.config.probe_budget)

    @property
    def max_gamma(self) -> int:
        return self.config.max_gamma

    # ---- the decision -------------------------------------------------------------------------------
    def survivals(self, states: list[RowState]) -> tuple[list[list[float]], list[bool]]:
        """Per row, s_{b,k} for k = 1..K from the source it would draft by, and whether that is prompt lookup."""
        out, looked, lookups = [], [], {}  # (a lookup's prediction depends on its match length alone: once each)
        for state in states:
            lookup = None
            if (self.config.lookup and state.match) or not self.config.head:
                if state.match not in lookups:
                    lookups[state.match] = self.lookup_law.predict(float(state.match))
                lookup = lookups[state.match]
            head = self.head_law.predict(state.entropy) if self.config.head else None  # [K]
            use = lookup is not None and (head is None or lookup[0] > head[0])
            survive, row = 1.0, []
            for alpha in (lookup if use else head)[:self._deepest(state)]:
                survive *= alpha
                row.append(survive)
            out.append(row)
            looked.append(use)
        return out, looked

    def _deepest(self, state: RowState) -> int:
        """A row drafts at most what its budget can take: a step emits up to its depth + 1 tokens, and tokens past
        the budget are cut."""
        return self.config.max_gamma if state.left is None else max(0, min(self.config.max_gamma, state.left - 1))

    def decide(self, rows: int, states: list[RowState]) -> Choice:
        """Each of the `rows` live rows' depth and source for the next step (`Choice.depths`, `Choice.lookup`)."""
        if len(states) != rows:
            raise ValueError(f"need one RowState per live row: {len(states)} for {rows} rows")
        bucket = row_bucket(rows)
        survivals, looked = self.survivals(states)
        price = self.costs.pricer(bucket, rows)
        if price is None or self.costs.to_measure(bucket) == "plain":
            return self._chosen(rows, states, [0] * rows, looked, 0.0, None if price is None else price(0, 0),
                                probe=True)
        plain = price(0, 0)
        drafted = self._best_budget(rows, survivals, price)  # (value, depths, expected, cost) of the best M > 0
        if self.costs.to_measure(bucket) == "draft":  # one drafting step before anything is priced on that side
            return self._chosen(rows, states, drafted[1], looked, drafted[2], drafted[3], probe=True)
        values = {"plain": rows / plain, "draft": drafted[0]}
        chosen = "draft" if values["draft"] > (1 + self.config.margin) * values["plain"] else "plain"
        other = "plain" if chosen == "draft" else "draft"
        # A probe of the other side, when what it would lose (its step at its worse rate) fits the probe budget.
        other_cost = plain if other == "plain" else drafted[3]
        loss = other_cost * max(MIN_PROBE_LOSS, 1 - values[other] / values[chosen])
        if self._probes.due(bucket, loss):
            chosen, probe = other, True
        else:
            probe = False
        if chosen == "plain":
            return self._chosen(rows, states, [0] * rows, looked, 0.0, plain, probe=probe)
        return self._chosen(rows, states, drafted[1], looked, drafted[2], drafted[3], probe=probe)

    def _best_budget(self, rows: int, survivals: list[list[float]], price) -> tuple[float, list[int], float, float]:
        """The drafting budget of the highest predicted tokens/s: each row drafts its positions among the M largest
        s_{b,k} (a prefix of its own); returns (tokens/s, depths, expected accepted drafts, predicted seconds)."""
        ranked = sorted(((s, b, i) for b, row in enumerate(survivals) for i, s in enumerate(row)),
                        key=lambda t: (-t[0], t[2], t[1]))
        best_m, best_value, best_gain, best_cost = 0, 0.0, 0.0, 0.0
        gained, deep = 0.0, 0
        for m, (s, _, i) in enumerate(ranked, 1):
            gained, deep = gained + s, max(deep, i + 1)
            cost = price(m, deep)
            if (rows + gained) / cost > best_value:
                best_m, best_value, best_gain, best_cost = m, (rows + gained) / cost, gained, cost
        depths = [0] * rows
        for _, b, i in ranked[:best_m]:  # each row's chosen positions are a prefix of its own: its depth
            depths[b] = max(depths[b], i + 1)
        return best_value, depths, best_gain, best_cost

    def _chosen(self, rows: int, states, depths: list[int], looked: list[bool], expected: float,
                cost: float | None, *, probe: bool) -> Choice:
        looked = [flag and d > 0 for flag, d in zip(looked, depths)]
        self._last = (list(states), list(depths), looked)
        gamma = max(depths, default=0)
        plain = self.costs.price(row_bucket(rows), rows, 0, 0)
        return Choice(gamma, rows, row_bucket(rows), expected / rows, cost, probe, depths=tuple(depths),
                      lookup=tuple(looked), budget=rows + sum(depths), plain_s=plain)

    # ---- learning -----------------------------------------------------------------------------------
    def observe(self, rows: int, gamma: int, seconds: float, num_accepted: list[int], switch_s: float = 0.0,
                draft_s: float = 0.0) -> None:
        """Learn from the step `decide` chose last: its seconds (less `switch_s`, the head's catch-up after plain
        steps, a price of switching, not of the depths), `draft_s` of them drafting, and what each row accepted."""
        if self._last is None:
            raise ValueError("observe() without a decide() before it")
        states, depths, looked = self._last
        self._last = None
        if len(num_accepted) != len(depths) or any(not 0 <= n <= d for n, d in zip(num_accepted, depths)):
            raise ValueError(f"num_accepted {num_accepted} does not fit the depths chosen {depths}")
        self.costs.observe(row_bucket(rows), rows, rows + sum(depths), max(depths, default=0), seconds - switch_s,
                           draft_s)
        self._probes.spent(row_bucket(rows), seconds, switch_s)
        for state, depth, lookup, n in zip(states, depths, looked, num_accepted):
            if depth:
                law = self.lookup_law if lookup else self.head_law
                law.observe(float(state.match) if lookup else state.entropy, depth, n)
        self.head_law.decay()
        self.lookup_law.decay()
