"""Notebook 06's figures: both models' modelled tokens/s against context, batch, expert placement and chip
(mk.analysis.sweeps' tables) with the write-up's published points on them."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..analysis.sweeps import FRACTION_OF_SOL, SOL, SOL_BASELINE, WORKBOOK
from ..analysis.verdict import GENERAL_GPU
from ..config import get_config
from ..figures import context_label, context_ticks
from ..routing import expected_distinct_experts

# Figures --------------------------------------------------------------------------------------------------
LEGEND = dict(orientation="h", y=1.02, yanchor="bottom", x=0, font=dict(size=12))
TOP = 0.92  # the panels' share of the plot's height: their titles sit above, clear of the legend
POINT = dict(symbol="diamond", size=14, line=dict(color="black", width=1.5))  # every published point
BOUND = "speed of light: a bound"


def batch_ticks(batches) -> list[int]:
    """Users on a log axis: the powers of two from the fewest to the most, and both ends (1, 2, 4, 8)."""
    lo, hi = min(batches), max(batches)
    return sorted({lo, hi, *(2**k for k in range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1))})


def _legend_name(table: pd.DataFrame, role: str) -> str:
    """A series' legend entry, short: that it is modelled (the published points have their own entry), its engine
    and chip (a megakernel's: which kernel setup), with its data type per model when the models differ in it; the
    speed of light says it is a bound."""
    g = table[table.role == role]
    if role == SOL:
        return f"modelled: speed of light, {g.chip.iloc[0]} (a bound)"
    if role == SOL_BASELINE:
        return f"modelled: speed of light, {g.chip.iloc[0]} (the baseline's bound, in its data type)"
    label = f"modelled: {'megakernel' if g.engine.iloc[0] == 'megakernel' else 'general stack'}, {g.chip.iloc[0]}"
    if role == "general baseline":
        label += ", the baseline"
    elif g.engine.iloc[0] == "megakernel":  # its kernel setup by name (mk.kernel_setup)
        label += f", {g.setup.iloc[0] if 'setup' in g else KERNELS.get(role, role)}"
    dtypes = g.drop_duplicates("model")[["model", "dtype"]]
    if dtypes.dtype.nunique() == 1:
        return f"{label} ({dtypes.dtype.iloc[0]})"
    kinds = ["MoE" if get_config(m).is_moe else "dense" for m in dtypes.model]
    names = kinds if len(set(kinds)) == len(kinds) else list(dtypes.model)
    return f"{label} ({', '.join(f'{d} {n}' for d, n in zip(dtypes.dtype, names))})"


def _facets(models, rows: int = 1, **kw) -> go.Figure:
    titles = [get_config(m).name for m in models]
    fig = make_subplots(rows=rows, cols=len(titles), subplot_titles=titles * rows if rows > 1 else titles, **kw)
    return fig.update_yaxes(domain=[0, TOP]).update_annotations(y=TOP)


def _point_colour(p) -> str:
    if p.series_engine == "megakernel":
        return COLOURS["megakernel"]
    return COLOURS["general baseline" if p.chip == GENERAL_GPU else "general same chip"]


def _add_points(fig, points: pd.DataFrame, models, x: str):
    """The published points, each a diamond in its engine's colour, under one legend entry (the hover says
    which each is and how its tokens/s were obtained)."""
    names = [get_config(m).name for m in models]
    for p in points.itertuples():
        fig.add_scatter(
            x=[getattr(p, x)],
            y=[p.tokens_per_s],
            mode="markers",
            name=point_label(p),
            showlegend=False,
            marker=dict(POINT, color=_point_colour(p)),
            hovertext=[f"{point_label(p)}<br>{p.key}: {p.how}<br>{p.tokens_per_s:.1f} tok/s per user<br>{p.source}"],
            hoverinfo="text",
            row=1,
            col=names.index(p.model) + 1,
        )
    if len(points):
        fraction = (points.how == FRACTION_OF_SOL).any()
        name = "published: large diamonds, in their engine's colour" + (
            " (dense: fraction x modelled speed of light)" if fraction else ""
        )
        fig.add_scatter(x=[None], y=[None], mode="markers", name=name, marker=dict(POINT, color="white"))


def _label_bound(fig, table: pd.DataFrame, models, x: str, y: str, points: pd.DataFrame | None = None) -> None:
    """Write on each panel, just above the speed of light's highest point, that the line is a bound, not an
    engine; each panel's (log) y axis gets room above its highest value for it. The words run from that end
    of the line towards the other, which is lower, and every engine lies below the bound: they cross no line."""
    names = [get_config(m).name for m in models]
    for model, g in table[table.role == SOL].groupby("model", sort=False):
        g = g.sort_values(x)
        top = g.loc[g[y].idxmax()]
        left = top[x] == g[x].iloc[0]
        col = names.index(model) + 1
        axis = "" if col == 1 else col
        values = list(table[table.model == model][y])
        if points is not None:
            values += list(points[points.model == model].tokens_per_s)
        lo, hi = math.log10(min(values)), math.log10(max(values))
        pad = max(hi - lo, 0.1)
        fig.update_yaxes(range=[lo - 0.06 * pad, hi + 0.16 * pad], row=1, col=col)
        fig.add_annotation(
            x=math.log10(top[x]),
            y=math.log10(top[y]),
            xref=f"x{axis}",
            yref=f"y{axis}",
            text=BOUND,
            showarrow=False,
            xanchor="left" if left else "right",
            yanchor="bottom",
            xshift=4 if left else -4,
            yshift=4,
            font=dict(size=11, color=COLOURS[SOL]),
        )


def _series_lines(fig, table, models, x: str, y: str, row: int = 1, legend: bool = True, hover=None):
    names = [get_config(m).name for m in models]
    shown = set()
    for role in dict.fromkeys(table.role):
        for model, g in table[table.role == role].groupby("model", sort=False):
            g = g.sort_values(x)
            # dashed: a bound; dotted: the workbook's kernel (the write-up's line shows where they meet)
            dash = {SOL: "dash", SOL_BASELINE: "dash", WORKBOOK: "dot"}.get(role)
            fig.add_scatter(
                x=g[x],
                y=g[y],
                mode="lines+markers",
                name=_legend_name(table, role),
                legendgroup=role,
                showlegend=legend and role not in shown,
                line=dict(color=COLOURS.get(role), dash=dash),
                marker=dict(size=5),  # small: the published points are the large diamonds
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
    _label_bound(fig, table, models, "context", "tokens_per_s", points)
    ticks, text = context_ticks(set(table.context) | set(points.context))
    fig.update_xaxes(type="log", title_text="context (positions)", tickvals=ticks, ticktext=text)
    fig.update_yaxes(type="log", title_text="tokens/s per user (log)")
    fig.update_layout(title=title, legend=LEGEND)
    return fig


def _batch_ticks(table: pd.DataFrame, model: str) -> tuple[list, list]:
    """A panel's user ticks (:func:`batch_ticks`), an MoE model's with its expected distinct experts per layer."""
    cfg = get_config(model)
    ticks = batch_ticks(table[table.model == model].batch)
    if not cfg.is_moe:
        return ticks, [str(b) for b in ticks]
    experts = [expected_distinct_experts(cfg.num_experts, cfg.top_k, b) for b in ticks]
    return ticks, [f"{b}<br>({e:.1f})" for b, e in zip(ticks, experts)]


def batch_figure(table: pd.DataFrame, points: pd.DataFrame | None, models, title: str, total: bool = False):
    """Tokens/s per user (``total``: for all users together) against the batch, one panel per model (log axes);
    an MoE model's ticks carry the expected distinct experts per layer, every point's hover too."""
    names = [get_config(m).name for m in models]
    fig = _facets(models, horizontal_spacing=0.1)

    def hover(r):
        experts = f"<br>{r.expected_experts:.1f} distinct experts per layer" if r.expected_experts > 0 else ""
        return (
            f"{r.series} ({r.dtype})<br>{r.batch} users{experts}<br>{r.tokens_per_s:.1f} tok/s per user, "
            f"{r.tokens_per_s_total:.0f} in total<br>{r.fraction_of_sol:.2f} of its speed of light"
        )

    y = "tokens_per_s_total" if total else "tokens_per_s"
    _series_lines(fig, table, models, "batch", y, hover=hover)
    _label_bound(fig, table, models, "batch", y, None if total else points)
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


def placement_label(row) -> str:
    """A placement figure's series (a row of mk.analysis.sweeps.placement_table): modelled, its placement and its
    kernel setup by name (mk.kernel_setup), the placement said once."""
    said = f"{row.placement} experts" in row.setup
    return f"modelled: {row.setup}" if said else f"modelled: {row.placement} experts, {row.setup}"


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
    fig.update_yaxes(domain=[0, TOP]).update_annotations(y=TOP)
    colours = {"megakernel": COLOURS["megakernel"], "whole": "#59a14f", "before fixes": "#b07aa1"}
    for role, g in table.groupby("role", sort=False):
        g = g.sort_values("batch")
        for col, y in ((1, "tokens_per_s"), (2, "experts_per_chip"))[: 1 if role == "before fixes" else 2]:
            fig.add_scatter(
                x=g.batch,
                y=g[y],
                mode="lines+markers",
                name=placement_label(g.iloc[0]),
                legendgroup=role,
                showlegend=col == 1,
                line=dict(color=colours[role], dash="dot" if col == 2 else None),
                row=1,
                col=col,
            )
    for p in points.itertuples():
        colour = colours["megakernel"] if p.placement == "split" else colours["before fixes"]
        fig.add_scatter(
            x=[p.batch],
            y=[p.tokens_per_s],
            mode="markers",
            name=f"published: 1 / {p.published * 1e3:g} ms, before the fixes"
            if p.how == "1 / published step"
            else f"published: {p.published:g} tok/s",
            marker=dict(POINT, color=colour),
            hovertext=[f"{p.key}: {p.how}<br>{p.tokens_per_s:.1f} tok/s per user"],
            hoverinfo="text",
            row=1,
            col=1,
        )
    fig.update_xaxes(title_text="users (batch)", tickvals=batch_ticks(table.batch))
    fig.update_yaxes(type="log", title_text="tokens/s per user (log)", col=1)
    fig.update_yaxes(title_text="experts per layer (expected, uniform routing)", rangemode="tozero", col=2)
    fig.update_layout(title=title, legend=LEGEND)
    return fig


KERNELS = {"megakernel": "the write-up's kernel", WORKBOOK: "the workbook's kernel"}  # a megakernel role's setup


def kernel_name(table: pd.DataFrame, kernel: str | None = None) -> str:
    """Which kernel setup a table's megakernel rows are: ``kernel`` when given (a setup's ``.name``), else the
    table's ``kernel`` or ``setup`` column, else its megakernel rows' role (the write-up's kernel, or the
    workbook's)."""
    if kernel:
        return str(kernel)
    rows = table[table.engine == "megakernel"] if "engine" in table else table
    for column in ("kernel", "setup"):
        if column in rows and rows[column].notna().any():
            return str(rows[column].dropna().iloc[0])
    roles = [KERNELS[r] for r in dict.fromkeys(rows.get("role", [])) if r in KERNELS]
    return " / ".join(roles) or "the megakernel"


def chip_figure(table: pd.DataFrame, models, title: str, kernel: str | None = None) -> go.Figure:
    """Grouped bars per chip, one panel per model, one above the other (six chips' labels side by side need the
    width): the megakernel (its legend entry names the kernel setup, :func:`kernel_name`), the general stack and
    the speed of light, all modelled; a chip whose HBM the weights and caches do not fit is hatched and
    labelled."""
    names = [get_config(m).name for m in models]
    fig = make_subplots(rows=len(names), cols=1, subplot_titles=names, vertical_spacing=0.16)
    for i in range(len(names)):  # the panels below the top 10% (the legend); their titles with them
        axis = fig.layout[f"yaxis{i + 1 if i else ''}"]
        axis.domain = [d * 0.9 for d in axis.domain]
    fig.for_each_annotation(lambda a: a.update(y=a.y * 0.9))
    colours = {"megakernel": COLOURS["megakernel"], "general stack": COLOURS["general same chip"], SOL: "#bab0ac"}
    labels = {
        "megakernel": f"modelled: megakernel, {kernel_name(table, kernel)}",
        "general stack": "modelled: general stack",
        SOL: f"modelled: {SOL} (a bound: bytes only)",
    }
    for i, m in enumerate(names):
        top = table[table.model == m].tokens_per_s.max()
        for series, g in table[table.model == m].groupby("series", sort=False):
            fit = g.fits_in_hbm.astype(bool)
            fig.add_bar(
                x=g.chip,
                y=g.tokens_per_s,
                legendgroup=series,
                showlegend=i == 0,
                marker=dict(color=colours[series], pattern=dict(shape=["" if f else "/" for f in fit])),
                name=labels.get(series, series),
                # the speed of light's bars say on the plot that they are a bound, not an engine
                text=["<br>".join(["bound"] * (series == SOL) + ["does not fit"] * (not f)) for f in fit],
                textposition="outside",
                textfont=dict(size=11),
                constraintext="none",  # at its own size: plotly shrinks text to a grouped bar's width (6 pixels)
                cliponaxis=False,
                hovertext=[
                    f"{r.chip}: {r.tokens_per_s:.0f} tok/s, {r.fraction_of_sol:.2f} of the speed of light; "
                    f"weights {r.weights_GB:.0f} GB, HBM {r.hbm_GB:.0f} GB"
                    for r in g.itertuples()
                ],
                hoverinfo="text",
                row=i + 1,
                col=1,
            )
        fig.update_yaxes(range=[0, 1.2 * top], row=i + 1, col=1)  # room above the tallest bar for its words
    if not table.fits_in_hbm.all():
        fig.add_bar(
            x=[None],
            y=[None],
            name="hatched: weights + KV cache do not fit the chip's HBM",
            marker=dict(color="white", line=dict(color="black", width=1), pattern=dict(shape="/")),
        )
    fig.update_xaxes(title_text="chip or slice", row=len(names), col=1)
    fig.update_xaxes(tickangle=0)
    fig.update_yaxes(title_text="tokens/s per user")
    fig.update_layout(title=title, legend=LEGEND, barmode="group", height=300 * len(names) + 250)
    return fig


def _case_label(context: int, batch: int) -> str:
    return f"{context_label(context)}, {batch} {'users' if batch > 1 else 'user'}"


def attention_split_figure(table: pd.DataFrame, models, title: str) -> go.Figure:
    """Grouped bars, one panel per model (mk.analysis.sweeps.attention_split_table): the workbook's kernel's fraction of
    the speed of light at each context and batch with attention split by heads, positions and users, the step
    written in each bar."""
    names = [get_config(m).name for m in models]
    fig = _facets(models, horizontal_spacing=0.08)
    colours = {"heads": "#bab0ac", "positions": COLOURS[WORKBOOK], "users": "#9c755f"}
    for i, m in enumerate(names):
        g = table[table.model == m]
        cases = [_case_label(n, b) for n, b in g[["context", "batch"]].drop_duplicates().values]
        for split, h in g.groupby("attention_split", sort=False):
            fig.add_bar(
                x=[_case_label(n, b) for n, b in zip(h.context, h.batch)],
                y=h.fraction_of_sol,
                name=f"split by {split}",
                legendgroup=split,
                showlegend=i == 0,
                marker_color=colours[split],
                text=[f"{ms:.3g} ms" for ms in h.step_ms],
                textposition="inside",
                insidetextanchor="end",
                textangle=-90,
                hovertext=[
                    f"{split}: {r.step_ms:.3f} ms, {r.fraction_of_sol:.1%} of the speed of light; KV {r.kv_GB:.3f} GB, "
                    f"sent {r.sent_MB:.1f} MB"
                    for r in h.itertuples()
                ],
                hoverinfo="text",
                row=1,
                col=i + 1,
            )
        fig.update_xaxes(categoryorder="array", categoryarray=cases, row=1, col=i + 1)
    fig.update_xaxes(title_text="context, users (in each bar: the step)")
    fig.update_yaxes(title_text="fraction of the speed of light", range=[0, 1.05], tickformat=".0%")
    fig.update_layout(title=title, legend=LEGEND, barmode="group")
    return fig


def speculation_figure(table: pd.DataFrame, models, title: str) -> go.Figure:
    """Tokens/s per user against drafts a round (mk.analysis.sweeps.speculation_table), one panel per model, a line per
    slice, users and acceptance rate, plain decoding's tokens/s dotted at K = 0."""
    names = [get_config(m).name for m in models]
    fig = _facets(models, horizontal_spacing=0.08)
    dashes = ["solid", "dash", "dot", "dashdot"]
    palette = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"]
    cases = table[["chip", "users"]].drop_duplicates().values.tolist()
    rates = sorted(table.accept_rate.unique())
    for i, m in enumerate(names):
        g = table[table.model == m]
        for c, (chip, users) in enumerate(cases):
            for j, a in enumerate(rates):
                h = g[(g.chip == chip) & (g.users == users) & (g.accept_rate == a)]
                if h.empty:
                    continue
                label = f"{chip}, {users} user{'s' if users > 1 else ''}, acceptance {a:.0%}"
                fig.add_scatter(
                    x=[0, *h.draft_tokens], y=[h.plain_tokens_per_s.iloc[0], *h.tokens_per_s], mode="lines+markers",
                    name=label, legendgroup=label, showlegend=i == 0,
                    line=dict(color=palette[c % len(palette)], dash=dashes[j % len(dashes)]),
                    hovertext=[f"{label}: plain {h.plain_tokens_per_s.iloc[0]:.0f} tok/s"] + [
                        f"{label}, K={r.draft_tokens}: {r.tokens_per_s:.0f} tok/s ({r.speedup:.2f}x), round "
                        f"{r.round_ms:.3f} ms, {r.distinct_experts:.1f} distinct experts a layer"
                        for r in h.itertuples()
                    ],
                    hoverinfo="text", row=1, col=i + 1,
                )  # fmt: skip
    fig.update_xaxes(title_text="drafts verified a round, K (0: plain decoding)", dtick=1)
    fig.update_yaxes(title_text="tokens/s per user", rangemode="tozero")
    # the legend above the plots (hung below the title on export): below them it ran under the provenance footer
    fig.update_layout(title=title, legend=LEGEND, height=700)
    return fig


COLOURS = {
    "megakernel": "#4e79a7",
    WORKBOOK: "#76b7b2",
    "general baseline": "#f28e2b",
    "general same chip": "#e15759",
    SOL: "#555555",
    SOL_BASELINE: "#f5b87a",  # the baseline's colour, lighter: its bound
}


def point_label(p) -> str:
    """A published point's legend entry: what ran where, and how its tokens/s were obtained."""
    who = "vLLM" if p.series_engine == "general" else "megakernel"
    if p.how == FRACTION_OF_SOL:
        return f"published fraction {p.published:g} x modelled speed of light: {who}, {p.chip}"
    if p.how == "1 / published step":
        return f"published 1 / {p.published * 1e3:g} ms: {who} before the fixes, {p.chip}"
    return f"published {p.published:g} tok/s: {who}, {p.chip}, {p.dtype}"
