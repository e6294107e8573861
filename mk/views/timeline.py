"""A modelled step's timeline (mk.plan.timeline rows, as mk.timing charges them) drawn on three lanes: the
DMA engine, the link and compute, in one colour scheme for every timeline of the workbook.

A step has thousands of tiles and ops, most far narrower than a pixel, so the figure draws blocks: the
consecutive rows of one lane, one component and one layer merged into one bar (the hover says what it holds
and how busy the lane is in it), and the layers marked by their compute's start."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from ..figures import template_colours

# The timeline's lanes as drawn: the KV cache and the serial reads (compute waits for those) share the DMA
# engine with the weights, and on lanes of their own they would be too short to see at the scale of a layer.
LANES = {"dma": "HBM DMAs", "dma (serial)": "HBM DMAs", "ici": "link (ICI)", "compute": "compute"}
LANE_NAMES = {
    "HBM DMAs": "HBM DMAs: weights, KV cache, serial reads",
    "link (ICI)": "link: all-reduce sends, compute waits",
    "compute": "compute",
}
SHORT = {
    "sliding_attention": "sliding attn",
    "full_attention": "full attn",
    "shared_mlp": "shared MLP",
    "experts": "experts",
    "router": "router",
    "norms": "norms",
    "head": "head",
}
GAP = 0.005  # rows of one block may be this share of the drawn time apart (5 pixels of a 1000-pixel plot)
BUSY = 0.5  # a block whose lane is busy for less of it is hatched
EDGE = 0.003  # blocks at least this share of the drawn time wide get white edges
SHADE = "rgba(0, 0, 0, 0.05)"  # every other layer
TOP = 0.9  # the panels' share of the plot's height: the rest holds the top panel's title and layer labels
LABEL = 0.04  # a layer narrower than this share of the drawn time is marked but not labelled


def blocks(rows: pd.DataFrame, gap_s: float) -> pd.DataFrame:
    """``rows`` (mk.plan.timeline's, with a ``drawn`` lane) merged into blocks: each lane's rows in time order,
    consecutive ones of one stream, component and layer joined when they are at most ``gap_s`` apart (on the
    compute lane at any distance: its ops are far shorter than the waits for their tiles between them, so a
    block is the phase of one component, hatched as mostly waiting). Columns: drawn, stream, component, layer,
    start_s, end_s, busy_s (the rows' own time), rows, what (their names)."""
    t = rows.sort_values(["drawn", "start_s", "end_s"], kind="stable")
    key = t.drawn + "|" + t.stream + "|" + t.component + "|" + t.layer.astype(str)
    lane_end = t.groupby("drawn").end_s.cummax().groupby(t.drawn).shift()
    apart = (t.start_s - lane_end > gap_s) & (t.drawn != LANES["compute"])
    new = (key != key.shift()) | apart
    return (
        t.assign(block=new.cumsum(), busy_s=t.end_s - t.start_s)
        .groupby("block", sort=False)
        .agg(
            drawn=("drawn", "first"),
            stream=("stream", "first"),
            component=("component", "first"),
            layer=("layer", "first"),
            start_s=("start_s", "min"),
            end_s=("end_s", "max"),
            busy_s=("busy_s", "sum"),
            rows=("what", "size"),
            what=("what", lambda w: ", ".join(dict.fromkeys(w))),
        )
        .reset_index(drop=True)
    )


def layer_starts(rows: pd.DataFrame, layers: int) -> dict[int, float]:
    """When each layer's compute starts (seconds), for layers 0 to ``layers`` (the last if the step has it)."""
    compute = rows[(rows.lane == "compute") & (rows.layer >= 0) & (rows.layer <= layers)]
    return compute.groupby("layer").start_s.min().to_dict()


def _hover(b) -> str:
    what = b.what if len(b.what) <= 80 else b.what[:77] + "..."
    where = f"layer {b.layer}" if b.layer >= 0 else "before and after the layers"
    return (
        f"{b.component} ({b.stream}), {where}<br>{b.rows} {'tiles' if b.drawn == 'HBM DMAs' else 'ops'}: {what}<br>"
        f"{b.start_s * 1e3:.4f}-{b.end_s * 1e3:.4f} ms, lane busy {b.busy_s / (b.end_s - b.start_s or 1):.0%} of it"
    )


def timeline_figure(runs: dict[str, list[dict]], layers: int, title: str) -> go.Figure:
    """One panel per timeline (``runs``: label -> mk.plan.timeline rows): the start of the step up to the
    end of layer ``layers`` - 1 (the prologue, the embedding's all-reduce, the first layers), as blocks on
    three lanes (the DMA engine, the link, compute), one colour per lane in every panel and every figure, on
    one time axis in ms. Each block is labelled with its component where it fits, hatched where its lane is
    busy for less than half of it, and every other layer is shaded and labelled at its compute's start."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.16, subplot_titles=list(runs))
    # panel titles above the layers' labels, and the top one clear of the legend above the plot
    fig.for_each_yaxis(lambda a: a.update(domain=[d * TOP for d in a.domain]))
    fig.for_each_annotation(lambda a: a.update(y=a.y * TOP, yshift=14))
    colours = dict(zip(LANE_NAMES, template_colours()))
    tables = [pd.DataFrame(rows) for rows in runs.values()]
    drawn = [lane for lane in LANE_NAMES if any(t.lane.map(LANES).eq(lane).any() for t in tables)]
    ends = [t[(t.layer >= 0) & (t.layer < layers)].end_s.max() for t in tables]
    for row, (t, end) in enumerate(zip(tables, ends), start=1):
        part = t[t.start_s < end].assign(drawn=lambda t: t.lane.map(LANES))
        b = blocks(part, GAP * max(ends))
        for lane in drawn:  # a lane no run uses (the link, on one chip) is left out
            g, name = b[b.drawn == lane], LANE_NAMES[lane]
            fig.add_bar(
                y=g.drawn,
                x=(g.end_s - g.start_s) * 1e3,
                base=g.start_s * 1e3,
                orientation="h",
                name=name,
                legendgroup=lane,
                showlegend=row == 1,
                marker=dict(
                    color=colours[lane],
                    # white edges part neighbouring blocks; a block narrower than them keeps its colour
                    line=dict(color="white", width=[1 if w > EDGE * max(ends) else 0 for w in g.end_s - g.start_s]),
                    pattern=dict(
                        shape=["/" if s < BUSY else "" for s in g.busy_s / (g.end_s - g.start_s)],
                        fgcolor="white",
                        size=6,
                    ),
                ),  # fmt: skip
                text=g.component.map(SHORT).fillna(g.component),
                textposition="inside",
                textangle=0,
                textfont=dict(size=11),
                insidetextanchor="middle",
                hovertext=[_hover(x) for x in g.itertuples()],
                hoverinfo="text",
                row=row,
                col=1,
            )
        fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(drawn)), row=row, col=1)
        _mark_layers(fig, layer_starts(t, layers), layers, end, row)
    fig.update_xaxes(range=[0, max(ends) * 1e3])
    fig.update_xaxes(
        title_text=f"time in the step (ms); hatched: the lane is busy for less than {BUSY:.0%} of the block",
        row=len(runs),
        col=1,
    )
    fig.update_layout(
        barmode="overlay",
        bargap=0.25,
        title=title,
        uniformtext=dict(minsize=8, mode="hide"),  # a label that does not fit its block is left out
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig


def _mark_layers(fig: go.Figure, starts: dict[int, float], layers: int, end: float, row: int) -> None:
    """Shade every other layer of one panel and label each at its compute's start ("prologue" before layer 0)."""
    edges = [0.0] + [starts[i] for i in range(layers) if i in starts] + [min(starts.get(layers, end), end)]
    names = ["prologue"] + [f"layer {i}" for i in range(layers) if i in starts]
    for i, (lo, hi, name) in enumerate(zip(edges, edges[1:], names)):
        if i % 2 == 1:
            fig.add_vrect(x0=lo * 1e3, x1=hi * 1e3, fillcolor=SHADE, line_width=0, layer="below", row=row, col=1)
        if i:
            fig.add_vline(x=lo * 1e3, line=dict(color="grey", width=1, dash="dot"), row=row, col=1)
        if hi - lo < LABEL * end:
            continue
        axis = "" if row == 1 else row
        fig.add_annotation(
            x=lo * 1e3,
            y=1,
            xref=f"x{axis}",
            yref=f"y{axis} domain",
            text=name,
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            font=dict(size=10, color="#555"),
        )
