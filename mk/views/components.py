"""Bytes read per decode step by component (mk.sol.component_table's rows), one panel per model: horizontal bars on
a linear axis, each bar's GB written beside it, so a component too small to draw (the norms, the router) is still
read."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..figures import template_colours

BAR_PX = 17  # pixels a bar takes (a group of bars: one a series)
PANEL_GAP_PX = 110  # pixels between two panels: the upper one's axis title, the lower one's title
TOP_PX, BOTTOM_PX = 130, 110  # margins: the title and legend above the first panel, the footer below the last
ROOM = 1.22  # the axis runs to this multiple of the largest bar: room for its label


def gb_label(gb: float) -> str:
    """A bar's GB as its label: three significant figures (0.00128 GB, 0.21 GB, 41.6 GB)."""
    return f"{gb:.3g} GB"


def component_bytes_figure(rows: pd.DataFrame, series: str, title: str, order=None) -> go.Figure:
    """GB read per step by component, one panel per model (one above the other, each with its own scale: a dense
    model reads ten times a sparse one's), one bar per component and value of ``series`` (a column of ``rows``,
    e.g. ``dtype``), each bar's GB written beside it. ``rows``: mk.sol.component_table's columns (``model``,
    ``component``, ``bytes``) and ``series``; ``order``: the series' order (default: as they come)."""
    names = list(order) if order is not None else list(dict.fromkeys(rows[series]))
    models = list(dict.fromkeys(rows.model))
    comps = {m: list(dict.fromkeys(rows[rows.model == m].component)) for m in models}
    heights = [len(comps[m]) * (len(names) * BAR_PX + 8) for m in models]
    total = sum(heights)
    plot_px = total + PANEL_GAP_PX * (len(models) - 1)
    fig = make_subplots(
        rows=len(models), cols=1, subplot_titles=models, row_heights=[h / total for h in heights],
        vertical_spacing=PANEL_GAP_PX / plot_px,
    )  # fmt: skip
    colours = dict(zip(names, template_colours()))
    for row, model in enumerate(models, start=1):
        g = rows[rows.model == model]
        for name in names:
            s = g[g[series] == name].set_index("component").reindex(comps[model])
            gb = s.bytes / 1e9
            fig.add_bar(
                x=gb, y=comps[model], orientation="h", name=str(name), legendgroup=str(name), showlegend=row == 1,
                marker_color=colours[name], text=[gb_label(v) if pd.notna(v) else "" for v in gb],
                textposition="outside", textfont=dict(size=11), cliponaxis=False, constraintext="none",
                hovertemplate=f"{model}, {name}<br>%{{y}}: %{{x:.4g}} GB<extra></extra>", row=row, col=1,
            )  # fmt: skip
        top = float((g.bytes / 1e9).max())
        # categories top to bottom in the table's order; the axis from 0 to past the longest bar and its label
        fig.update_yaxes(autorange="reversed", categoryorder="array", categoryarray=comps[model], ticksuffix="  ",
                         row=row, col=1)  # fmt: skip
        fig.update_xaxes(range=[0, top * ROOM], title_text="GB read per step", title_standoff=4, row=row, col=1)
    fig.update_layout(
        title=title,
        barmode="group",
        bargap=0.18,
        height=plot_px + TOP_PX + BOTTOM_PX,
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0, title_text=f"{series}: "),
        margin=dict(l=150, t=TOP_PX, b=BOTTOM_PX),
    )
    return fig
