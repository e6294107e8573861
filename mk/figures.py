"""One plotly look for every figure, a provenance footer, and export to ``figures/`` as HTML + PNG.

Static images (PNG, SVG) go through kaleido 1.x, which drives a Chromium. Without one the HTML is
still written and a single warning says how to get PNGs.

Layout: a horizontal legend above the plot (``orientation="h"``) is placed under the title rather than
over it (:func:`legend_below_title`, applied by :func:`provenance` and :func:`save_figure`); a vertical
legend stays at the right of the plot, beside any title.
"""

from __future__ import annotations

import atexit
import base64
import datetime
import html
import logging
import math
import os
import re
import textwrap
import warnings
from pathlib import Path

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

from .files import write_atomic
from .paths import figures_dir

KINDS = ("published", "modelled", "measured", "compiler-scheduled")  # the last: libtpu's schedule, read without a TPU
DEBIAN_CHROMIUM = "/usr/bin/chromium"
FOOTER_NAME = "provenance"  # the annotation's name, so a figure is never saved without one
EXPORT_SIZE = dict(width=1000, height=600)  # layout pixels of PNG/SVG exports (PNG at twice that)
FONT_SIZE = 13  # the template's base font; plotly draws titles at 1.4 times it
TITLE_PAD = 15  # pixels above the title
FOOTER_LEFT = 20  # pixels from the image's left edge to the footer
FOOTER_CHARS = 150  # characters per footer line: 11-pixel text across a 1000-pixel image
FOOTER_LINE = 15  # pixels per footer line

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


def template_colours() -> tuple[str, ...]:
    """The template's colours in order, so a series keeps its colour in every panel and every figure."""
    return tuple(pio.templates["mk"].layout.colorway)


def context_label(n: int) -> str:
    """A context length as a tick label: 1K, 8K, 128K (whole KiB), else the number."""
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"


_exporter: bool | None = None  # None: not tried yet; False: no Chromium, PNGs skipped


def provenance(fig: go.Figure, kind: str, hardware: str, source: str | None = None) -> go.Figure:
    """Add (or replace) the footer saying what the numbers are: their kind, the hardware, and the
    source (for measured numbers, by default the JAX version and today's date). A figure that shows
    several kinds names them all, joined by " + " (``"published + modelled"``)."""
    if not kind or any(k not in KINDS for k in kind.split(" + ")):
        raise ValueError(f"kind must be one of {KINDS}, or several joined by ' + ', got {kind!r}")
    if source is None:
        if kind != "measured":
            raise ValueError(f"a {kind} figure needs its source (the seed, or which model)")
        import jax

        source = f"JAX {jax.__version__}, {datetime.date.today().isoformat()}"
    # Annotations cannot wrap themselves: break long footers by hand so they stay inside the image.
    text = "<br>".join(textwrap.wrap(f"<b>{kind}</b> · {hardware} · {source}", FOOTER_CHARS))
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
    return legend_below_title(place_footer(fig))


def place_footer(fig: go.Figure) -> go.Figure:
    """Start the footer near the image's left edge, not at the plot's (a plot pushed right by long axis labels,
    its ``margin.l``, would push the footer out of the image), and keep the bottom margin tall enough for all
    of its lines."""
    template = pio.templates["mk"].layout.margin
    left = fig.layout.margin.l if fig.layout.margin.l is not None else template.l
    bottom = fig.layout.margin.b if fig.layout.margin.b is not None else template.b
    for a in fig.layout.annotations:
        if a.name == FOOTER_NAME:
            a.xshift = FOOTER_LEFT - left
            needed = -a.yshift + FOOTER_LINE * (a.text.count("<br>") + 1) + 8
            if bottom < needed:
                fig.update_layout(margin_b=needed)
    return fig


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
    top, pad = TITLE_PAD, TITLE_PAD
    if title.text:
        size = title.font.size or 1.4 * (fig.layout.font.size or FONT_SIZE)
        lines = title.text.count("<br>") + 1
        top += lines * size * 1.3 + 8
        pad += (lines - 1) * size * 1.3  # plotly hangs a title's first line from its anchor, the rest above it
    fig.update_layout(
        height=height,
        title=dict(yref="container", y=1, yanchor="top", pad=dict(t=pad)),
        legend=dict(yref="container", y=1 - top / height, yanchor="top"),
    )
    return fig


def log_ticks(fig: go.Figure) -> go.Figure:
    """Label every logarithmic axis at 1, 2 and 5 times the powers of ten its data spans (finer steps where
    that would leave fewer than four labels), with whole numbers (plotly's own minor labels read "2", "5" for
    20, 50, 200, ...). An axis with its own tick values is left alone; one with its own range is labelled over
    that range."""
    names = [k for k in fig.layout if k.startswith(("xaxis", "yaxis"))]

    def root(name):  # facet axes that match another share its ticks and its data
        return fig.layout[name].matches or name[0] + name[5:]

    for name in names:
        axis = fig.layout[name]
        if axis.type != "log" or axis.tickvals is not None:
            continue
        if axis.range is not None:
            lo, hi = (10.0**r for r in sorted(axis.range))
        else:
            letter = name[0]
            refs = {n[0] + n[5:] for n in names if n[0] == letter and root(n) == root(name)}
            values = [
                _numbers(getattr(t, letter))
                for t in fig.data
                if getattr(t, letter) is not None and (getattr(t, letter + "axis") or letter) in refs
            ]
            v = np.concatenate(values) if values else np.array([])
            v = v[np.isfinite(v) & (v > 0)]
            if v.size == 0:
                continue
            lo, hi = v.min(), v.max()
        ticks = log_tick_values(lo, hi)
        axis.update(tickvals=ticks, ticktext=[tick_label(t) for t in ticks])
    return fig


def log_tick_values(lo: float, hi: float) -> list[float]:
    """Ticks for a logarithmic axis over ``lo``..``hi``: 1, 2 and 5 times powers of ten (and the next one out on
    either side, for a little margin), or finer steps where those give fewer than four inside."""
    for steps in ((1, 2, 5), (1, 1.5, 2, 3, 4, 5, 7), (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)):
        every = [m * 10.0**k for k in np.arange(np.floor(np.log10(lo)) - 1, np.ceil(np.log10(hi)) + 1) for m in steps]
        inside = [t for t in every if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]
        if len(inside) >= 4:
            break
    if len(inside) < 3:  # a range narrower than the finest steps: three round values spread over it
        inside = sorted({float(f"{t:.3g}") for t in np.geomspace(lo, hi, 3)})
    below = [t for t in every if t < lo * (1 - 1e-9)][-1:]
    above = [t for t in every if t > hi * (1 + 1e-9)][:1]
    return [float(t) for t in below + inside + above]


def context_ticks(contexts) -> tuple[list[int], list[str]]:
    """Context ticks for a log axis over ``contexts``, labelled 1K, 8K, 128K (mk.figures.context_label): every
    context the data has (up to eight of them); where it has fewer than four, also the powers of two between the
    shortest and the longest, every other one when there are more than six (1K, 2K, 8K, 32K, 128K)."""
    contexts = sorted(set(int(n) for n in contexts))
    lo, hi = contexts[0], contexts[-1]
    ticks = [2**k for k in range(math.ceil(math.log2(lo)), math.floor(math.log2(hi)) + 1)]
    if len(ticks) > 6:
        ticks = sorted({lo, *ticks[::-2]})
    ticks = sorted({lo, hi, *ticks})
    if 4 <= len(contexts) <= 8:
        ticks = contexts
    elif len(contexts) < 4:
        ticks = sorted({*ticks, *contexts})
    return ticks, [context_label(n) for n in ticks]


def tick_label(t: float) -> str:
    """A tick's number as a reader writes it: 0.005, 20, 1,000, 1.5."""
    return f"{t:,.6g}"


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

    # choreographer logs (as an exception, to stderr) and drops a pipe message a busy machine delivers torn, which a
    # notebook run shows as a traceback although the export goes on; its real failures still raise. A filter, not a
    # level: kaleido's logging set-up (logistro) may set the level again after this.
    logging.getLogger("choreographer.channels.pipe").addFilter(
        lambda record: not str(record.msg).startswith("JSONError decoding message")
    )
    if hasattr(kaleido, "start_sync_server"):
        kaleido.start_sync_server(silence_warnings=True)
        atexit.register(kaleido.stop_sync_server)
    return True


def save_figure(fig: go.Figure, name: str, svg: bool = False, out_dir: Path | None = None) -> list[Path]:
    """Write ``figures/NAME.html``, ``NAME.json`` (the figure, for ``plotly.io.read_json``) and, when a
    Chromium is available, ``NAME.png`` (and ``NAME.svg``), in ``out_dir`` if given, else
    :func:`mk.paths.figures_dir` ($MK_FIGURES_DIR, else ``figures/``).

    The figure must carry a footer from :func:`provenance`. Returns the paths written.
    """
    if not any(a.name == FOOTER_NAME for a in fig.layout.annotations):
        raise ValueError(f"figure {name!r} has no provenance footer: call mk.figures.provenance(fig, ...) first")
    legend_below_title(place_footer(fig))  # again: the layout may have changed since provenance()
    log_ticks(fig)
    # Every exported figure is checked (laid out by plotly in the Chromium that exports it): one with something
    # a reader cannot see (check_figure) is refused, nothing written, as the notebooks' own asserts refuse it.
    if _start_exporter():
        problems = check_figure(fig)
        if problems:
            raise ValueError(f"figure {name!r} cannot be read whole: {'; '.join(problems)}")
    out = Path(out_dir) if out_dir is not None else figures_dir()
    out.mkdir(parents=True, exist_ok=True)
    html = out / f"{name}.html"  # self-contained (plotly.js inside) so it opens offline
    page = fig.to_html(include_plotlyjs=True, full_html=True)
    write_atomic(html, lambda tmp: tmp.write_text(page, encoding="utf-8"))
    spec = out / f"{name}.json"
    doc = fig.to_json()
    write_atomic(spec, lambda tmp: tmp.write_text(doc, encoding="utf-8"))
    written = [html, spec]
    if _start_exporter():
        with warnings.catch_warnings():  # plotly notes that per-call kaleido options are unused with a server
            warnings.filterwarnings("ignore", message="The kopts argument is ignored")
            for fmt in ("png", "svg") if svg else ("png",):
                path = out / f"{name}.{fmt}"
                # a figure that sets its own size (a tall list of rows) is exported at it, never cropped to the default
                size = dict(
                    width=fig.layout.width or EXPORT_SIZE["width"], height=fig.layout.height or EXPORT_SIZE["height"]
                )
                image = pio.to_image(fig, format=fmt, scale=2 if fmt == "png" else 1, **size)
                write_atomic(path, lambda tmp: tmp.write_bytes(image))
                written.append(path)
    return written


def log_floor(values, decades: float = 3.0) -> float:
    """The floor of a logarithmic bar axis: the power of ten ``decades`` below the largest value, or the one
    below the smallest positive value when that is higher. Bars start at it; see :func:`floored`."""
    v = _numbers(values)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0:
        return 1.0
    return 10.0 ** max(np.floor(np.log10(v.max())) - decades, np.floor(np.log10(v.min())))


def floored(values, floor: float, unit: str = "") -> tuple[list, list, list]:
    """Bars of ``values`` on a logarithmic axis that starts at ``floor``: the heights to draw, each bar's
    pattern and its text. A value at or below the floor (zero, negative, or just tiny) is drawn as a short
    hatched stub with its value written above it, a missing one (NaN) as a stub that says so, so every
    bar of a group is seen; the others are drawn as they are, without text."""
    stub = floor * STUB
    heights, patterns, texts = [], [], []
    for x in _numbers(values):
        if not np.isfinite(x):
            heights.append(stub), patterns.append("."), texts.append("none")
        elif x <= floor:
            heights.append(stub), patterns.append("/"), texts.append("≤ 0" if x <= 0 else f"{x:.2g}{unit}")
        else:
            heights.append(x), patterns.append(""), texts.append("")
    return heights, patterns, texts


STUB = 1.8  # a floored bar's height, as a multiple of the floor: a few percent of a 3-4 decade axis


def check_figure(fig: go.Figure) -> list[str]:
    """What a reader could not see in ``fig``: a horizontal legend above the plot that is not hung below
    the title (:func:`legend_below_title`), a legend over (or under) the provenance footer, several series
    without a legend, a series with no mark inside its axis' range (a bar shorter than 0.5% of the axis is no
    mark, nor a line through one point; a legend key, a trace with no data at all, is not a series), a line drawn
    exactly under another, tick labels that run into each other (:func:`tick_collisions`), a logarithmic axis with
    fewer than three labelled ticks. Axis ranges and automatic ticks are plotly's own
    (``full_figure_for_development``, which needs a Chromium), laid out at the size the figure is exported at."""
    problems = []
    sized = go.Figure(fig)  # at the export size (plotly's own default is 700 pixels wide)
    sized.update_layout(
        width=fig.layout.width or EXPORT_SIZE["width"], height=fig.layout.height or EXPORT_SIZE["height"]
    )
    full = sized.full_figure_for_development(warn=False)
    legend, title = full.layout.legend, full.layout.title
    traces = [t for t in full.data if t.visible is not False]
    if legend.orientation == "h" and (legend.y is None or legend.y >= 1 or legend.yref == "container"):
        height = full.layout.height or EXPORT_SIZE["height"]
        size = title.font.size or 1.4 * FONT_SIZE
        title_bottom = 1 - (TITLE_PAD + (title.text or "").count("<br>") * size * 1.3 + size * 1.3) / height
        if title.text and (legend.yref != "container" or legend.y > title_bottom):
            problems.append("the legend sits over the title")
    shown = [t for t in traces if t.showlegend is not False and t.name]
    if len(traces) > 1 and (full.layout.showlegend is False or not shown):
        problems.append(f"{len(traces)} series but no legend")
    for t in traces:
        y_axis = full.layout["yaxis" + (t.yaxis or "")[1:]]
        # horizontal bars, and points on a category y axis, have their values on x
        horizontal = getattr(t, "orientation", None) == "h" or (t.type == "scatter" and y_axis.type == "category")
        values = t.x if horizontal else t.y
        if values is None or _legend_key(t):
            continue
        axis = full.layout[("xaxis" if horizontal else "yaxis") + ((t.xaxis if horizontal else t.yaxis) or "")[1:]]
        v = _numbers(values)
        v = v[np.isfinite(v)]
        # a line needs two points; plotly resolves the mode (markers by default below 20 points), and text is a mark
        if t.type == "scatter" and not {"markers", "text"} & set((t.mode or "").split("+")) and v.size == 1:
            problems.append(f"series {t.name!r} is a line through one point: no mark is drawn")
            continue
        if axis.type == "log":
            v = np.log10(v[v > 0])
        lo, hi = sorted(axis.range)
        if t.type == "bar":  # bars from the axis' foot (or their own base): seen if they cover 0.5% of it together
            lengths = np.clip(v, lo, hi) - lo if axis.type == "log" else np.minimum(np.abs(v), hi - lo)
            visible = lengths.sum() >= 0.005 * (hi - lo)
        else:
            visible = bool(np.any((v >= lo) & (v <= hi)))
        if not visible:
            problems.append(f"series {t.name!r} has no visible mark")
    lines = [t for t in traces if t.type == "scatter" and t.x is not None and t.y is not None]
    for i, a in enumerate(lines):
        for b in lines[i + 1 :]:
            same = all(np.array_equal(_numbers(p), _numbers(q)) for p, q in ((a.x, b.x), (a.y, b.y)))
            if a.xaxis == b.xaxis and a.yaxis == b.yaxis and same:
                problems.append(f"series {b.name!r} is drawn exactly over {a.name!r}")
    if _legend_over_footer(full, traces):
        problems.append("the legend sits over (or under) the footer")
    problems += tick_collisions(full)
    for name, ticks in _axes_ticks(full).items():
        if full.layout[name].type == "log" and len(ticks) < 3:
            problems.append(f"the log axis {name} has {len(ticks)} labelled ticks: fewer than three")
    return problems


# Layout estimates for check_figure: text sizes from font size and character count (DejaVu Sans: about 0.6 em a
# character, narrow ones about a third of an em, wide ones 0.9), so the checks need no browser beyond plotly's own.
CHAR_WIDTH = 0.6  # a character's width, in ems
NARROW, WIDE = set(" .,:;'|!()[]{}ijlft-/"), set("mwMW%@")  # about 0.33 and 0.9 em
TICK_GAP = 0.25  # ems of space neighbouring tick labels need between them not to touch
LINE_HEIGHT = 1.2  # a text line's height, in ems
LEGEND_ROW = 2.4  # a legend row's height, in ems (plotly pads its symbols)
LEGEND_KEY = 45  # pixels of a legend entry besides its text: the symbol and the gaps


def _plain_text(text) -> list[str]:
    """A label's lines as plain text (plotly's ``<br>`` breaks, tags dropped, entities read)."""
    lines = re.split(r"<br\s*/?>", str(text if text is not None else ""), flags=re.I)
    return [html.unescape(re.sub(r"<[^>]+>", "", line)) for line in lines]


def _text_box(text, size: float) -> tuple[float, float]:
    """The estimated width and height, in pixels, of ``text`` at font ``size``."""
    lines = _plain_text(text)
    ems = max(sum(0.33 if c in NARROW else 0.9 if c in WIDE else 0.7 if c.isupper() else CHAR_WIDTH for c in line)
              for line in lines)  # fmt: skip
    return ems * size, len(lines) * LINE_HEIGHT * size


def _plot_box(full) -> tuple[float, float, float, float, float, float]:
    """The figure's width and height and its plot area's left, top, width and height, in pixels."""
    lay = full.layout
    width, height = lay.width or EXPORT_SIZE["width"], lay.height or EXPORT_SIZE["height"]
    m = lay.margin
    return width, height, m.l, m.t, width - m.l - m.r, height - m.t - m.b


def _legend_over_footer(full, traces) -> bool:
    """Whether the legend, its size estimated from its entries, reaches down to the provenance footer (which
    hangs ``-yshift`` pixels below the plot) and overlaps it side to side."""
    lay = full.layout
    footers = [a for a in lay.annotations if a.name == FOOTER_NAME]
    entries = [t.name for t in traces if t.showlegend is not False and t.name]
    if not footers or not entries or lay.showlegend is False:
        return False
    width, height, left, top, plot_w, plot_h = _plot_box(full)
    legend, footer = lay.legend, footers[0]
    size = legend.font.size or lay.font.size or FONT_SIZE
    keys = [_text_box(name, size)[0] + LEGEND_KEY for name in entries]
    if legend.orientation == "h":
        rows, row = 1, 0.0
        for k in keys:
            if row and row + k > plot_w:
                rows, row = rows + 1, 0.0
            row += k
        box_w, box_h = min(sum(keys), plot_w), rows * LEGEND_ROW * size
    else:
        box_w, box_h = max(keys), len(keys) * LEGEND_ROW * size
    y = legend.y if legend.y is not None else 1.0
    at = (1 - y) * height if legend.yref == "container" else top + (1 - y) * plot_h
    anchor = (
        legend.yanchor
        if legend.yanchor not in (None, "auto")
        else "top"
        if y > 2 / 3
        else "bottom"
        if y < 1 / 3
        else "middle"
    )
    legend_top = at - {"top": 0, "middle": box_h / 2, "bottom": box_h}[anchor]
    x = legend.x if legend.x is not None else (1.02 if legend.orientation != "h" else 0)
    legend_left = (x * width if legend.xref == "container" else left + x * plot_w) - (
        {"left": 0, "center": box_w / 2, "right": box_w}.get(legend.xanchor or "left", 0)
    )
    footer_top = top + plot_h - (footer.yshift or 0)
    footer_w, footer_h = _text_box(footer.text, (footer.font.size if footer.font else None) or 11)
    footer_left = left + (footer.xshift or 0)
    return (
        (
            legend_top + box_h > footer_top
            and legend_top < footer_top + footer_h
            or legend_top >= footer_top  # wholly below it: a legend under the footer
        )
        and legend_left < footer_left + footer_w
        and legend_left + box_w > footer_left
    )


def _axes_ticks(full) -> dict[str, list[tuple[float, str]]]:
    """Every shown axis' labelled ticks inside its range: ``{"xaxis2": [(position, label), ...]}``, positions in
    the axis' own units (log10 of the value on a log axis, the index on a category axis). Plotly's automatic
    ticks are rebuilt from its ``tick0`` and ``dtick``; date and multicategory axes are left out."""
    out = {}
    names = [k for k in full.layout if k.startswith(("xaxis", "yaxis"))]
    for name in names:
        axis = full.layout[name]
        if axis.visible is False or axis.showticklabels is False or axis.range is None:
            continue
        if axis.type not in ("linear", "log", "category"):
            continue
        lo, hi = sorted(axis.range)
        eps = 1e-9 * max(abs(hi - lo), 1e-12)
        if axis.tickvals is not None:
            text = list(axis.ticktext) if axis.ticktext is not None else None
            ticks = []
            for i, v in enumerate(axis.tickvals):
                if axis.type == "category":
                    cats = _categories(full, name)
                    pos = cats.index(v) if v in cats else None
                else:
                    pos = math.log10(v) if axis.type == "log" and v > 0 else None if axis.type == "log" else float(v)
                if pos is not None and lo - eps <= pos <= hi + eps:
                    ticks.append((pos, text[i] if text and i < len(text) else tick_label(v)))
        elif axis.type == "category":
            cats, step = _categories(full, name), int(axis.dtick or 1)
            ticks = [(float(i), str(c)) for i, c in enumerate(cats) if i % step == 0 and lo - eps <= i <= hi + eps]
        elif axis.type == "log":
            dtick = str(axis.dtick)
            if dtick in (
                "D1",
                "D2",
            ):  # digits inside each decade: counted as the 1, 2 and 5 (plotly's "D1" others small)
                digits = (1, 2, 5)
                values = [d * 10.0**k for k in range(math.floor(lo) - 1, math.ceil(hi) + 1) for d in digits]
            elif dtick.startswith("L"):  # linear steps on a log axis
                step = float(dtick[1:])
                start = float(axis.tick0 or 0)
                values = list(start + step * np.arange(0, math.ceil((10**hi - start) / step) + 1))
            else:  # every dtick decades
                step = float(dtick) if dtick not in ("None", "") else 1.0
                values = [10.0**k for k in np.arange(math.floor(lo / step) * step, hi + step, step)]
            ticks = [(math.log10(v), tick_label(v)) for v in values if v > 0 and lo - eps <= math.log10(v) <= hi + eps]
        else:
            step, start = float(axis.dtick or 1), float(axis.tick0 or 0)
            first = math.ceil((lo - start) / step - 1e-9)
            count = int(math.floor((hi - start) / step + 1e-9)) - first + 1
            ticks = [(start + (first + i) * step, f"{start + (first + i) * step:.6g}") for i in range(max(count, 0))]
        out[name] = ticks
    return out


def _categories(full, name: str) -> list:
    """A category axis' categories in plotly's order: its ``categoryarray`` when ordered by it, else as the traces
    on it give them."""
    axis = full.layout[name]
    if axis.categoryorder == "array" and axis.categoryarray is not None:
        return list(axis.categoryarray)
    letter, ref = name[0], name[0] + name[5:]
    seen = {}
    for t in full.data:
        if (getattr(t, letter + "axis", None) or letter) == ref and getattr(t, letter, None) is not None:
            for v in getattr(t, letter):
                if v is not None:
                    seen.setdefault(v, None)
    return list(seen)


def tick_collisions(full) -> list[str]:
    """Axes of a laid-out figure (``full_figure_for_development``) whose neighbouring tick labels overlap: each
    label's width and height estimated from its font size and characters, against the ticks' spacing in pixels
    over the axis' length. A horizontal axis' labels may be tilted: by ``tickangle``, or where plotly picks the
    angle (``autotickangles``) at the first of its angles that fits, so they collide only if none fits."""
    problems = []
    width, height, left, top, plot_w, plot_h = _plot_box(full)
    for name, ticks in _axes_ticks(full).items():
        if len(ticks) < 2:
            continue
        axis = full.layout[name]
        lo, hi = sorted(axis.range)
        domain = axis.domain or (0, 1)
        length = (domain[1] - domain[0]) * (plot_w if name.startswith("x") else plot_h)
        size = (axis.tickfont.size if axis.tickfont else None) or full.layout.font.size or FONT_SIZE
        ticks = sorted(ticks)
        if name.startswith("x"):
            angles = [abs(axis.tickangle)] if axis.tickangle is not None else list(axis.autotickangles or (0, 30, 90))
        else:
            angles = [90 - abs(axis.tickangle)] if axis.tickangle is not None else [90]  # horizontal text on a y axis
        for (p, a), (q, b) in zip(ticks, ticks[1:]):
            gap = (q - p) / (hi - lo) * length
            (wa, ha), (wb, hb) = _text_box(a, size), _text_box(b, size)
            w, h = (wa + wb) / 2, max(ha, hb)  # the neighbours' half-widths

            def fits(angle, space=TICK_GAP * size):
                r = math.radians(angle)
                return gap * math.sin(r) >= h + space or gap * math.cos(r) >= w + space

            if not any(fits(angle) for angle in angles):
                problems.append(f"tick labels of {name} collide ({a!r} and {b!r}, {gap:.0f} pixels apart)")
                break
    return problems


def _legend_key(trace) -> bool:
    """A trace with no data at all (``x=[None], y=[None]``): a legend entry that explains a style, not a series."""
    return all(v is not None and not np.isfinite(_numbers(v)).any() for v in (trace.x, trace.y))


def _numbers(values):
    """A trace's values as floats (non-numbers NaN), from a list or plotly's typed-array JSON (``bdata``)."""
    if isinstance(values, dict) and "bdata" in values:
        return np.frombuffer(base64.b64decode(values["bdata"]), dtype=values["dtype"]).astype(float)
    out = []
    for x in values:
        try:
            out.append(float(x))
        except (TypeError, ValueError):
            out.append(float("nan"))
    return np.asarray(out)
