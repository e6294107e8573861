"""Notebook 01's figures against context (mk.sol.context_sweep), with and without the sliding window: the speed of
light, and the KV cache read per step (context ticks are the data's contexts, labelled 1K, 8K, 128K:
mk.figures.context_label); notebook 09's weights held by format, with the slice that holds them."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..figures import context_label, context_ticks, template_colours

WINDOW, NO_WINDOW = "solid", "dash"  # the line styles the notebook's text names: the counterfactual is dashed
TOP = 0.94  # the panels' share of the plot's height
LEGEND = dict(orientation="h", y=1.02, yanchor="bottom", x=0)


def context_figure(with_window: pd.DataFrame, without: pd.DataFrame, window: int, title: str) -> go.Figure:
    """Tokens/s per user against context, one panel per model, one colour per chip: solid lines with the
    model's sliding window, dashed ones without it (a counterfactual), a dotted vertical line at the window.
    The legend has one entry per chip and one per line style, not one per chip and style."""
    models = list(dict.fromkeys(with_window.model))
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=models, horizontal_spacing=0.08)
    fig.update_yaxes(domain=[0, TOP]).update_annotations(y=TOP)  # panel titles clear of the legend above
    colours = dict(zip(dict.fromkeys(with_window.chip), template_colours()))
    for col, model in enumerate(models, start=1):
        for table, dash in ((with_window, WINDOW), (without, NO_WINDOW)):
            for chip, g in table[table.model == model].groupby("chip", sort=False):
                g = g.sort_values("context")
                fig.add_scatter(
                    x=g.context,
                    y=g.tokens_per_s,
                    mode="lines+markers",
                    name=chip,
                    legendgroup=chip,
                    showlegend=col == 1 and dash == WINDOW,
                    line=dict(color=colours[chip], dash=dash),
                    marker=dict(size=5),
                    hovertemplate=f"{chip}, {'with' if dash == WINDOW else 'without'} the window<br>"
                    "%{x} positions: %{y:.0f} tok/s<extra></extra>",
                    row=1,
                    col=col,
                )
        fig.add_vline(x=window, line=dict(color="grey", dash="dot"), row=1, col=col)
        # a log axis places annotations at log10 of the value (shapes at the value itself)
        fig.add_annotation(x=math.log10(window), y=0, xref=f"x{col if col > 1 else ''}", yref="paper", showarrow=False,
                           text=f" sliding window ({context_label(window)})", xanchor="left", yanchor="bottom",
                           font=dict(color="grey"))  # fmt: skip
    for dash, name in ((WINDOW, "solid: sliding window"), (NO_WINDOW, "dashed: no window")):
        fig.add_scatter(x=[None], y=[None], mode="lines", name=name, line=dict(color="black", dash=dash))
    context_axis(fig, set(with_window.context) | set(without.context))
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="tokens/s per user (modelled, log)", col=1)
    fig.update_layout(title=title, legend=LEGEND)
    return fig


def context_axis(fig: go.Figure, contexts) -> go.Figure:
    """Every x axis of ``fig`` logarithmic over context, ticked at the data's ``contexts`` (mk.figures.context_ticks),
    labelled 1K, 8K, 128K."""
    ticks, text = context_ticks(contexts)
    return fig.update_xaxes(type="log", title_text="context (positions)", tickvals=ticks, ticktext=text)


def kv_figure(kv: pd.DataFrame, title: str) -> go.Figure:
    """GB of KV cache read per step against context, one panel per model, one line per ``series`` (which layers, with
    or without the window), both axes logarithmic; ``kv``: rows of ``model``, ``context``, ``series`` and ``GB``."""
    models = list(dict.fromkeys(kv.model))
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=models, horizontal_spacing=0.08)
    fig.update_yaxes(domain=[0, TOP]).update_annotations(y=TOP)  # panel titles clear of the legend above
    colours = dict(zip(dict.fromkeys(kv.series), template_colours()))
    for col, model in enumerate(models, start=1):
        for series, g in kv[kv.model == model].groupby("series", sort=False):
            g = g.sort_values("context")
            fig.add_scatter(
                x=g.context, y=g.GB, mode="lines+markers", name=series, legendgroup=series, showlegend=col == 1,
                line=dict(color=colours[series]), marker=dict(size=6),
                hovertemplate=f"{model}, {series}<br>%{{x}} positions: %{{y:.3g}} GB<extra></extra>", row=1, col=col,
            )  # fmt: skip
    context_axis(fig, kv.context)
    fig.update_yaxes(type="log")
    fig.update_yaxes(title_text="GB per step (log)", col=1)
    fig.update_layout(title=title, legend=LEGEND)
    return fig


def format_figure(t: pd.DataFrame, title: str, chip: str = "tpu-v5e") -> go.Figure:
    """The weights and caches a model holds in each format (mk.sol.format_table), one group of bars per model, each
    bar labelled with ``chip``'s smallest slice that holds it."""
    fig = go.Figure()
    for colour, (dtype, g) in zip(template_colours(), t.groupby("dtype", sort=False)):
        slices = [n.removeprefix("tpu-") for n in g[f"{chip} slice"]]  # short enough for neighbouring bars
        fig.add_bar(
            x=g.model, y=g.held_GB, name=dtype, marker_color=colour, text=slices,
            textposition="outside", cliponaxis=False,
            hovertemplate=f"{dtype}, %{{x}}: %{{y:.4g}} GB held; {chip}: %{{text}}<extra></extra>",
        )  # fmt: skip
    fig.update_yaxes(type="log", dtick=1, title_text="GB held (weights and caches, modelled)")
    fig.update_layout(
        title=title, barmode="group", legend_title_text="format", uniformtext=dict(minsize=10, mode="show")
    )
    return fig
