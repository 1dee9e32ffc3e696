"""The figures of bebop, shared by the dashboard (app/) and the notebooks: tidy DataFrames in, Plotly out.

Every figure comes in two halves. A `*_data` function turns train streams (`{run name: DataFrame}` as
`bebop.runlog` reads them) into one tidy table with a `run` column: that table is what a CSV download
holds, at full resolution. The figure function draws that table. Rates are pooled from counters
(`bebop.metrics`), never averaged over steps, and the entropy-law line is `bebop.metrics.fit_entropy_law`.

On screen each trace keeps at most MAX_POINTS points (evenly thinned, first and last kept), smoothing is a
TensorBoard-style debiased EMA over the full series drawn over a faint raw trace, and a run keeps its
colour across every figure of a page (`run_colors`), and a (head, method) series across every figure of a notebook
(`series_colors`).

One module per kind of figure (style: shared colours and helpers; entropy; traces over time; speed; the Eq.-16
decomposition; samples); import them all from here: `from bebop import plots`.
"""

from bebop.plots.decomposition import decomposition_data, decomposition_figure
from bebop.plots.entropy import acceptance_vs_entropy, entropy_fits, entropy_points, fitted_span, token_points
from bebop.plots.samples import sample_html, sample_tokens, token_figure
from bebop.plots.speed import (
                               SPEED_COLORS,
                               positions,
                               positions_figure,
                               speedup_figure,
                               speedup_table,
                               step_time_figure,
                               step_times,
)
from bebop.plots.style import (
                               ACCEPT_LENGTH,
                               MAX_POINTS,
                               ORIGIN_COLORS,
                               PAIRED,
                               PALETTE,
                               SPEC_FIELDS,
                               TEMPLATE,
                               X_AXES,
                               has_spec,
                               missing_spec,
                               pooled,
                               run_colors,
                               series_colors,
                               smooth,
                               thin,
)
from bebop.plots.traces import by_series, lines, numeric_series, over_time

# bebop.plots.notebook (the renderer and runs root a notebook sets up) is imported by name, not re-exported here:
# the dashboard never needs it.

__all__ = [
    "ACCEPT_LENGTH",
    "MAX_POINTS",
    "ORIGIN_COLORS",
    "PAIRED",
    "PALETTE",
    "SPEC_FIELDS",
    "SPEED_COLORS",
    "TEMPLATE",
    "X_AXES",
    "acceptance_vs_entropy",
    "by_series",
    "decomposition_data",
    "decomposition_figure",
    "entropy_fits",
    "entropy_points",
    "fitted_span",
    "has_spec",
    "lines",
    "missing_spec",
    "numeric_series",
    "over_time",
    "pooled",
    "positions",
    "positions_figure",
    "run_colors",
    "sample_html",
    "series_colors",
    "sample_tokens",
    "smooth",
    "speedup_figure",
    "speedup_table",
    "step_time_figure",
    "step_times",
    "thin",
    "token_figure",
    "token_points",
]
