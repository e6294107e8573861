"""Notebook 04's figures: the busiest chip of a whole-expert placement against the routing's skew, its
distribution beside sampled and measured routing, and what the straggler costs
(mk.analysis.straggler.straggler_table)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

LEGEND = dict(orientation="h", y=1.02, yanchor="bottom", x=0)
EXACT_COLOUR, MEASURED_COLOUR = "#4e79a7", "#59a14f"


def skew_figure(spread: pd.DataFrame, rand: pd.DataFrame, exact_max: float, published_max: float, title: str):
    """The sampled busiest chip against the Zipf exponent (mk.analysis.straggler.skew_sweep): the hottest
    experts spread over the chips (bars: 2 standard errors) and placed at random (the placements' mean, bars
    from their min to max), beside the exact uniform value and the published one."""
    fig = go.Figure()
    fig.add_scatter(
        x=spread.exponent,
        y=spread.expected_max,
        mode="lines+markers",
        name="hottest experts spread over the chips",
        error_y=dict(type="data", array=2 * spread.standard_error),
    )
    fig.add_scatter(
        x=rand.exponent,
        y=rand["mean"],
        mode="lines+markers",
        name="placed at random: mean of the placements (bars: min to max)",
        error_y=dict(
            type="data", symmetric=False, array=rand["max"] - rand["mean"], arrayminus=rand["mean"] - rand["min"]
        ),
    )
    span = [min(spread.exponent), max(spread.exponent)]
    fig.add_scatter(x=span, y=[exact_max] * 2, mode="lines", line=dict(dash="dash", color="grey"),
                    name=f"exact, uniform routing ({exact_max:.2f})")  # fmt: skip
    fig.add_scatter(x=span, y=[published_max] * 2, mode="lines", line=dict(dash="dot", color="black"),
                    name=f"published ({published_max:g})")  # fmt: skip
    fig.update_layout(
        title=title,
        xaxis_title="Zipf exponent of the routing (0: uniform)",
        yaxis_title="busiest chip (experts per layer)",
        legend=LEGEND,
    )
    return fig


def distribution_figure(cases, exact, published_max: float, router_exact, measured, titles: tuple[str, str]):
    """Left: the busiest chip's distribution for each of ``cases`` (mk.analysis.straggler.Straggler: exact and
    sampled), with the published busiest chip and the exact expectation as lines on the same axis (a busiest
    chip's count; the published mean per chip is another quantity and is left to the caption). Right: a router's
    measured busiest chip beside the exact uniform distribution for its own expert and chip counts."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.68, 0.32], horizontal_spacing=0.08, subplot_titles=titles)
    fig.update_yaxes(domain=[0, 0.9]).update_annotations(y=0.9)  # panel titles clear of the legend above them
    for s in cases:
        label = "exact, uniform routing" if s is exact else f"sampled: {s.routing}"
        fig.add_bar(x=list(s.distribution), y=list(s.distribution.values()), name=label, row=1, col=1)
    top = max(max(s.distribution.values()) for s in cases)
    fig.add_scatter(x=[published_max] * 2, y=[0, top], mode="lines", line=dict(color="black", dash="dot"),
                    name=f"published busiest chip ({published_max:g})", row=1, col=1)  # fmt: skip
    fig.add_scatter(x=[exact.expected_max] * 2, y=[0, top], mode="lines", line=dict(color=EXACT_COLOUR, dash="dash"),
                    name=f"exact expected busiest chip ({exact.expected_max:.2f})", row=1, col=1)  # fmt: skip
    fig.add_bar(x=list(router_exact.distribution), y=list(router_exact.distribution.values()),
                name="exact, uniform routing", marker_color=EXACT_COLOUR, showlegend=False, row=1, col=2)  # fmt: skip
    fig.add_bar(x=list(measured.distribution), y=list(measured.distribution.values()),
                name=f"measured: {measured.routing}", marker_color=MEASURED_COLOUR, row=1, col=2)  # fmt: skip
    fig.update_xaxes(title_text="busiest chip (distinct experts per layer)", dtick=1, row=1, col=1)
    fig.update_xaxes(title_text="busiest chip<br>(distinct experts per layer)", dtick=1, row=1, col=2)  # narrow panel
    fig.update_yaxes(title_text="probability", row=1, col=1)
    fig.update_layout(barmode="group", title="How many experts the busiest chip loads per layer (whole placement)",
                      legend=LEGEND)  # fmt: skip
    return fig


STEPS = {
    "whole_step_ms": "whole experts: the busiest chip sets the pace",
    "average_chip_step_ms": "whole experts, if an average chip set it",
    "split_step_ms": "split experts (every chip)",
}


def straggler_figure(cost: pd.DataFrame, chips: int, chip_counts, title: str):
    """mk.analysis.straggler.straggler_table as panels: the modelled step against the batch on ``chips`` chips, and
    against the chip count at the table's smallest and largest batch; the straggler is the gap between the
    first two lines."""
    ends = sorted({cost.batch.min(), cost.batch.max()})
    fig = make_subplots(
        rows=1, cols=1 + len(ends), horizontal_spacing=0.07,
        subplot_titles=[f"{chips} chips, by users"] + [f"{b} user{'s' if b > 1 else ''}, by chips" for b in ends],
    )  # fmt: skip
    fig.update_yaxes(domain=[0, 0.88]).update_annotations(y=0.88)
    colours = dict(zip(STEPS, ("#e15759", "#bab0ac", EXACT_COLOUR)))
    by_batch = cost[cost.chips == chips].sort_values("batch")
    for column, name in STEPS.items():
        fig.add_scatter(x=by_batch.batch, y=by_batch[column], mode="lines+markers", name=name, legendgroup=column,
                        line_color=colours[column], row=1, col=1)  # fmt: skip
        for col, b in enumerate(ends, start=2):
            g = cost[cost.chips.isin(chip_counts) & (cost.batch == b)].sort_values("chips")
            fig.add_scatter(x=g.chips, y=g[column], mode="lines+markers", name=name, legendgroup=column,
                            line_color=colours[column], showlegend=False, row=1, col=col)  # fmt: skip
            # a log axis over three chip counts or more; over fewer a linear one (a log axis needs three labels)
            kind = "log" if len(set(chip_counts)) >= 3 else "linear"
            fig.update_xaxes(type=kind, tickvals=list(chip_counts), title_text="chips", row=1, col=col)
    fig.update_xaxes(title_text="users decoded together", dtick=1, row=1, col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_yaxes(title_text="modelled step (ms)", row=1, col=1)
    fig.update_layout(title=title, legend=LEGEND)
    return fig
