"""What was measured on a real TPU, drawn (mk.analysis.on_tpu's tables): the chip's HBM read rate by method and size,
each model's measured steps against context beside the model's, the model's error on every measured row, and where
each profiled step's device time went."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..figures import context_label, context_ticks, template_colours

ENGINE_WORDS = {"megakernel": "megakernel", "reference": "XLA (the reference)"}


def read_rate_figure(t: pd.DataFrame, spec_GBps: float, limit_GBps: float, title: str) -> go.Figure:
    """Device read rate (GB/s, steps back to back) against the bytes read, one line per method and DMA depth, with
    the data sheet's bandwidth and the measured limit as lines across."""
    fig = go.Figure()
    # the methods read at nearly the same rates: each its own marker, and each drawn a little beside the size it read
    # (a few percent on the log axis; the hover gives the size), so no marker hides another
    symbols, dashes = ("circle", "square", "diamond", "triangle-up", "cross"), ("solid", "dash", "dot", "dashdot")
    groups = list(t.groupby("how", sort=False))
    for i, (colour, (how, g)) in enumerate(zip(template_colours() * 3, groups)):
        g = g.sort_values("GiB")
        beside = 10 ** (0.02 * (i - (len(groups) - 1) / 2))
        fig.add_scatter(
            x=g.GiB * beside, y=g.device_GBps, customdata=g.GiB, mode="lines+markers", name=how,
            line=dict(color=colour, dash=dashes[i % 4]), marker=dict(symbol=symbols[i % 5], size=10),
            error_y=dict(type="data", symmetric=False, array=g.device_high_GBps - g.device_GBps,
                         arrayminus=g.device_GBps - g.device_low_GBps),
            hovertemplate=f"{how}: %{{y:.4g}} GB/s over %{{customdata:.3g}} GiB<extra></extra>",
        )  # fmt: skip
    for value, words, dash in ((spec_GBps, "data sheet", "dot"), (limit_GBps, "measured limit", "dash")):
        fig.add_hline(y=value, line=dict(dash=dash, color="grey"), annotation_text=f"{words}: {value:.4g} GB/s",
                      annotation_position="top left")  # fmt: skip
    fig.update_xaxes(type="log", title_text="GiB read by one call")
    low = 50 * math.floor(0.95 * min(t.device_low_GBps.min(), t.device_GBps.min()) / 50)  # the rates, not zero
    fig.update_yaxes(title_text=f"GB/s, device time (calls back to back; from {low:g})", range=[low, spec_GBps * 1.03])
    fig.update_layout(title=title)
    return fig


def steps_figure(steps: pd.DataFrame, title: str) -> go.Figure:
    """Each model's device time a step against context, one panel a model measured at two contexts or more: the
    measured step (markers, with its 95% interval) and the model's (dashes, joined by a dashed line), one colour per
    engine; one user. Each panel's time axis spans its own steps, not from zero: the engines differ by a few percent."""
    s = steps[steps.batch == 1]
    s = s[s.groupby("what").context.transform("nunique") > 1]
    models = list(dict.fromkeys(s.what))
    cols = 3
    rows = -(-len(models) // cols)
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[m.replace(", ", ",<br>", 1) for m in models],
                        horizontal_spacing=0.08, vertical_spacing=0.4 / rows)  # fmt: skip
    colours = dict(zip(ENGINE_WORDS, template_colours()))
    ticks, labels = context_ticks(sorted(set(s.context)))  # every panel on the same axis, a model with one context too
    span = [math.log10(min(s.context)) - 0.15, math.log10(max(s.context)) + 0.15]
    shown = set()  # engines in the legend already: each at its first panel (the first panel may have one engine)
    for i, model in enumerate(models):
        at = dict(row=i // cols + 1, col=i % cols + 1)
        for engine, g in s[s.what == model].groupby("engine"):
            g, colour, words = g.sort_values("context"), colours[engine], ENGINE_WORDS[engine]
            first = engine not in shown
            shown.add(engine)
            fig.add_scatter(
                x=g.context, y=g.device_ms, mode="markers", marker=dict(color=colour, size=9), **at,
                name=f"{words}, measured", legendgroup=f"{engine}m", showlegend=first,
                error_y=dict(type="data", symmetric=False, array=g.device_high_ms - g.device_ms,
                             arrayminus=g.device_ms - g.device_low_ms),
                hovertemplate=f"{words}: %{{y:.4g}} ms measured at %{{x}} positions<extra></extra>",
            )  # fmt: skip
            fig.add_scatter(
                x=g.context, y=g.modelled_ms, mode="lines+markers", line=dict(color=colour, dash="dash"), **at,
                marker=dict(symbol="line-ew", size=16, line=dict(color=colour, width=2)),  # a cell alone shows too
                name=f"{words}, modelled", legendgroup=f"{engine}p", showlegend=first,
                hovertemplate=f"{words}: %{{y:.4g}} ms modelled at %{{x}} positions<extra></extra>",
            )  # fmt: skip
        fig.update_xaxes(type="log", range=span, tickvals=ticks, ticktext=labels, title_text="positions", **at)
        fig.update_yaxes(title_text="ms a step" if i % cols == 0 else None, **at)
    fig.update_layout(title=title, height=330 * rows + 240, margin=dict(t=130))  # two-line panel titles under it
    return fig


def error_figure(steps: pd.DataFrame, band: float, title: str) -> go.Figure:
    """The model's error (modelled / measured - 1) on every measured cell, a row a cell with a marker per engine,
    rows in order of the megakernel's error (a cell XLA alone ran, last), the band of +-``band`` shaded."""
    s = steps.assign(row=[f"{m}, {context_label(c)}, {b} user{'s' * (b > 1)}"
                          for m, c, b in zip(steps.what, steps.context, steps.batch)])  # fmt: skip
    mk = s[s.engine == "megakernel"].set_index("row").error
    order = list(mk.sort_values().index) + [r for r in dict.fromkeys(s.row) if r not in mk.index]
    fig = go.Figure()
    symbols = {"megakernel": "circle", "reference": "diamond-open"}
    for colour, (engine, g) in zip(template_colours(), s.groupby("engine")):
        fig.add_scatter(
            x=g.error * 100, y=g.row, mode="markers", name=ENGINE_WORDS[engine],
            marker=dict(color=colour, size=10, symbol=symbols[engine], line=dict(width=2, color=colour)),
            hovertemplate="%{y}: %{x:+.3g}%<extra></extra>",
        )  # fmt: skip
    fig.add_vrect(x0=-band * 100, x1=band * 100, fillcolor="grey", opacity=0.12, line_width=0)
    fig.update_xaxes(title_text="modelled / measured - 1 (%)", zeroline=True)
    fig.update_yaxes(categoryorder="array", categoryarray=order, autorange="reversed", ticksuffix="  ")
    fig.update_layout(title=title, height=20 * len(order) + 300, margin=dict(l=380))
    return fig


def op_time_figure(parts: pd.DataFrame, title: str) -> go.Figure:
    """Each profiled step's device time (mk.analysis.on_tpu.op_time) as a bar of its parts, one bar per engine and
    cell."""
    fig = go.Figure()
    p = parts.assign(row=[f"{ENGINE_WORDS[e]}: {m}, {c:,} pos, {b} user{'s' * (b > 1)}"
                          for e, m, c, b in zip(parts.engine, parts.what, parts.context, parts.batch)])  # fmt: skip
    for colour, (part, g) in zip(template_colours(), p.groupby("part", sort=False)):
        fig.add_bar(
            x=g.ms, y=g.row, orientation="h", name=part, marker_color=colour,
            hovertemplate="%{y}: %{x:.3f} ms<extra>" + part + "</extra>",
        )  # fmt: skip
    fig.update_xaxes(title_text="device time a step (ms)")
    fig.update_yaxes(autorange="reversed", ticksuffix="  ")
    fig.update_layout(title=title, barmode="stack", height=26 * p.row.nunique() + 300, margin=dict(l=420))
    return fig


def _knockout_label(r, unlike: bool) -> str:
    users = f"{r.batch} user{'s' * (r.batch > 1)}"
    steps = getattr(r, "steps_a_call", 1)
    return f"{r.what}, {r.context:,} pos, {users}{f', {steps} steps a call' * (steps > 1)}: {r.component}" + (
        " \u2020" * unlike
    )


def knockout_figure(knocked: pd.DataFrame, title: str) -> go.Figure:
    """Each knock-out's shrink (mk.analysis.chip_checks.knockout_table) measured on the chip, with its 95% interval,
    beside the timing model's and the component's bytes at the measured limit, one row per component, cell and steps a
    call (a token's shrink at several); a knock-out that changes which experts are read (its verdict: not like for
    like) is marked with a dagger."""
    unlike = knocked.verdict.str.startswith("not like for like")
    k = knocked.assign(row=[_knockout_label(r, u) for r, u in zip(knocked.itertuples(), unlike)])
    colours = template_colours()
    fig = go.Figure()
    fig.add_bar(
        x=k.shrink_ms, y=k.row, orientation="h", name="measured (device time)", marker_color=colours[0],
        error_x=dict(type="data", array=k.shrink_high_ms - k.shrink_ms, arrayminus=k.shrink_ms - k.shrink_low_ms),
        hovertemplate="%{y}: %{x:.3f} ms<extra>measured</extra>",
    )  # fmt: skip
    beside = (("modelled_shrink_ms", "modelled", "diamond"), ("bytes_at_limit_ms", "its bytes at the measured limit",
                                                              "circle-open"))  # fmt: skip
    for colour, (col, name, symbol) in zip(colours[1:], beside):  # an open ring: the diamond under it shows
        fig.add_scatter(
            x=k[col], y=k.row, mode="markers", name=name,
            marker=dict(color=colour, size=14 if symbol == "circle-open" else 9, symbol=symbol, line=dict(width=2)),
            hovertemplate="%{y}: %{x:.3f} ms<extra>" + name + "</extra>",
        )  # fmt: skip
    dagger = "; \u2020 other experts read" if unlike.any() else ""
    fig.update_xaxes(title_text=f"how much the step shrinks with the component off (ms){dagger}")
    fig.update_yaxes(autorange="reversed", ticksuffix="  ")
    fig.update_layout(title=title, height=24 * len(k) + 300, margin=dict(l=430))
    return fig
