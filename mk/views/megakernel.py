"""Notebook 03's figure of compile time against layer count (mk.megakernel.aot.compile_times)."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go


def compile_time_figure(times: pd.DataFrame, model: str) -> go.Figure:
    """Compile time of the step against its layers, with the layers looped over and with every layer emitted
    (bars: the repeats' range, none for one compile each; the hover: the ops the kernel writes code for); the layer
    axis labelled at the layer counts compiled."""
    fig = go.Figure()
    layers = sorted(int(n) for n in set(times.layers))
    ranged = bool((times.repeats > 1).any())
    for loop, g in times.groupby("loop_layers"):
        fig.add_scatter(
            x=g.layers,
            y=g.compile_s,
            mode="lines+markers",
            error_y=dict(
                type="data",
                symmetric=False,
                array=g.compile_high_s - g.compile_s,
                arrayminus=g.compile_s - g.compile_low_s,
                visible=ranged,
            ),
            name="one loop over the layer pattern (after)" if loop else "every layer emitted (before)",
            hovertext=[
                f"{n} layers: {t:.2f} s, {o} ops emitted" for n, t, o in zip(g.layers, g.compile_s, g.emitted_ops)
            ],
            hoverinfo="text",
        )
    fig.update_layout(
        title=f"{model}: compile time of the step against layers",
        # ticks at the layer counts compiled, whole numbers (plotly's own would put some between them: 2.5 layers)
        xaxis=dict(title_text="layers", tickvals=layers, ticktext=[str(n) for n in layers]),
        yaxis_title="compile time (s)",
        yaxis_rangemode="tozero",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig
