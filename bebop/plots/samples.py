"""A rollout's tokens coloured by origin (accepted / recovered / bonus), with entropy on hover."""

from __future__ import annotations

import html
from collections.abc import Mapping

import pandas as pd
import plotly.graph_objects as go

from bebop.plots.style import ORIGIN_COLORS, check_columns, apply_layout


def sample_tokens(sample: Mapping) -> pd.DataFrame:
    """A `samples` record as one row per generated token: [index, piece, origin, entropy]."""
    pieces, origin, entropy = sample.get("pieces"), sample.get("origin"), sample.get("entropy")
    if not isinstance(pieces, list) or not isinstance(origin, list) or not isinstance(entropy, list):
        raise ValueError("a sample needs list fields 'pieces', 'origin' and 'entropy'")
    if not len(pieces) == len(origin) == len(entropy):
        raise ValueError(f"pieces, origin and entropy differ in length: {len(pieces)}, {len(origin)}, {len(entropy)}")
    return pd.DataFrame({"index": range(len(pieces)), "piece": [str(p) for p in pieces],
                         "origin": [str(o) for o in origin], "entropy": pd.to_numeric(entropy, errors="coerce")})


def sample_html(tokens: pd.DataFrame) -> str:
    """The rollout's text, each token on a background of its origin's colour, entropy on hover."""
    check_columns(tokens, ("piece", "origin", "entropy"), "sample_html")
    spans = []
    for piece, origin, h in tokens[["piece", "origin", "entropy"]].itertuples(index=False):
        color = ORIGIN_COLORS.get(origin, "#CCCCCC")
        text = html.escape(piece).replace("\n", "↵<br>")
        spans.append(f'<span title="{html.escape(origin)} · H = {h:.3f} nats" style="background:{color}33;'
                     f'border-bottom:3px solid {color};padding:1px 0;white-space:pre-wrap">{text}</span>')
    return '<div style="font-family:ui-monospace,monospace;font-size:0.95rem;line-height:2">' + "".join(spans) + "</div>"


def token_figure(tokens: pd.DataFrame) -> go.Figure:
    """Entropy of every generated token, coloured by where it came from (accepted / recovered / bonus / plain)."""
    check_columns(tokens, ("index", "piece", "origin", "entropy"), "token_figure")
    fig = go.Figure()
    for origin, color in ORIGIN_COLORS.items():
        part = tokens[tokens["origin"] == origin]
        if len(part):
            fig.add_trace(go.Bar(x=part["index"], y=part["entropy"], name=origin, marker_color=color,
                                 customdata=part["piece"].map(repr),
                                 hovertemplate="token %{x} %{customdata}<br>H %{y:.3f} nats<extra>" + origin + "</extra>"))
    fig.update_layout(bargap=0.1)
    return apply_layout(fig, "Entropy per generated token, by origin", "token index", "H(p) (nats)", height=300)
