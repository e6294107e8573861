"""One plotly look for every figure, a provenance footer, and export to ``figures/`` as HTML + PNG.

Static images (PNG, SVG) go through kaleido 1.x, which drives a Chromium. Without one the HTML is
still written and a single warning says how to get PNGs.

Layout: a horizontal legend above the plot (``orientation="h"``) is placed under the title rather than
over it (:func:`legend_below_title`, applied by :func:`provenance` and :func:`save_figure`); a vertical
legend stays at the right of the plot, beside any title.
"""

from __future__ import annotations

import atexit
import datetime
import os
import textwrap
import warnings
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from .files import write_atomic

FIGURES_DIR = Path(__file__).resolve().parent.parent / "figures"
KINDS = ("published", "modelled", "measured")
DEBIAN_CHROMIUM = "/usr/bin/chromium"
FOOTER_NAME = "provenance"  # the annotation's name, so a figure is never saved without one
EXPORT_SIZE = dict(width=1000, height=600)  # layout pixels of PNG/SVG exports (PNG at twice that)
FONT_SIZE = 13  # the template's base font; plotly draws titles at 1.4 times it
TITLE_PAD = 15  # pixels above the title

pio.templates["mk"] = go.layout.Template(
    layout=dict(
        font=dict(family="DejaVu Sans, Arial, sans-serif", size=FONT_SIZE),
        colorway=[
            "#4e79a7",
            "#f28e2b",
            "#e15759",
            "#76b7b2",
            "#59a14f",
            "#edc948",
            "#b07aa1",
            "#ff9da7",
            "#9c755f",
            "#bab0ac",
        ],  # Tableau 10: ten distinct colours (bytes come in nine components)
        margin=dict(l=70, r=30, t=70, b=110),  # room at the bottom for the footer
        legend=dict(bgcolor="rgba(255,255,255,0.8)"),
    )
)
pio.templates.default = "plotly_white+mk"

_exporter: bool | None = None  # None: not tried yet; False: no Chromium, PNGs skipped


def provenance(fig: go.Figure, kind: str, hardware: str, source: str | None = None) -> go.Figure:
    """Add (or replace) the footer saying what the numbers are: their kind, the hardware, and the
    source (for measured numbers, by default the JAX version and today's date)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if source is None:
        if kind != "measured":
            raise ValueError(f"a {kind} figure needs its source (the seed, or which model)")
        import jax

        source = f"JAX {jax.__version__}, {datetime.date.today().isoformat()}"
    # Annotations cannot wrap themselves: break long footers by hand so they stay inside the image.
    text = "<br>".join(textwrap.wrap(f"<b>{kind}</b> · {hardware} · {source}", 130))
    others = [a for a in fig.layout.annotations if a.name != FOOTER_NAME]
    fig.layout.annotations = others + [
        go.layout.Annotation(
            name=FOOTER_NAME,
            text=text,
            showarrow=False,
            xref="paper",
            yref="paper",
            x=0,
            y=0,
            xanchor="left",
            yanchor="top",
            yshift=-75,
            align="left",
            font=dict(size=11, color="#555"),
        )
    ]
    return legend_below_title(fig)


def legend_below_title(fig: go.Figure) -> go.Figure:
    """Keep a horizontal legend above the plot clear of the title, however many rows it wraps to.

    Plotly puts the title in the middle of the top margin and a legend anchored above the plot grows
    upwards into it. Here the title hangs from the top of the figure, the legend hangs from just below
    the title (both in container coordinates, so at a fixed height: ``layout.height``, by default the
    export height), and plotly pushes the plot area down below the legend. Other legends are left alone.
    """
    legend, title = fig.layout.legend, fig.layout.title
    if legend.orientation != "h" or (legend.y is not None and legend.y < 1 and legend.yref != "container"):
        return fig  # vertical (right of the plot), or horizontal inside/below the plot: not over the title
    height = fig.layout.height or EXPORT_SIZE["height"]
    top = TITLE_PAD
    if title.text:
        size = title.font.size or 1.4 * (fig.layout.font.size or FONT_SIZE)
        top += (title.text.count("<br>") + 1) * size * 1.3 + 8
    fig.update_layout(
        height=height,
        title=dict(yref="container", y=1, yanchor="top", pad=dict(t=TITLE_PAD)),
        legend=dict(yref="container", y=1 - top / height, yanchor="top"),
    )
    return fig


def facet_titles(fig: go.Figure) -> go.Figure:
    """Plotly Express labels facets ``model=gemma4-31b``; keep just the value."""
    return fig.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]) if a.name != FOOTER_NAME else None)


def _start_exporter() -> bool:
    """Point kaleido at a Chromium and start one browser for all images (about 3 s saved each)."""
    global _exporter
    if _exporter is not None:
        return _exporter
    if "BROWSER_PATH" not in os.environ and os.access(DEBIAN_CHROMIUM, os.X_OK):
        os.environ["BROWSER_PATH"] = DEBIAN_CHROMIUM
    try:  # kaleido's own search: BROWSER_PATH, PATH, usual places, a `plotly_get_chrome` download
        from choreographer.browsers.chromium import Chromium

        browser = Chromium.find_browser(skip_local=False)
    except ImportError:
        browser = os.environ.get("BROWSER_PATH")
    # Check it ourselves: kaleido waits forever on a browser path that does not exist.
    _exporter = bool(browser) and os.access(browser, os.X_OK)
    if not _exporter:
        warnings.warn(
            "no Chromium found, so figures are written as HTML only. For PNG/SVG install one "
            "(as root: `apt-get install chromium`, or `bash ci/setup.sh`) or point BROWSER_PATH "
            "at a Chrome/Chromium binary.",
            stacklevel=3,
        )
        return False
    import kaleido

    if hasattr(kaleido, "start_sync_server"):
        kaleido.start_sync_server(silence_warnings=True)
        atexit.register(kaleido.stop_sync_server)
    return True


def save_figure(fig: go.Figure, name: str, svg: bool = False, out_dir: Path | None = None) -> list[Path]:
    """Write ``figures/NAME.html`` and, when a Chromium is available, ``NAME.png`` (and ``NAME.svg``).

    The figure must carry a footer from :func:`provenance`. Returns the paths written.
    """
    if not any(a.name == FOOTER_NAME for a in fig.layout.annotations):
        raise ValueError(f"figure {name!r} has no provenance footer: call mk.figures.provenance(fig, ...) first")
    legend_below_title(fig)  # again: the layout may have changed since provenance()
    out = Path(out_dir) if out_dir is not None else FIGURES_DIR
    out.mkdir(parents=True, exist_ok=True)
    html = out / f"{name}.html"  # self-contained (plotly.js inside) so it opens offline
    page = fig.to_html(include_plotlyjs=True, full_html=True)
    write_atomic(html, lambda tmp: tmp.write_text(page, encoding="utf-8"))
    written = [html]
    if _start_exporter():
        with warnings.catch_warnings():  # plotly notes that per-call kaleido options are unused with a server
            warnings.filterwarnings("ignore", message="The kopts argument is ignored")
            for fmt in ("png", "svg") if svg else ("png",):
                path = out / f"{name}.{fmt}"
                image = pio.to_image(fig, format=fmt, scale=2 if fmt == "png" else 1, **EXPORT_SIZE)
                write_atomic(path, lambda tmp: tmp.write_bytes(image))
                written.append(path)
    return written
