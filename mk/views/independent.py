"""Notebook 09's figure: the timing model against independent published decode steps (mk.analysis.independent)."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from ..analysis.independent import MISS, TESTED

ENGINE_LOOK = {"megakernel": ("#e15759", "diamond"), "general": ("#4e79a7", "circle")}


def _series_name(engine: str, g: pd.DataFrame) -> str:
    """An engine's legend entry: the engine, the kernel setup the megakernel's points are modelled in (the table's
    ``setup`` column, mk.kernel_setup), and how many points it has."""
    setups = list(dict.fromkeys(g.setup)) if "setup" in g.columns and engine == "megakernel" else []
    return f"{engine}{''.join(f', {s}' for s in setups)} ({len(g)} points)"


def independent_figure(table: pd.DataFrame) -> go.Figure:
    """Each point the model predicts, published time per output token against the modelled one, both on log axes:
    on the diagonal the model is exact, inside the band within +-30%; one colour and symbol per engine, the
    megakernel's legend entry naming its kernel setup, the hover naming the page's stack, chip and users."""
    t = table[table.role == TESTED]
    lo = min(t.published_ms.min(), t.modelled_ms.min()) / 1.5
    hi = max(t.published_ms.max(), t.modelled_ms.max()) * 1.5
    fig = go.Figure()
    line = [lo, hi]
    fig.add_scatter(
        x=line + line[::-1],
        y=[v * (1 + MISS) for v in line] + [v * (1 - MISS) for v in line[::-1]],
        fill="toself",
        mode="lines",
        fillcolor="rgba(150,150,150,0.18)",
        line=dict(width=0),
        name=f"within +-{MISS:.0%}",
        hoverinfo="skip",
    )
    fig.add_scatter(x=line, y=line, mode="lines", line=dict(color="black", dash="dot", width=1), name="exact")
    for engine, (colour, symbol) in ENGINE_LOOK.items():
        g = t[t.engine == engine]
        if g.empty:
            continue
        fig.add_scatter(
            x=g.published_ms,
            y=g.modelled_ms,
            mode="markers",
            name=_series_name(engine, g),
            marker=dict(size=11, color=colour, symbol=symbol, line=dict(width=1, color="white")),
            hovertext=[
                f"{r.key}<br>{r.stack}, {r.chip}, {r.batch} user(s), {r.dtype}<br>published {r.published_ms:.3g} ms, "
                f"modelled {r.modelled_ms:.3g} ms ({r.error:+.0%})"
                for r in g.itertuples()
            ],
            hoverinfo="text",
        )
    axis = dict(type="log", range=[math.log10(lo), math.log10(hi)])
    fig.update_xaxes(title_text="published (data/independent.csv): ms per output token per user (log)", **axis)
    fig.update_yaxes(title_text="modelled (mk.timing): ms per output token per user (log)", **axis)
    fig.update_layout(
        title="Independent published decode steps against the timing model",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        height=640,
    )
    return fig
