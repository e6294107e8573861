"""The all-reduce's figures: notebook 05's step after each fix (mk.analysis.allreduce.fix_steps), notebook 09's
share of the step over slices of 8 to 256 chips (allreduce_share)."""

from __future__ import annotations

import textwrap

import pandas as pd
import plotly.graph_objects as go

from ..figures import template_colours

LABEL_WIDTH = 18  # characters a line of a bar's label: seven setups' names side by side


def wrap(name: str, width: int = LABEL_WIDTH) -> str:
    """A setup's name as a tick label: broken after its own joints (``: ``, ``; ``) and between words past
    ``width`` characters, lines joined by <br>."""
    parts = name.replace(": ", ":\n").replace("; ", ";\n").split("\n")
    return "<br>".join(
        line for part in parts for line in textwrap.wrap(part, width, break_long_words=False, break_on_hyphens=False)
    )


def fix_figure(steps: pd.DataFrame, title: str) -> go.Figure:
    """:func:`fix_steps` as bars: the modelled step after each fix beside its published time, with the
    floors the chip's HBM bandwidth sets (weights as moved, and their payload, plus the KV cache) marked on
    the modelled bar, each bar's step written above it in ms, and the speed of light (the step's bytes at the
    slice's HBM bandwidth, from each row's ``fraction_of_sol``) a dashed line across."""
    label = steps.fix.map(wrap)
    timed = steps.published_ms.notna()
    fig = go.Figure()
    ms = dict(textposition="outside", textfont=dict(size=12), constraintext="none", cliponaxis=False)
    fig.add_bar(x=label, y=steps.step_ms, name="modelled step", offsetgroup="modelled",
                text=[f"{v:.2f} ms" for v in steps.step_ms], **ms)  # fmt: skip
    fig.add_bar(x=label[timed], y=steps.published_ms[timed], name="published step", offsetgroup="published",
                text=[f"{v:.2f} ms" for v in steps.published_ms[timed]], **ms)  # fmt: skip
    # the speed of light: every fix's step over its fraction of it (the same bytes at the data sheet's bandwidth)
    sol = float((steps.step_ms * steps.fraction_of_sol).median())
    fig.add_hline(y=sol, line=dict(color="#555", dash="dash", width=2))
    fig.add_scatter(
        x=[None],
        y=[None],
        mode="lines",
        line=dict(color="#555", dash="dash", width=2),
        name=f"speed of light: {sol:.2f} ms (all bytes at the data sheet's bandwidth)",
    )  # its legend entry; fmt: skip
    for column, name, symbol in (
        ("hbm_floor_ms", "floor: weights as moved (padded) + KV cache at the chip's read rate", "line-ew"),
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
        yaxis_range=[0, 1.12 * max(steps.step_ms.max(), steps.published_ms.max())],  # room for the values
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        xaxis_tickangle=0,  # the labels wrap at each change instead: tilted, the longest ran into the footer
        xaxis_tickfont_size=11,  # seven wrapped labels side by side
    )
    return fig


def share_figure(share: pd.DataFrame, title: str) -> go.Figure:
    """mk.analysis.allreduce.allreduce_share as stacked bars, one per slice: the step's time holding compute on the
    all-reduces and the rest of it, in ms, each bar labelled with the all-reduce's share and hatched where the model
    does not fit the slice's HBM (its time assumes it did)."""
    label = [
        f"{r.chips} chips<br>{r.topology}, {r.hosts:g} host{'s' if r.hosts != 1 else ''}" for r in share.itertuples()
    ]
    fits = share.fits_in_hbm.tolist()
    pattern = dict(shape=["" if f else "/" for f in fits])
    links, rest = template_colours()[:2]
    fig = go.Figure()
    fig.add_bar(x=label, y=share.allreduce_ms, marker=dict(color=links, pattern=pattern), showlegend=False)
    fig.add_bar(
        x=label, y=share.step_ms - share.allreduce_ms, marker=dict(color=rest, pattern=pattern),
        showlegend=False,
        text=[f"{s:.0%} all-reduce" + ("" if f else "<br>(does not fit)") for s, f in zip(share.share, fits)],
        textposition="outside", cliponaxis=False,
    )  # fmt: skip
    # the legend's own swatches: plain colours for the two parts, the hatching said once
    for name, colour, shape in (
        ("all-reduces (on the links)", links, ""),
        ("the rest of the step", rest, ""),
        *([("hatched: does not fit the slice's HBM (the time assumes it did)", "#bab0ac", "/")] * (not all(fits))),
    ):
        fig.add_bar(x=[None], y=[None], name=name, marker=dict(color=colour, pattern=dict(shape=shape)))
    fig.update_layout(
        title=title, barmode="stack", yaxis_title="ms per decode step (modelled)",
        yaxis_range=[0, 1.2 * float(share.step_ms.max())],
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0, traceorder="normal"), xaxis_tickangle=0,
    )  # fmt: skip
    return fig
