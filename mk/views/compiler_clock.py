"""The kernel's own clock drawn (mk.analysis.compiler_clock's tables): the step's issued bundles by op kind, its issue
time against its HBM time by context and users, and what each revision of the kernel bought."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..figures import context_ticks, template_colours

BAR_PX = 26  # pixels a bar takes
ROOM = 1.25  # the axis runs to this multiple of the longest bar: room for its label


def in_us(t: pd.DataFrame) -> pd.DataFrame:
    """``t`` with every millisecond column (``*_ms``) in microseconds (``*_us``), in place: notebook 11's steps are
    microseconds at its CPU defaults, as its figures draw them."""
    ms = [c for c in t.columns if c.endswith("_ms")]
    return t.assign(**{c: t[c] * 1e3 for c in ms}).rename(columns={c: c[:-3] + "_us" for c in ms})


def op_kind_figure(t: pd.DataFrame, title: str) -> go.Figure:
    """Microseconds a step issues per op kind (mk.analysis.compiler_clock.op_kind_table), longest first, each bar's
    time and its share of the step's issue time written beside it."""
    us = t.ns / 1e3
    labels = [f"{u:.3g} µs ({s:.0%})" for u, s in zip(us, t.time_share)]
    fig = go.Figure(
        go.Bar(
            x=us, y=t.op_kind, orientation="h", text=labels, textposition="outside", cliponaxis=False,
            marker_color=template_colours()[0], customdata=t["count"],
            hovertemplate="%{y}: %{x:.4g} µs a step, %{customdata:.4g} a step<extra></extra>",
        )
    )  # fmt: skip
    fig.update_yaxes(autorange="reversed", ticksuffix="  ")
    fig.update_xaxes(
        range=[0, float(us.max()) * ROOM],
        title_text="µs a step (issued bundles: at the measured issue rate where work waits on a unit, else the clock)",
    )
    fig.update_layout(title=title, height=len(t) * BAR_PX + 260, margin=dict(l=170, t=110, b=120), showlegend=False)
    return fig


def issue_figure(t: pd.DataFrame, title: str) -> go.Figure:
    """The step's issue time (solid) and its HBM time (dashed) against context, one colour per number of users
    (mk.analysis.compiler_clock.issue_against_hbm's rows that have a stored schedule), in µs as the op kinds' figure."""
    t = t[t.stored]
    fig = go.Figure()
    for colour, (users, g) in zip(template_colours(), t.groupby("users")):
        g = g.sort_values("context")
        for column, dash, what in (("compute_ms", "solid", "issue"), ("hbm_ms", "dash", "HBM")):
            fig.add_scatter(
                x=g.context, y=g[column] * 1e3, mode="lines+markers", line=dict(color=colour, dash=dash),
                name=f"{users} user{'s' * (users > 1)}: {what}",
                hovertemplate=f"{users} user(s), {what}: %{{y:.4g}} µs at %{{x}} positions<extra></extra>",
            )  # fmt: skip
    ticks, labels = context_ticks(sorted(set(t.context)))
    fig.update_xaxes(type="log", tickvals=ticks, ticktext=labels, title_text="positions in the KV cache")
    fig.update_yaxes(type="log", title_text="µs a step")
    fig.update_layout(title=title)
    return fig


def revision_figure(t: pd.DataFrame, title: str) -> go.Figure:
    """The modelled step's fraction of the speed of light at each point (context, users), one bar per kernel revision
    (mk.analysis.compiler_clock.revision_effect's rows), each bar's step written on it in µs (as notebook 11's other
    figures)."""
    t = t[t.revision.notna()]
    fig = go.Figure()
    points = [f"{n:,} positions, {u} user{'s' * (u > 1)}" for n, u in zip(t.context, t.users)]
    t = t.assign(point=points)
    for colour, (rev, g) in zip(template_colours(), t.groupby("revision")):
        fig.add_bar(
            x=g.point, y=g.fraction_of_sol, name=f"kernel revision {rev:.0f}", marker_color=colour,
            text=[f"{s * 1e3:.4g} µs" for s in g.step_ms], textposition="outside", cliponaxis=False,
            hovertemplate=f"revision {rev:.0f}, %{{x}}: %{{y:.1%}} of the speed of light<extra></extra>",
        )  # fmt: skip
    fig.update_yaxes(tickformat=".0%", range=[0, 1.1], title_text="fraction of the speed of light (modelled)")
    fig.update_layout(title=title, barmode="group")
    return fig
