"""A modelled step's timeline (mk.plan.timeline rows, as mk.timing charges them) drawn on three lanes: the
DMA engine, the link and compute, in one colour scheme for every timeline of the workbook."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

# The timeline's lanes as drawn: the KV cache and the serial reads (compute waits for those) share the DMA
# engine with the weights, and on lanes of their own they would be too short to see at the scale of a layer.
LANES = {"dma": "HBM DMAs", "dma (serial)": "HBM DMAs", "ici": "link (ICI)", "compute": "compute"}
LANE_NAMES = {
    "HBM DMAs": "HBM -> VMEM DMAs (weights, KV cache, serial reads)",
    "link (ICI)": "all-reduce sends on the link (compute waits)",
    "compute": "compute",
}


def _colours() -> tuple[str, ...]:
    """The colours of mk's figure template (mk.figures), so a lane keeps its colour in every panel."""
    import plotly.io as pio

    from .. import figures  # noqa: F401  (registers the template)

    return tuple(pio.templates["mk"].layout.colorway)


def timeline_figure(runs: dict[str, list[dict]], layers: int, title: str) -> go.Figure:
    """One panel per timeline (``runs``: label -> mk.plan.timeline rows): the start of the step up to the
    end of layer ``layers`` - 1 (the prologue, the embedding's all-reduce, the first layers), as bars on
    three lanes (the DMA engine, the link, compute), one colour each in every panel, on one time axis in ms."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=list(runs))
    colours = dict(zip(LANE_NAMES, _colours()))
    for row, rows in enumerate(runs.values(), start=1):
        t = pd.DataFrame(rows)
        end = t[(t.layer >= 0) & (t.layer < layers)].end_s.max()
        part = t[t.start_s < end].assign(drawn=lambda t: t.lane.map(LANES))
        for lane, name in LANE_NAMES.items():
            g = part[part.drawn == lane]
            fig.add_bar(
                y=g.drawn,
                x=(g.end_s - g.start_s) * 1e3,
                base=g.start_s * 1e3,
                orientation="h",
                name=name,
                legendgroup=lane,
                showlegend=row == 1,
                marker=dict(color=colours[lane], line_width=0),
                hovertext=g.component + ": " + g.what,
                row=row,
                col=1,
            )
        fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(LANE_NAMES)), row=row, col=1)
    fig.update_xaxes(title_text="time in the step (ms)", row=len(runs), col=1)
    fig.update_layout(barmode="overlay", title=title, legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0))
    return fig
