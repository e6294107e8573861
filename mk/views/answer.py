"""The measured answer, drawn (mk.analysis.answer): for every cell both engines ran on the chip, the megakernel's
speed-up over XLA's compiled step beside each engine's fraction of the chip's measured read limit, a row a cell, so the
gap shows at a glance (ratios and fractions, never absolute times from zero)."""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..figures import context_label, template_colours

SPEEDUP_TICKS = (1, 1.1, 1.25, 1.5, 2, 2.5, 3, 4)
ROW_PX = 22  # pixels a cell's row takes: labels of 11-13 px apart with room between


def cell_label(r) -> str:
    """A cell in words: its model, a data type other than bf16, its context and users."""
    dtype = "" if r.dtype == "bf16" else f", {r.dtype.split('+')[-1].replace('-', ' ')}"
    return f"{r.model}{dtype}, {context_label(int(r.context))}, {int(r.batch)} user{'s' * (r.batch > 1)}"


def answer_figure(answer: pd.DataFrame, title: str) -> go.Figure:
    """Left: each cell's speed-up (XLA's step over the megakernel's, with the interval of both engines' 95% intervals),
    coloured by family, a line at 1 (no gain). Right: each engine's fraction of the measured limit, a line at 1. One
    row a cell, in the table's order (family, users, context)."""
    a = answer.assign(row=[cell_label(r) for r in answer.itertuples()])
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.05)
    colours = template_colours()
    for colour, (family, g) in zip(colours[2:], a.groupby("family", sort=False)):
        fig.add_scatter(
            x=g.speedup, y=g.row, mode="markers", marker=dict(color=colour, size=10), name=f"speed-up, {family}",
            error_x=dict(type="data", symmetric=False, array=g.speedup_high - g.speedup,
                         arrayminus=g.speedup - g.speedup_low),
            hovertemplate="%{y}: %{x:.3f}x<extra></extra>", row=1, col=1,
        )  # fmt: skip
    engines = (
        ("megakernel_fraction_of_limit", "megakernel", "circle"),
        ("xla_fraction_of_limit", "XLA", "diamond-open"),
    )
    for colour, (col, words, symbol) in zip(colours, engines):
        fig.add_scatter(
            x=a[col], y=a.row, mode="markers", name=f"{words}, fraction of the limit",
            marker=dict(color=colour, size=10, symbol=symbol, line=dict(width=2, color=colour)),
            hovertemplate=f"{words}: %{{x:.3f}} of the limit<extra>%{{y}}</extra>", row=1, col=2,
        )  # fmt: skip
    for col in (1, 2):
        fig.add_vline(x=1, line=dict(dash="dash", color="grey"), row=1, col=col)
    top = max(a.speedup_high.max(), 1.1)
    ticks = [t for t in SPEEDUP_TICKS if t <= top * 1.05]
    fig.update_xaxes(title_text="speed-up over XLA (log)", type="log", tickvals=ticks,
                     ticktext=[f"{t:g}x" for t in ticks], range=[math.log10(0.97), math.log10(top * 1.05)], row=1,
                     col=1)  # fmt: skip
    low = math.floor(20 * min(a.xla_fraction_of_limit.min(), a.megakernel_fraction_of_limit.min())) / 20
    fig.update_xaxes(title_text=f"of the measured limit (from {low:g})", range=[low, 1.05], row=1, col=2)
    fig.update_yaxes(autorange="reversed", ticksuffix="  ")
    fig.update_layout(title=title, height=ROW_PX * len(a) + 330, margin=dict(l=330),
                      legend=dict(orientation="h", y=1.0, yanchor="bottom"))  # fmt: skip
    return fig


def moe_one_user_figure(table: pd.DataFrame, several: int, title: str) -> go.Figure:
    """Each MoE cell at one user (mk.analysis.moe_one_user.moe_one_user, a row a cell): each engine's fraction of the
    measured limit at one step a call (open) and at ``several`` (filled), joined, a line at 1."""
    t = table.assign(
        row=[m if s == "one chip" else f"{m}, chip 0 of a v5e-8" for m, s in zip(table.model, table.setup)]
    )
    fig = go.Figure()
    engines = (("megakernel", "megakernel", "circle"), ("reference", "XLA", "diamond"))
    for colour, (engine, words, symbol) in zip(template_colours(), engines):
        for _, r in t.iterrows():
            one, many = r[f"{engine}_fraction_1"], r[f"{engine}_fraction_{several}"]
            if one == one and many == many:  # both measured (not NaN)
                fig.add_scatter(x=[one, many], y=[r.row, r.row], mode="lines", line=dict(color=colour, width=2),
                                showlegend=False, hoverinfo="skip")  # fmt: skip
        for n, fill in ((1, "-open"), (several, "")):
            fig.add_scatter(
                x=t[f"{engine}_fraction_{n}"], y=t.row, mode="markers",
                name=f"{words}, {n} step{'s' * (n > 1)} a call",
                marker=dict(color=colour, size=11, symbol=symbol + fill, line=dict(width=2, color=colour)),
                hovertemplate=f"{words}, {n} a call: %{{x:.3f}} of the limit<extra>%{{y}}</extra>",
            )  # fmt: skip
    fig.add_vline(x=1, line=dict(dash="dash", color="grey"))
    low = math.floor(20 * t.filter(like="_fraction_").min().min()) / 20
    fig.update_xaxes(title_text=f"of the chip's measured read limit (from {low:g})", range=[low, 1.02])
    fig.update_yaxes(autorange="reversed", ticksuffix="  ")
    fig.update_layout(title=title, height=ROW_PX * 2 * len(t) + 300, margin=dict(l=260),
                      legend=dict(orientation="h", y=1.0, yanchor="bottom"))  # fmt: skip
    return fig


def gap_placed_figure(table: pd.DataFrame, phases: pd.DataFrame, title: str) -> go.Figure:
    """What each MoE cell takes past its bytes (mk.analysis.stream_waits.gap_placed), a bar a cell: the bytes it moves
    past those counted (the layout's padding; a stand-in's whole router), the call's fixed time over its steps, the
    modelled stream's waits by phase, and what none of them holds (hatched; left of zero where the model places more
    than the chip took)."""
    t = table.set_index("model")
    waits = phases.reindex(t.index).fillna(0.0)
    waits = waits[waits.sum().sort_values(ascending=False).index]
    # one colour a part: the largest phases each their own, the rest (and any too small to see) drawn as one
    colours = template_colours()
    kept = [p for p in waits.columns[: len(colours) - 3] if waits[p].max() >= 0.02 * t.past_bytes_us.abs().max()]
    rest = [p for p in waits.columns if p not in kept]
    parts = [("bytes past those counted", t.uncounted_us), ("the call's fixed time over its steps", t.call_share_us)]
    parts += [(f"waits: {phase}", waits[phase]) for phase in kept]
    if rest:
        parts.append((f"waits: the other {len(rest)} phases", waits[rest].sum(axis=1)))
    fig = go.Figure()
    for colour, (name, x) in zip(colours, parts):
        fig.add_bar(y=t.index, x=x, name=name, orientation="h", marker_color=colour,
                    hovertemplate=f"{name}: %{{x:.1f}} us<extra>%{{y}}</extra>")  # fmt: skip
    fig.add_bar(y=t.index, x=t.unplaced_us, name="unplaced", orientation="h",
                marker=dict(color="white", line=dict(color="grey", width=1), pattern=dict(shape="/", fgcolor="grey")),
                hovertemplate="unplaced: %{x:.1f} us<extra>%{y}</extra>")  # fmt: skip
    fig.add_scatter(y=t.index, x=t.past_bytes_us, mode="markers", name="measured past its bytes",
                    marker=dict(symbol="line-ns-open", size=22, color="black", line=dict(width=3, color="black")),
                    hovertemplate="measured: %{x:.1f} us past its bytes<extra>%{y}</extra>")  # fmt: skip
    fig.update_layout(barmode="relative", title=title, height=ROW_PX * 2 * len(t) + 420, margin=dict(l=260),
                      legend=dict(orientation="h", y=1.0, yanchor="bottom"))  # fmt: skip
    fig.update_xaxes(title_text="microseconds a token past the bytes at the measured limit")
    fig.update_yaxes(autorange="reversed", ticksuffix="  ")
    return fig


def copies_floor_figure(table: pd.DataFrame, components: pd.DataFrame, title: str) -> go.Figure:
    """Each cell's kernel beside its copies alone (mk.analysis.copies_floor, a bar a cell): what the copies take past
    the step's bytes at the limit, then what the kernel takes past its copies; below, a cell's core time past its
    copies by component (each knocked out in the kernel and its copies alike), where measured."""
    t = table
    colours = template_colours()
    rows = 2 if not components.empty else 1
    fig = make_subplots(rows=rows, cols=1, vertical_spacing=0.18,
                        row_heights=[len(t), max(len(components), 1)] if rows == 2 else None)  # fmt: skip
    for colour, (name, x) in zip(colours, (("the copies past the bytes", t.copies_past_bytes_us),
                                           ("the kernel past its copies (its core)", t.core_us))):  # fmt: skip
        fig.add_bar(y=t.cell, x=x, name=name, orientation="h", marker_color=colour,
                    hovertemplate=f"{name}: %{{x:.1f}} us<extra>%{{y}}</extra>", row=1, col=1)  # fmt: skip
    if rows == 2:
        c = components.assign(what=[f"{r.model}: {r.part}" for r in components.itertuples()])
        fig.add_bar(y=c.what, x=c.core_us, name="a component's core time past its copies", orientation="h",
                    marker_color=colours[2], hovertemplate="%{x:.1f} us<extra>%{y}</extra>", row=2, col=1)  # fmt: skip
        fig.update_xaxes(title_text="microseconds a token the core adds past the component's copies", row=2, col=1)
    fig.update_layout(barmode="relative", title=title, height=ROW_PX * 2 * (len(t) + len(components)) + 420,
                      margin=dict(l=380, t=150), legend=dict(orientation="h", y=1.02, yanchor="bottom"))  # fmt: skip
    fig.update_xaxes(title_text="microseconds a token past the step's bytes at the measured limit", row=1, col=1)
    fig.update_yaxes(autorange="reversed", ticksuffix="  ")
    return fig


def switch_figure(switched: pd.DataFrame, title: str) -> go.Figure:
    """Each kernel switch against the kernel without it in the same run (mk.analysis.copies_floor.switch_effect), a
    bar a cell and switch: the change in microseconds a token (left of zero: faster), coloured by switch, with the
    fractions of the limit before and after in the hover."""
    s = switched.assign(row=[_switch_row(r) for r in switched.itertuples()])
    fig = go.Figure()
    for colour, (switch, g) in zip(template_colours(), s.groupby("switch", sort=False)):
        fig.add_bar(y=g.row, x=g.change_us, name=f"with {switch}", orientation="h", marker_color=colour,
                    customdata=g[["fraction_was", "fraction_is"]],
                    hovertemplate="%{x:+.1f} us a token, %{customdata[0]:.3f} -> %{customdata[1]:.3f} of the limit"
                                  "<extra>%{y}</extra>")  # fmt: skip
    fig.add_vline(x=0, line_width=1, line_color="grey")
    fig.update_layout(title=title, barmode="group", height=ROW_PX * 2 * len(s) + 300, margin=dict(l=460, r=40, t=130),
                      legend=dict(orientation="h", y=1.02, yanchor="bottom"))  # fmt: skip
    fig.update_xaxes(title_text="us a token against the kernel without it")
    fig.update_yaxes(autorange="reversed", ticksuffix="  ")
    return fig


def _switch_row(r) -> str:
    """A switch row's cell in words: its model, its setup where not one chip alone, its context and users."""
    first, *rest = r.setup.split("; ")
    parts = [first.split(":")[0], *rest]  # a lettered setup by its name, without what it is made of
    setup = ", ".join(parts[1:] if first == "one chip" else parts)
    setup = f" ({setup})" if setup else ""
    return f"{r.model}{setup}, {context_label(int(r.context))}, {int(r.batch)} user{'s' * (r.batch > 1)}"
