"""Notebook 07's figures: the timing model against the published numbers (mk.verdict's tables), both columns
of the component table, the verdict and the rule of thumb."""

from __future__ import annotations

import textwrap

import pandas as pd
import plotly.graph_objects as go

# Figures ----------------------------------------------------------------------------------------------
RATIO_RANGE = (0.01, 100.0)  # the validation figure's axis: ratios beyond it are drawn at its edge


ROLE_COLOURS = {"test": "#4e79a7", "test (baseline fitted)": "#76b7b2", "fitted": "#bab0ac", "input": "#9c755f"}


def validation_figure(table: pd.DataFrame) -> go.Figure:
    """Each published number's ratio modelled / published as a dot on a log axis (1 is exact), coloured by its
    role, so the fitted points (not tests) are told apart at a glance."""
    fig = go.Figure()
    t = table.assign(label=table.key + (" [" + table.component + "]").where(table.component != "", ""))
    ratio = t.modelled / t.published
    t = t.assign(
        ratio=ratio.clip(RATIO_RANGE[0], RATIO_RANGE[1]), clipped=(ratio < RATIO_RANGE[0]) | (ratio > RATIO_RANGE[1])
    )
    for role, g in t.groupby("role", sort=False):
        symbol = g.clipped.map({True: "triangle-left", False: "diamond" if role == "input" else "circle"})
        symbol[g.clipped & (g.ratio >= 1)] = "triangle-right"
        fig.add_scatter(
            x=g.ratio,
            y=g.label,
            mode="markers",
            name=role,
            marker=dict(size=11, color=ROLE_COLOURS.get(role), symbol=symbol),
            hovertext=g.case + ": modelled / published " + (g.modelled / g.published).map("{:.3g}".format),
        )
    fig.add_vline(x=1, line=dict(color="black", width=1))
    fig.update_xaxes(
        title_text="modelled / published (log; 1 is exact; triangles: beyond {:g} or {:g})".format(*RATIO_RANGE),
        type="log",
    )
    fig.update_yaxes(autorange="reversed", title_text="", tickmode="array", tickvals=t.label, ticktext=t.label)
    fig.update_layout(
        title="The timing model against every published number it can run",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        height=30 * len(t) + 250,
    )
    return fig


def component_figure(table: pd.DataFrame) -> go.Figure:
    """Both columns of the component table, published beside modelled, on a log axis (they span four orders
    of magnitude)."""
    from plotly.subplots import make_subplots

    columns = list(dict.fromkeys(table.column))
    fig = make_subplots(rows=1, cols=len(columns), subplot_titles=columns, horizontal_spacing=0.1)
    for i, col in enumerate(columns, start=1):
        g = table[table.column == col]
        for what, name in (("published_ms", "published"), ("modelled_ms", "modelled (mk.timing)")):
            fig.add_bar(
                x=g.component,
                y=g[what].clip(lower=1e-4),
                name=name,
                legendgroup=name,
                showlegend=i == 1,
                marker_color="#f28e2b" if name == "published" else "#4e79a7",
                row=1,
                col=i,
            )
        fig.update_yaxes(
            type="log", title_text="ms per step (log; below 1e-4 drawn at 1e-4)" if i == 1 else None, row=1, col=i
        )
    fig.update_layout(
        barmode="group",
        title="Where the time goes: kernel time (general stack) and shrink when off (megakernel)",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig


def verdict_figure(table: pd.DataFrame) -> go.Figure:
    """The verdict's speed-ups, published beside modelled (and measured where there is one)."""
    t = table.dropna(subset=["modelled"])
    t = t.assign(situation=t.situation.map(lambda s: "<br>".join(textwrap.wrap(s, 20))))
    fig = go.Figure()
    fig.add_bar(x=t.situation, y=t.published, name="published", marker_color="#f28e2b")
    fig.add_bar(x=t.situation, y=t.modelled, name="modelled (mk.timing)", marker_color="#4e79a7")
    if t.measured.notna().any():
        fig.add_bar(x=t.situation, y=t.measured, name="measured", marker_color="#59a14f")
    fig.add_hline(y=1, line=dict(color="black", dash="dot"))
    fig.update_layout(
        barmode="group",
        title="When a megakernel pays off: its speed-up over a general stack",
        yaxis_title="speed-up (tokens/s per user,<br>megakernel / general stack)",
        xaxis_tickangle=0,
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig


def rule_figure(table: pd.DataFrame) -> go.Figure:
    """The rule of thumb against the model: the megakernel's speed-up against the general stack's fraction
    of the speed of light, one point per model, context, batch and baseline; the rule's line at one half."""
    fig = go.Figure()
    for (model, on), g in table.groupby(["model", "general_on"], sort=False):
        fig.add_scatter(
            x=g.general_fraction_of_sol,
            y=g.speedup,
            mode="markers",
            name=f"{model} vs general on {on}",
            marker=dict(size=6 + 2 * g.batch, symbol="circle" if "moe" in model or "a4b" in model else "diamond"),
            hovertext="context " + g.context.astype(str) + ", batch " + g.batch.astype(str),
        )
    fig.add_vline(x=0.5, line=dict(color="black", dash="dot"), annotation_text="half the speed of light")
    fig.add_hline(y=1, line=dict(color="black", width=1))
    fig.update_layout(
        title="The rule of thumb: a general stack below half the speed of light leaves most to gain",
        xaxis_title="general stack's fraction of the speed of light (modelled)",
        yaxis_title="megakernel speed-up (marker size: users)",
        yaxis_type="log",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig
