"""mk.figures: the provenance footer, HTML + PNG export, and HTML only (with one clear warning) without a Chromium."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import plotly.graph_objects as go
import pytest

from mk.figures import FOOTER_NAME, facet_titles, provenance, save_figure

ROOT = Path(__file__).resolve().parent.parent


def small_figure():
    return go.Figure(go.Scatter(x=[1, 2], y=[3, 4]), layout=dict(title="t"))


def footer(fig):
    return [a.text for a in fig.layout.annotations if a.name == FOOTER_NAME]


def test_footer_says_kind_hardware_and_source():
    fig = provenance(small_figure(), "published", "TPU v5e-8", "seed")
    assert footer(fig) == ["<b>published</b> · TPU v5e-8 · seed"]
    provenance(fig, "modelled", "h100", "mk.sol")  # replaces, never stacks
    assert footer(fig) == ["<b>modelled</b> · h100 · mk.sol"]


def test_measured_footer_defaults_to_jax_version_and_date():
    import datetime

    import jax

    (text,) = footer(provenance(small_figure(), "measured", "cpu"))
    assert f"JAX {jax.__version__}" in text and datetime.date.today().isoformat() in text


@pytest.mark.parametrize(
    "kind, source, message", [("guessed", "x", "kind must be one of"), ("modelled", None, "needs its source")]
)
def test_footer_rejects_bad_provenance(kind, source, message):
    with pytest.raises(ValueError, match=message):
        provenance(small_figure(), kind, "h100", source)


def test_save_refuses_a_figure_without_footer(tmp_path):
    with pytest.raises(ValueError, match="no provenance footer"):
        save_figure(small_figure(), "x", out_dir=tmp_path)


def test_facet_titles_keep_the_footer():
    import plotly.express as px

    fig = px.line(x=[1, 2, 1, 2], y=[1, 2, 3, 4], facet_col=["a", "a", "b", "b"])
    fig = facet_titles(provenance(fig, "modelled", "h100", "a=b"))
    texts = [a.text for a in fig.layout.annotations]
    assert "a" in texts and "b" in texts and footer(fig) == ["<b>modelled</b> · h100 · a=b"]


def test_a_horizontal_legend_above_the_plot_hangs_below_the_title():
    import plotly.express as px

    names = [f"a long series name, number {i} (measured, this CPU)" for i in range(4)]  # wraps to two rows
    fig = px.bar(x=["a"] * 4, y=[1, 2, 3, 4], color=names, barmode="group", title="A title")
    fig.update_layout(legend=dict(orientation="h", y=1.02, yanchor="bottom"))  # the notebooks' request
    provenance(fig, "modelled", "h100", "test")
    lay = fig.layout
    assert (lay.title.yref, lay.title.y, lay.title.yanchor) == ("container", 1, "top")
    assert (lay.legend.yref, lay.legend.yanchor) == ("container", "top")
    title_bottom_px = lay.title.pad.t + 1.4 * 13 * 1.2  # the title's pad and one line of its font
    assert (1 - lay.legend.y) * lay.height > title_bottom_px  # the legend starts under the title
    assert lay.height == 600  # a fixed height, so the container coordinates are fixed pixels


def test_a_vertical_legend_is_left_beside_the_title():
    import plotly.express as px

    fig = provenance(
        px.line(x=[1, 2, 1, 2], y=[1, 2, 3, 4], color=["a", "a", "b", "b"], title="t"), "modelled", "h100", "test"
    )
    assert fig.layout.legend.yref is None and fig.layout.title.yref is None and fig.layout.height is None


@pytest.mark.skipif(
    not os.access("/usr/bin/chromium", os.X_OK), reason="needs Debian's chromium (apt-get install chromium)"
)
def test_html_png_and_svg_with_chromium(tmp_path):
    written = save_figure(provenance(small_figure(), "modelled", "h100", "test"), "fig", svg=True, out_dir=tmp_path)
    assert sorted(p.name for p in written) == ["fig.html", "fig.json", "fig.png", "fig.svg"]
    assert (tmp_path / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*partial"))  # temporary names renamed away


def test_without_chromium_html_only_and_one_warning(tmp_path):
    # A fresh process: the exporter is set up once per process. kaleido would wait forever on a missing browser.
    code = textwrap.dedent(f"""
        import warnings
        import plotly.graph_objects as go
        from mk.figures import provenance, save_figure
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            for name in ("a", "b"):
                out = save_figure(provenance(go.Figure(), "modelled", "h100", "test"), name, out_dir={str(tmp_path)!r})
                print([p.name for p in out])
        print(len(w), w[0].message)
    """)
    env = dict(os.environ, BROWSER_PATH="/nonexistent/chromium")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["['a.html', 'a.json']", "['b.html', 'b.json']"]
    assert lines[2].startswith("1 no Chromium found") and "apt-get install chromium" in lines[2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "a.json", "b.html", "b.json"]


def test_check_figure_finds_what_a_reader_cannot_see():
    """A bar too short to see on its axis, several series without a legend, a line under another, a legend
    over the title: each reported; a clean figure passes."""
    import shutil

    if not (shutil.which("chromium") or os.environ.get("BROWSER_PATH")):
        pytest.skip("plotly lays out figures in a Chromium")
    from mk.figures import check_figure

    good = go.Figure([go.Bar(x=["a", "b"], y=[3, 5], name="one"), go.Bar(x=["a", "b"], y=[2, 4], name="two")])
    good.update_layout(title="clean", legend=dict(orientation="h", y=1.02, yanchor="bottom"))
    provenance(good, "modelled", "none", "a test")
    assert check_figure(good) == []
    tiny = go.Figure([go.Bar(x=["a"], y=[1000], name="big"), go.Bar(x=["a"], y=[0.5], name="tiny")])
    assert any("'tiny' has no visible mark" in p for p in check_figure(tiny))
    hidden = go.Figure([go.Scatter(x=[1, 2], y=[1, 2], name="a"), go.Scatter(x=[1, 2], y=[1, 2], name="b")])
    assert any("drawn exactly over" in p for p in check_figure(hidden))
    unnamed = go.Figure([go.Scatter(x=[1, 2], y=[1, 2]), go.Scatter(x=[1, 2], y=[2, 3])])
    unnamed.update_layout(showlegend=False)
    assert any("no legend" in p for p in check_figure(unnamed))
    over = go.Figure([go.Bar(x=["a"], y=[1], name="one"), go.Bar(x=["a"], y=[2], name="two")])
    over.update_layout(title="a title", legend=dict(orientation="h", y=1.02, yanchor="bottom"))
    assert "the legend sits over the title" in check_figure(over)
