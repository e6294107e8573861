"""Notebook 05's figure of the step after each fix (mk.allreduce.fix_steps)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go


def fix_figure(steps: pd.DataFrame, title: str) -> go.Figure:
    """:func:`fix_steps` as bars: the modelled step after each fix beside its published time, with the
    floors the chip's HBM bandwidth sets (weights as moved, and their payload, plus the KV cache) marked on
    the modelled bar."""
    label = steps.fix.str.replace(", ", "<br>").str.replace(" + ", "<br>+ ")
    timed = steps.published_ms.notna()
    fig = go.Figure()
    fig.add_bar(x=label, y=steps.step_ms, name="modelled step", offsetgroup="modelled")
    fig.add_bar(x=label[timed], y=steps.published_ms[timed], name="published step", offsetgroup="published")
    for column, name, symbol in (
        ("hbm_floor_ms", "floor: weights as moved (padded) + KV cache at HBM bandwidth", "line-ew"),
        ("payload_floor_ms", "floor: weights without the padding + KV cache", "x-thin"),
    ):
        fig.add_scatter(
            x=label,
            y=steps[column],
            mode="markers",
            name=name,
            offsetgroup="modelled",
            marker=dict(symbol=symbol, size=22, line=dict(width=3, color="black"), color="black"),
        )
    fig.update_layout(
        barmode="group",
        scattermode="group",
        title=title,
        yaxis_title="ms per decode step",
        yaxis_rangemode="tozero",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        xaxis_tickangle=0,  # the labels wrap at each change instead: tilted, the longest ran into the footer
    )
    return fig
