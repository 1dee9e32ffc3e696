"""The draft depth of each engine step: a `FixedDepth(gamma)`, or under `GenerationConfig(gamma="auto")` the
`DepthController`, which picks before each step

    γ* = argmax_{γ ∈ 0..K} (1 + E[accepted | γ]) / cost(rows, γ),    E[accepted | γ] = Σ_{j≤γ} Π_{i≤j} α_i

from two factors it measures as the engine runs, none a constant of the machine: α_i, the acceptance at draft position
i (decayed counts, PAPER α_i), and cost(rows, γ), a table of the seconds of engine steps per rows bucket and depth
(moving medians kept at one reference load). Plain decoding (γ = 0) is kept unless a draft promises `margin` more
tokens/s; depths without a price are measured first; now and then a probe runs another depth so no estimate goes stale.

Lossless: `decide` reads only what `observe` was given after earlier steps, never the coming step's draws, so each
step's verification sees a depth fixed before its randomness and emits exactly the target's law (bebop.verify), as
does any sequence of such steps.

How each factor is measured, and why (load, doubt, margin, exploration, probes): docs/draft-depth.md, which also lists
the modules (`choice`, `estimates`, `cells`, `probes`, `controller`, `counters`).

Under `GenerationConfig(gamma="rows")` each row gets its own depth and draft source per step instead, under a
verify-token budget: `RowDepths` (`rows`, with its acceptance laws `row_law` and its cost model `row_costs`).
"""

from bebop.engine.depth.cells import ROW_BUCKETS, row_bucket
from bebop.engine.depth.choice import Choice, Depth, FixedDepth
from bebop.engine.depth.controller import DepthConfig, DepthController
from bebop.engine.depth.rows import RowDepths, RowsConfig, RowState

__all__ = ["Choice", "Depth", "DepthConfig", "DepthController", "FixedDepth", "ROW_BUCKETS", "RowDepths", "RowState",
           "RowsConfig", "row_bucket"]
