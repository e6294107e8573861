"""Notebook 06's figures: both models' modelled tokens/s against context, batch, expert placement and chip
(mk.sweeps' tables) with the write-up's published points on them."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..config import get_config
from ..sweeps import FRACTION_OF_SOL, SOL
from ..verdict import GENERAL_GPU

# Figures --------------------------------------------------------------------------------------------------
LEGEND = dict(orientation="h", y=1.02, yanchor="bottom", x=0, font=dict(size=11))


def _context_label(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _legend_name(table: pd.DataFrame, role: str) -> str:
    """A series' legend entry, with its data type per model when the models differ in it."""
    g = table[table.role == role]
    label = g.series.iloc[0]
    dtypes = g.drop_duplicates("model")[["model", "dtype"]]
    if dtypes.dtype.nunique() == 1:
        return f"{label} ({dtypes.dtype.iloc[0]})"
    kinds = ["MoE" if get_config(m).is_moe else "dense" for m in dtypes.model]
    names = kinds if len(set(kinds)) == len(kinds) else list(dtypes.model)
    return f"{label} ({', '.join(f'{d} {n}' for d, n in zip(dtypes.dtype, names))})"


def _facets(models, rows: int = 1, **kw) -> go.Figure:
    titles = [get_config(m).name for m in models]
    return make_subplots(rows=rows, cols=len(titles), subplot_titles=titles * rows if rows > 1 else titles, **kw)


def _add_points(fig, points: pd.DataFrame, models, x: str, symbols=("diamond", "star", "square", "cross")):
    names = [get_config(m).name for m in models]
    for i, p in enumerate(points.itertuples()):
        colour = COLOURS["megakernel"] if p.series_engine == "megakernel" else COLOURS["general baseline"]
        if p.series_engine == "general" and p.chip != GENERAL_GPU:
            colour = COLOURS["general same chip"]
        fig.add_scatter(
            x=[getattr(p, x)],
            y=[p.tokens_per_s],
            mode="markers",
            name=point_label(p),
            marker=dict(symbol=symbols[i % len(symbols)], size=14, color=colour, line=dict(color="black", width=1.5)),
            hovertext=[f"{p.key}: {p.how}<br>{p.tokens_per_s:.1f} tok/s per user<br>{p.source}"],
            hoverinfo="text",
            row=1,
            col=names.index(p.model) + 1,
        )


def _series_lines(fig, table, models, x: str, y: str, row: int = 1, legend: bool = True, hover=None):
    names = [get_config(m).name for m in models]
    shown = set()
    for role in dict.fromkeys(table.role):
        for model, g in table[table.role == role].groupby("model", sort=False):
            g = g.sort_values(x)
            dash = "dash" if role == SOL else None
            fig.add_scatter(
                x=g[x],
                y=g[y],
                mode="lines+markers",
                name=_legend_name(table, role),
                legendgroup=role,
                showlegend=legend and role not in shown,
                line=dict(color=COLOURS.get(role), dash=dash),
                hovertext=[hover(r) for r in g.itertuples()] if hover else None,
                hoverinfo="text+y" if hover else None,
                row=row,
                col=names.index(model) + 1,
            )
            shown.add(role)


def context_figure(table: pd.DataFrame, points: pd.DataFrame, models, title: str) -> go.Figure:
    """Tokens/s per user against context, one panel per model (log axes), the published points on it."""
    fig = _facets(models, horizontal_spacing=0.1)
    _series_lines(
        fig,
        table,
        models,
        "context",
        "tokens_per_s",
        hover=lambda r: (
            f"{r.series} ({r.dtype})<br>{r.context} positions<br>{r.fraction_of_sol:.2f} of its speed of light"
        ),
    )
    _add_points(fig, points, models, "context")
    contexts = sorted(set(table.context) | set(points.context))
    fig.update_xaxes(
        type="log", title_text="context (positions)", tickvals=contexts, ticktext=[_context_label(n) for n in contexts]
    )
    fig.update_yaxes(type="log", title_text="tokens/s per user (log)")
    fig.update_layout(title=title, legend=LEGEND)
    return fig


def _batch_ticks(table: pd.DataFrame, model: str) -> tuple[list, list]:
    g = table[table.model == model].drop_duplicates("batch").sort_values("batch")
    if (g.expected_experts == 0).all():
        return list(g.batch), [str(b) for b in g.batch]
    return list(g.batch), [f"{b}<br>({e:.1f})" for b, e in zip(g.batch, g.expected_experts)]


def batch_figure(table: pd.DataFrame, points: pd.DataFrame | None, models, title: str, total: bool = False):
    """Tokens/s per user (``total``: for all users together) against the batch, one panel per model (log axes);
    an MoE model's ticks carry the expected distinct experts per layer, every point's hover too."""
    names = [get_config(m).name for m in models]
    fig = _facets(models, horizontal_spacing=0.1)

    def hover(r):
        experts = f"<br>{r.expected_experts:.1f} distinct experts per layer" if r.expected_experts else ""
        return (
            f"{r.series} ({r.dtype})<br>{r.batch} users{experts}<br>{r.tokens_per_s:.1f} tok/s per user, "
            f"{r.tokens_per_s_total:.0f} in total<br>{r.fraction_of_sol:.2f} of its speed of light"
        )

    _series_lines(fig, table, models, "batch", "tokens_per_s_total" if total else "tokens_per_s", hover=hover)
    if points is not None and len(points):
        _add_points(fig, points[points.batch.isin(table.batch)], models, "batch")
    for i, m in enumerate(names):
        vals, text = _batch_ticks(table, m)
        moe = text[0] != str(vals[0])
        fig.update_xaxes(
            type="log",
            tickvals=vals,
            ticktext=text,
            tickangle=0,
            col=i + 1,
            title_text="users (batch)" + ("; below: expected distinct experts per layer" if moe else ""),
        )
    what = "tokens/s, all users together (log)" if total else "tokens/s per user (log)"
    fig.update_yaxes(type="log", title_text=what)
    fig.update_layout(title=title, legend=LEGEND)
    return fig


def placement_figure(table: pd.DataFrame, points: pd.DataFrame, title: str) -> go.Figure:
    """Left: the megakernel's tokens/s per user against the batch for split and whole experts (and whole before
    the fixes), the published after and before points on it. Right: the experts one chip loads per layer (the
    same whole experts before and after the fixes)."""
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.12,
        column_widths=[0.6, 0.4],
        subplot_titles=("tokens/s per user", "experts one chip loads per layer"),
    )
    colours = {"megakernel": COLOURS["megakernel"], "whole": "#59a14f", "before fixes": "#b07aa1"}
    for role, g in table.groupby("role", sort=False):
        g = g.sort_values("batch")
        for col, y in ((1, "tokens_per_s"), (2, "experts_per_chip"))[: 1 if role == "before fixes" else 2]:
            fig.add_scatter(
                x=g.batch,
                y=g[y],
                mode="lines+markers",
                name=g.series.iloc[0],
                legendgroup=role,
                showlegend=col == 1,
                line=dict(color=colours[role], dash="dot" if col == 2 else None),
                row=1,
                col=col,
            )
    for p, symbol in zip(points.itertuples(), ("diamond", "star")):
        colour = colours["megakernel"] if p.placement == "split" else colours["before fixes"]
        fig.add_scatter(
            x=[p.batch],
            y=[p.tokens_per_s],
            mode="markers",
            name=point_label(p),
            marker=dict(symbol=symbol, size=14, color=colour, line=dict(color="black", width=1.5)),
            hovertext=[f"{p.key}: {p.how}<br>{p.tokens_per_s:.1f} tok/s per user"],
            hoverinfo="text",
            row=1,
            col=1,
        )
    batches = sorted(set(table.batch))
    fig.update_xaxes(title_text="users (batch)", tickvals=batches)
    fig.update_yaxes(type="log", title_text="tokens/s per user (log)", col=1)
    fig.update_yaxes(title_text="experts per layer (expected, uniform routing)", rangemode="tozero", col=2)
    fig.update_layout(title=title, legend=LEGEND)
    return fig


def chip_figure(table: pd.DataFrame, models, title: str) -> go.Figure:
    """Grouped bars per chip, one panel per model: the megakernel, the general stack and the speed of light;
    a chip whose HBM the weights and caches do not fit is hatched and labelled."""
    names = [get_config(m).name for m in models]
    fig = _facets(models, horizontal_spacing=0.1)
    colours = {"megakernel": COLOURS["megakernel"], "general stack": COLOURS["general same chip"], SOL: "#bab0ac"}
    for i, m in enumerate(names):
        for series, g in table[table.model == m].groupby("series", sort=False):
            fit = g.fits_in_hbm.astype(bool)
            fig.add_bar(
                x=g.chip,
                y=g.tokens_per_s,
                name=series,
                legendgroup=series,
                showlegend=i == 0,
                marker=dict(color=colours[series], pattern=dict(shape=["" if f else "/" for f in fit])),
                text=["" if f else "does not fit" for f in fit],
                textposition="outside",
                hovertext=[
                    f"{r.chip}: {r.tokens_per_s:.0f} tok/s, {r.fraction_of_sol:.2f} of the speed of light; "
                    f"weights {r.weights_GB:.0f} GB, HBM {r.hbm_GB:.0f} GB"
                    for r in g.itertuples()
                ],
                hoverinfo="text",
                row=1,
                col=i + 1,
            )
    if not table.fits_in_hbm.all():
        fig.add_bar(
            x=[None],
            y=[None],
            name="hatched: weights + KV cache do not fit the chip's HBM",
            marker=dict(color="white", line=dict(color="black", width=1), pattern=dict(shape="/")),
        )
    fig.update_xaxes(title_text="chip or slice")
    fig.update_yaxes(title_text="tokens/s per user")
    fig.update_layout(title=title, legend=LEGEND, barmode="group")
    return fig


COLOURS = {"megakernel": "#4e79a7", "general baseline": "#f28e2b", "general same chip": "#e15759", SOL: "#555555"}


def point_label(p) -> str:
    """A published point's legend entry: what ran where, and how its tokens/s were obtained."""
    who = "vLLM" if p.series_engine == "general" else "megakernel"
    if p.how == FRACTION_OF_SOL:
        return f"published fraction {p.published:g} x modelled speed of light: {who}, {p.chip}"
    if p.how == "1 / published step":
        return f"published 1 / {p.published * 1e3:g} ms: {who} before the fixes, {p.chip}"
    return f"published {p.published:g} tok/s: {who}, {p.chip}, {p.dtype}"
