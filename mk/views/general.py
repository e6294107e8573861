"""Notebook 02's figures: the general stack's component knock-outs beside the seed's component table, and its
decode speed against the measured speed of light."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..figures import floored, log_floor, log_tick_values, tick_label

LEGEND = dict(orientation="h", y=1.02, yanchor="bottom", x=0)
KIND_COLOURS = {"measured": "#4e79a7", "modelled": "#bab0ac", "published": "#f28e2b"}
NAMES = {"modelled": "modelled: bytes / measured bandwidth", "measured": "measured: the reference's decode step"}
TOP = 0.92  # the panels' share of the plot's height: their titles sit above, clear of the legend


def _kind(label: str) -> str:
    """The kind a table's free-text ``kind`` label starts with (``"modelled from measured bandwidth"``)."""
    return str(label).split()[0]


def floor_axis(floor: float, top: float) -> dict:
    """A logarithmic axis from ``floor`` (where its bars start, labelled as the floor) up to ``top``, labelled up to
    half of it: a label at the very top would run into the panel's title above the axis."""
    ticks = [t for t in log_tick_values(floor, top) if floor * 1.01 < t <= top / 2]
    return dict(
        type="log",
        range=[math.log10(floor), math.log10(top)],
        tickvals=[floor, *ticks],
        ticktext=[f"floor {tick_label(floor)}", *map(tick_label, ticks)],
    )


def percent(x: float) -> str:
    """A fraction as notebook 02 writes it, in its sentences and on its figure alike: one decimal (two below 1%)."""
    return f"{x:.1%}" if abs(x) >= 0.01 else f"{x:.2%}"


def _three_figures(x: float) -> str:
    """``x`` to three significant figures, trailing zeros kept (11.0, 7.31, 123)."""
    decimals = max(0, 2 - math.floor(math.log10(abs(x)))) if x else 2
    return f"{x:.{decimals}f}"


def times(median: float, low: float, high: float, what: str = "") -> str:
    """A ratio, then ``what`` it is, then its 95% interval, as notebook 02 writes them in its sentences and on its
    figure alike, to three significant figures ("7.31x slower (6.93-7.85x)"); the interval left out where it rounds to
    the median itself."""
    m, lo, hi = (_three_figures(x) for x in (median, low, high))
    return f"{m}x{what}" if lo == m == hi else f"{m}x{what} ({lo}-{hi}x)"


def bar_note(row) -> str:
    """What a summary row's bar says above it: its fraction of the speed of light (the median of the round-by-round
    fractions, with its 95% interval when it has one), else how many times slower than the compiled step it is
    (paired by round, with its interval)."""
    if pd.notna(row.fraction_of_sol):
        interval = "" if pd.isna(row.fraction_low) else f" ({percent(row.fraction_low)}-{percent(row.fraction_high)})"
        return f"{percent(row.fraction_of_sol)} of SoL{interval}"
    return times(row.slower_than_compiled, row.slower_low, row.slower_high, " slower than compiled")


def sol_fraction_figure(summary: pd.DataFrame, batch: int, title: str) -> go.Figure:
    """The decode speed of each row of notebook 02's summary (the speed of light over the measured bandwidth,
    the compiled step, the step op by op) on a logarithmic axis (they span three orders of magnitude), each bar
    coloured by its kind, with its 95% interval and, above it, what ``bar_note`` says of it (the table's own
    columns: the fraction of the speed of light round by round, or the slowdown against the compiled step)."""
    fig = go.Figure()
    high, low = batch * 1e3 / summary.low_ms, batch * 1e3 / summary.high_ms
    kinds = summary.kind.map(_kind)
    for kind in dict.fromkeys(kinds):
        g, name = summary[kinds == kind], NAMES.get(kind, kind)
        fig.add_bar(
            x=g.what,
            y=g.tokens_per_s,
            name=name,
            offsetgroup="one",  # one bar per row, centred, whatever its kind
            marker_color=KIND_COLOURS.get(kind),
            error_y=dict(type="data", symmetric=False, array=high[g.index] - g.tokens_per_s,
                         arrayminus=g.tokens_per_s - low[g.index]),
        )  # fmt: skip
    for r, top in zip(summary.itertuples(), high):  # above the interval, never under it
        fig.add_annotation(x=r.what, y=math.log10(top), text=bar_note(r), showarrow=False, yanchor="bottom", yshift=4)
    floor = log_floor(pd.concat([low, high]), decades=4)
    fig.update_yaxes(title_text="tokens/s, all users (log)", **floor_axis(floor, high.max() * 4))
    fig.update_layout(title=title, legend=LEGEND, bargap=0.4)
    return fig


def knockout_figure(table: pd.DataFrame, model: str) -> go.Figure:
    """Knock-outs in two panels, both on logarithmic axes that start at a labelled floor, so every component
    shows: this machine's shrinks with their intervals beside each component's bytes over the measured
    bandwidth; and the seed's published columns (26B-A4B: vLLM kernel time on an H100, the megakernel's
    shrink on a v5e-8). A value at or below its panel's floor (a shrink lost in noise, a few bytes) is a
    hatched stub with its value written on it; a component the seed did not publish, a stub that says so."""
    rows = table[table["component"] != "(whole step)"]
    names = rows.component.str.replace("_", " ")
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.14,
        subplot_titles=(f"{model}, this machine (measured; bytes modelled)", "the seed, 26B-A4B (published)"),
    )
    fig.update_yaxes(domain=[0, TOP]).update_annotations(y=TOP)
    ms = 1e3
    left = [rows.shrink_s * ms, rows.bytes_time_s * ms, rows.shrink_high_s * ms]
    right = [rows.seed_vllm_h100_s * ms, rows.seed_megakernel_v5e8_s * ms]
    mine = (("shrink when off (median, 95% interval)", "#4e79a7"), ("its bytes / measured bandwidth", "#f28e2b"))
    seed = (("vLLM kernel time, H100", "#e15759"), ("megakernel shrink, v5e-8", "#76b7b2"))
    for col, series, values in ((1, mine, left), (2, seed, right)):
        floor = log_floor(pd.concat(values))
        for (name, colour), v in zip(series, values):
            heights, patterns, texts = floored(v, floor)
            error = None
            if name.startswith("shrink"):  # the interval of a bar drawn as it is; none on a stub
                drawn = [p == "" for p in patterns]
                error = dict(
                    type="data",
                    symmetric=False,
                    array=[(h - x) * ms if d else 0 for h, x, d in zip(rows.shrink_high_s, rows.shrink_s, drawn)],
                    arrayminus=[(x - lo) * ms if d else 0 for x, lo, d in zip(rows.shrink_s, rows.shrink_low_s, drawn)],
                )
            fig.add_bar(
                x=names,
                y=heights,
                name=name,
                marker=dict(color=colour, pattern=dict(shape=patterns)),
                text=[t.replace("none", "not published") for t in texts],
                textposition="outside",
                textangle=-90,
                textfont=dict(size=10),
                constraintext="none",
                error_y=error,
                hovertext=[f"{n}: {x:.4g} ms" for n, x in zip(names, v)],
                hoverinfo="text",
                row=1,
                col=col,
            )
        fig.update_yaxes(
            title_text="ms per step (log)", row=1, col=col, **floor_axis(floor, pd.concat(values).max() * 3)
        )
    fig.update_xaxes(tickangle=-30)
    fig.update_layout(barmode="group", title="Component costs: what switching each off saves", legend=LEGEND)
    return fig
