"""Notebook 07's figures: the timing model against the published numbers (mk.analysis.verdict's tables), both columns
of the component table, the verdict and the rule of thumb."""

from __future__ import annotations

import math
import textwrap

import pandas as pd
import plotly.graph_objects as go

# Figures ----------------------------------------------------------------------------------------------
# The validation figure's axis: wide enough for the tests' spread, narrow enough that 30% reads; a ratio beyond it is
# drawn at its edge as a triangle with its value beside it.
RATIO_RANGE = (0.2, 5.0)
RATIO_TICKS = (0.2, 0.3, 0.5, 0.7, 1, 1.3, 2, 3, 5)
WITHIN = 0.3  # the band drawn around 1: modelled within 30% of published


# Each role's look: a test is a filled circle, a point that tests nothing is told apart by colour and symbol.
ROLES = {
    "test": ("#4e79a7", "circle", "test"),
    "test (baseline fitted)": ("#76b7b2", "circle-open", "test, its baseline fitted"),
    "fitted (megakernel step)": ("#59a14f", "diamond-open", "fitted: its megakernel step, the GPU per-op cost's point"),
    "fitted": ("#e15759", "diamond", "fitted: the model was fitted to it (not a test)"),
    "input": ("#9c755f", "square", "input: the model scales from it (not a test)"),
    "by construction": ("#b07aa1", "star", "by construction: the model cannot give another value"),
    "same point as": ("#bab0ac", "circle-open", "same point as another row, said another way (not counted again)"),
    "derived": ("#bab0ac", "diamond-open", "derived: a ratio of two published points (not counted again)"),
    "stand-in": ("#edc948", "hexagon", "stand-in: another model, on a slice of our choosing (not a test)"),
}


def role_group(role: str, keys=ROLES) -> str:
    """The key of ``keys`` (default ``ROLES``) a role falls under ("same point as mk_v5e8_moe_step" -> "same point
    as")."""
    for key in sorted(keys, key=len, reverse=True):
        if role == key or role.startswith(key):
            return key
    return role


QUANTITY_WORDS = {
    "tokens_per_s": "tokens/s",
    "step_time": "step",
    "fraction_of_sol": "fraction of the speed of light",
    "kernels_per_token": "kernels a step",
    "knockout_time": "switching off",
}


def human_label(r) -> str:
    """A validation row in words (its key stays in the hover): what was published, of which engine, chip and model
    (``tokens/s: megakernel, tpu-v5e-8, gemma4-26b-a4b``; a knock-out ``switching off experts: ...``; a verdict
    row its situation, ``speed-up: MoE model, one user``)."""
    quantity = getattr(r, "quantity", None)
    case = str(r.case)
    if not isinstance(quantity, str):  # a verdict's speed-up: its situation says it
        return f"speed-up: {case}"
    what = QUANTITY_WORDS.get(quantity, quantity.replace("_", " "))
    if quantity == "knockout_time" and r.component:
        what += f" {str(r.component).replace('_', ' ')}"
    parts = [p.strip() for p in case.split(",")]
    model, chip = parts[0], case.rsplit(" on ", 1)[-1].split(",")[0].strip()
    engine = "megakernel" if "megakernel" in case else "general stack"
    if "megakernel, (" in case:  # its kernel setup by its letter and name (mk.kernel_setup), before any colon
        engine += " " + case.split("megakernel, ", 1)[1].split(", on ")[0].split(":")[0]
    tail = case.rsplit(" on ", 1)[-1].split(",")[1:]  # a data type after the chip
    extra = f", {tail[0].strip()}" if tail else ""
    return f"{what}: {engine}, {chip}, {model}{extra}"


def human_labels(table: pd.DataFrame) -> list[str]:
    """:func:`human_label` of every row, each unique (a repeat says its key)."""
    labels, seen = [], set()
    for r in table.itertuples():
        label = human_label(r)
        labels.append(label if label not in seen else f"{label} ({r.key})")
        seen.add(label)
    return labels


def validation_figure(table: pd.DataFrame, verdicts: pd.DataFrame | None = None) -> go.Figure:
    """Each published number's ratio modelled / published as one marker on a log axis (1 is exact), coloured
    and shaped by its role (mk.analysis.verdict.validation_table's ``role``: a test, fitted, an input, by construction,
    the same point as another row; with ``verdicts``, mk.analysis.verdict.verdict_table's modelled speed-ups below them:
    a test, a test whose baseline was fitted, derived from two published points), one legend entry per role, so
    the fitted baselines are visibly not tests. A ratio beyond the axis is drawn at its edge as a triangle."""
    fig = go.Figure()
    if verdicts is not None:
        speedups = verdicts.dropna(subset=["modelled", "published"])
        speedups = speedups.assign(case=speedups.situation, component="", unit="x")
        table = pd.concat([table, speedups[["key", "case", "component", "published", "modelled", "unit", "role"]]])
    t = table.assign(label=human_labels(table))
    ratio = t.modelled / t.published
    t = t.assign(
        ratio=ratio.clip(RATIO_RANGE[0], RATIO_RANGE[1]),
        low=ratio < RATIO_RANGE[0],
        high=ratio > RATIO_RANGE[1],
        group=t.role.map(role_group),
    )
    for group in [g for g in ROLES if g in set(t.group)] + sorted(set(t.group) - set(ROLES)):
        g = t[t.group == group]
        colour, symbol, name = ROLES.get(group, ("black", "x", group))
        symbols = [("triangle-left" if lo else "triangle-right" if hi else symbol) for lo, hi in zip(g.low, g.high)]
        fig.add_scatter(
            x=g.ratio,
            y=g.label,
            mode="markers",
            name=name,
            marker=dict(size=12, color=colour, symbol=symbols, line=dict(width=2, color=colour)),
            hovertext=[
                f"{r.key} ({r.role})<br>{r.case}<br>published {r.published:.4g} {r.unit}, modelled {r.modelled:.4g} "
                f"{r.unit}: modelled / published {m:.3g}"
                for r, m in zip(g.itertuples(), (g.modelled / g.published))
            ],
            hoverinfo="text",
        )
    for r in t[t.low | t.high].itertuples():  # a clipped ratio's value beside its triangle
        fig.add_annotation(
            x=math.log10(r.ratio),
            y=r.label,
            text=f"{r.modelled / r.published:.3g}x",
            showarrow=False,
            xanchor="right" if r.high else "left",
            xshift=-10 if r.high else 10,
            font=dict(size=11),
        )
    fig.add_vrect(x0=1 - WITHIN, x1=1 + WITHIN, fillcolor="#e8e8e8", opacity=0.5, line_width=0, layer="below")
    fig.add_vline(x=1, line=dict(color="black", width=1))
    fig.update_xaxes(
        # two lines: the plot area is the figure's right half (the rows' labels take the left), and one line ran off it
        title_text=f"modelled / published (log; the band: within {WITHIN:.0%})<br>triangles: beyond {RATIO_RANGE[0]:g} "
        f"or {RATIO_RANGE[1]:g}, their value beside them",
        type="log",
        range=[math.log10(RATIO_RANGE[0]) - 0.05, math.log10(RATIO_RANGE[1]) + 0.05],
        tickvals=list(RATIO_TICKS),
        ticktext=[f"{v:g}" for v in RATIO_TICKS],
    )
    labels = list(t.label)  # in the table's order: a point's other forms sit beside it
    fig.update_yaxes(autorange="reversed", title_text="", categoryorder="array", categoryarray=labels)
    fig.update_layout(
        title="The timing model against every published number it can run",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
        height=24 * len(t) + 330,
        margin=dict(l=int(7 * max(map(len, labels))) + 30),  # room for the longest label, so the footer fits
        width=max(1000, int(7 * max(map(len, labels))) + 30 + 650),  # and 650 pixels for the plot beside them
    )
    return fig


def component_figure(table: pd.DataFrame) -> go.Figure:
    """Both columns of the component table, published beside modelled (the megakernel's also with the assumed 0 ns
    per op), on a log axis (they span four orders of magnitude)."""
    from plotly.subplots import make_subplots

    columns = list(dict.fromkeys(table.column))
    fig = make_subplots(rows=1, cols=len(columns), subplot_titles=columns, horizontal_spacing=0.1)
    for i, col in enumerate(columns, start=1):
        g = table[table.column == col]
        costs = sorted({c for c in table.get("op_costs", []) if c != "-"})  # the megakernel rows' per-op costs
        modelled = "modelled (mk.timing" + (f"; the megakernel's op costs {' / '.join(costs)})" if costs else ")")
        series = [("published_ms", "published", "#f28e2b"), ("modelled_ms", modelled, "#4e79a7")]
        if "modelled_assumed_ms" in g and g.modelled_assumed_ms.notna().any():  # the megakernel's, 0 ns per op
            series.append(("modelled_assumed_ms", "modelled, assumed 0 ns per op", "#bab0ac"))
        for what, name, colour in series:
            fig.add_bar(
                x=g.component,
                y=g[what].clip(lower=1e-4),
                name=name,
                legendgroup=name,
                showlegend=name not in {t.name for t in fig.data},
                marker_color=colour,
                row=1,
                col=i,
            )
        fig.update_yaxes(
            type="log", title_text="ms per step (log; below 1e-4 drawn at 1e-4)" if i == 1 else None, row=1, col=i
        )
    setups = sorted({s for s in table.setup if isinstance(s, str) and s}) if "setup" in table else []
    fig.update_layout(
        barmode="group",
        title="Where the time goes: kernel time (general stack) and shrink when off (megakernel)"
        + (f"<br><sup>megakernel modelled as {'; '.join(setups)}</sup>" if setups else ""),
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig


VERDICT_MODELLED = {  # the modelled bar of each role: its legend entry and its pattern
    "test": ("modelled (mk.timing): a test", ""),
    "test (baseline fitted)": ("modelled: a test whose baseline's per-kernel cost was fitted", "x"),
    "fitted (megakernel step)": ("modelled: its megakernel step is the GPU per-op cost's fitted point", "+"),
    "derived": ("modelled, where the published speed-up divides two published steps (each tested on its own)", "/"),
    "stand-in": ("modelled with a stand-in (Kimi K2 for the write-up's Kimi): a comparison, not a test", "."),
    "modelled only": ("modelled only: a big model the write-up has no figure for", "-"),
}


def setups_words(names) -> str:
    """The kernel setups a figure's rows were modelled with, by their own names; a setup a slice or a format added to
    (mk.sharding.pods: its name goes on after "; ") under its base name, the additions left to the hover."""
    bases = sorted({n.split("; ")[0] for n in names})
    more = any("; " in n for n in names)
    return "; ".join(bases) + (
        " (on a slice past one host, or in a 4-bit format, with what that adds: see the hover)" if more else ""
    )


def verdict_figure(table: pd.DataFrame) -> go.Figure:
    """The verdict's speed-ups, published beside modelled (and measured where there is one), every row of the
    write-up's table: a modelled bar hatched by its role (a test, a test whose baseline was fitted, derived from
    two published points), and a situation with no modelled value with its published bar and a note (its role) in
    place of the modelled one."""
    # the situation before its colon (a stand-in's row names its stand-in after it, in the table), wrapped
    t = table.assign(situation=table.situation.map(lambda s: "<br>".join(textwrap.wrap(s.split(": ")[0], 16))))
    fig = go.Figure()
    fig.add_bar(
        x=t.situation,
        y=t.published,
        name="published",
        marker_color="#f28e2b",
        offsetgroup="published",
        text=t.published.map(lambda v: "" if math.isnan(v) else f"{v:.2g}x"),
        textposition="outside",
    )
    groups = t.role.map(lambda r: role_group(r, VERDICT_MODELLED))
    for group, (name, pattern) in VERDICT_MODELLED.items():
        g = t[(groups == group) & t.modelled.notna()]
        if len(g):
            fig.add_bar(
                x=g.situation,
                y=g.modelled,
                name=name,
                marker=dict(color="#4e79a7", pattern=dict(shape=pattern, fgcolor="white")),
                offsetgroup="modelled",
                text=g.modelled.map("{:.2f}x".format),
                textposition="outside",
                hovertext=g.role + "<br>megakernel " + g.megakernel + ", general stack " + g.general,
                hoverinfo="text+y",
            )
    if t.measured.notna().any():
        fig.add_bar(
            x=t.situation,
            y=t.measured,
            name="measured, against XLA on one TPU v5e",
            marker_color="#59a14f",
            offsetgroup="measured",
            text=[f"{v:.2f}x" if v == v else "" for v in t.measured],
            textposition="outside",
        )
    for r in t[t.modelled.isna()].itertuples():  # published, not modelled here: say so where its bar would be
        note = r.role.replace(" (", ": ").replace(")", "")  # "not modelled (why)" -> "not modelled: why"
        fig.add_annotation(
            x=r.situation,
            y=1,
            text="<br>".join(textwrap.wrap(note, 14)),
            showarrow=False,
            xshift=26,
            yanchor="bottom",
            yshift=6,  # above the line at 1
            font=dict(size=11, color="#555"),
        )
    fig.add_hline(y=1, line=dict(color="black", dash="dot"))
    fig.update_layout(
        barmode="group",
        title="When a megakernel pays off: its speed-up over a general stack"
        + (
            f"<br><sup>megakernel modelled as {setups_words(t.megakernel_setup)}</sup>"
            if "megakernel_setup" in t
            else ""
        ),
        yaxis=dict(title="speed-up (tokens/s per user,<br>megakernel / general stack)", rangemode="tozero"),
        xaxis_tickangle=0,
        width=max(1000, 150 * len(t)),  # room for every situation's wrapped label side by side
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig


LOG_TICKS = (0.1, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 4, 5, 7, 10, 15, 20, 30, 50, 100)  # round values on a log axis


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
    fig.add_vline(
        x=0.5, line=dict(color="black", dash="dot"), annotation_text="the rule's line: half the speed of light"
    )
    fig.add_hline(y=1, line=dict(color="black", width=1))
    # the log axis from below 1 (the line) to above the largest speed-up, ticked at round values only: plotly's own
    # ticks on a short log range (1 to 4) come a tenth apart and collide
    low, high = min(1.0, table.speedup.min()) / 1.15, table.speedup.max() * 1.15
    ticks = [t for t in LOG_TICKS if low <= t <= high]
    fig.update_yaxes(range=[math.log10(low), math.log10(high)], tickvals=ticks, ticktext=[f"{t:g}x" for t in ticks])
    fig.update_layout(
        title="Speed-up against the general stack's fraction of the speed of light"
        + (
            f"<br><sup>megakernel modelled as {setups_words(table.megakernel_setup)}</sup>"
            if "megakernel_setup" in table
            else ""
        ),
        xaxis_title="general stack's fraction of the speed of light (modelled)",
        yaxis_title="megakernel speed-up (marker size: users)",
        yaxis_type="log",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig
