"""Notebook 08's figure of what INT8 costs in quality (mk.analysis.quality.quality's rows), saying on the figure which
models have random weights."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..figures import template_colours

RANDOM = "random weights"


def quality_figure(rows: pd.DataFrame, random_models) -> go.Figure:
    """The worst user's largest logit error at each new token (teacher-forced), one line per INT8 scheme, one
    panel per model; a model in ``random_models`` (a tiny preset with random weights, not a trained model) says
    so in its panel's title, and the title says so when every model is one. A scheme whose error is zero at every
    token (int8-experts on a dense model: no experts to quantize) is said in its panel, not drawn along the axis."""
    worst = rows.groupby(["model", "scheme", "step"], as_index=False, sort=False).max_abs_logit_error.max()
    models = list(dict.fromkeys(worst.model))
    random_models = set(random_models)
    titles = [f"{m} ({RANDOM})" if m in random_models else f"{m} (trained checkpoint)" for m in models]
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=titles, horizontal_spacing=0.08)
    fig.update_yaxes(domain=[0, 0.92]).update_annotations(y=0.92)  # panel titles clear of the legend
    colours = dict(zip(dict.fromkeys(worst.scheme), template_colours()))
    exact = []  # (panel, scheme) whose error is zero at every token: said in words, not drawn as a line along 0
    for col, model in enumerate(models, start=1):
        for scheme, g in worst[worst.model == model].groupby("scheme", sort=False):
            if (g.max_abs_logit_error == 0).all():
                exact.append((col, scheme))
                continue
            fig.add_scatter(
                x=g.step,
                y=g.max_abs_logit_error,
                mode="lines+markers",
                name=scheme,
                legendgroup=scheme,
                showlegend=col == 1,
                line_color=colours[scheme],
                row=1,
                col=col,
            )
    # said in the title itself (one line): a subtitle would sit under the legend plotly hangs below the title
    what = "tiny models, random weights" if random_models >= set(models) else "panels say which weights are random"
    for col, scheme in exact:  # e.g. int8-experts on a dense model: no experts, so its weights are bf16's
        fig.add_annotation(
            text=f"{scheme}: error 0 at every token (it quantizes nothing here)",
            xref=f"x{col if col > 1 else ''} domain",
            yref=f"y{col if col > 1 else ''} domain",
            x=0.02,
            y=0.02,
            xanchor="left",
            yanchor="bottom",
            showarrow=False,
            font=dict(size=11, color=colours[scheme]),
        )
    steps = sorted(set(worst.step))
    # whole tokens, at most about ten labels a panel, flat: one a token overlapped at 32 tokens
    every = max(1, -(-len(steps) // 10))
    fig.update_xaxes(title_text="new token", tick0=steps[0] if steps else 0, dtick=every, tickangle=0)
    fig.update_yaxes(title_text="max |logit error|, worst user<br>(teacher-forced)", col=1)
    for col, model in enumerate(models, start=1):  # from 0 (an error is never negative) to just above the largest
        top = worst[worst.model == model].max_abs_logit_error.max()
        fig.update_yaxes(range=[0, 1.08 * top if top > 0 else 1], row=1, col=col)
    fig.update_layout(
        title=f"INT8's logit error at each new token ({what})",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig
