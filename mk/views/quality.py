"""Notebook 08's figure of what INT8 costs in quality (mk.quality.quality's rows), saying on the figure which
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
    so in its panel's title, and the title says so when every model is one."""
    worst = rows.groupby(["model", "scheme", "step"], as_index=False, sort=False).max_abs_logit_error.max()
    models = list(dict.fromkeys(worst.model))
    random_models = set(random_models)
    titles = [f"{m} ({RANDOM})" if m in random_models else f"{m} (trained checkpoint)" for m in models]
    fig = make_subplots(rows=1, cols=len(models), subplot_titles=titles, horizontal_spacing=0.08)
    fig.update_yaxes(domain=[0, 0.92]).update_annotations(y=0.92)  # panel titles clear of the legend
    colours = dict(zip(dict.fromkeys(worst.scheme), template_colours()))
    for col, model in enumerate(models, start=1):
        for scheme, g in worst[worst.model == model].groupby("scheme", sort=False):
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
    fig.update_xaxes(title_text="new token", dtick=1)
    fig.update_yaxes(title_text="max |logit error|, worst user<br>(teacher-forced)", col=1)
    fig.update_yaxes(rangemode="tozero")
    fig.update_layout(
        title=f"INT8's logit error at each new token ({what})",
        legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0),
    )
    return fig
