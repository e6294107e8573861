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
    """A bar too short to see on its axis, a line through one point, several series without a legend, a line under
    another, a legend over the title: each reported; a clean figure passes."""
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
    lone = go.Figure([go.Scatter(x=[1, 2], y=[1, 2], name="two"), go.Scatter(x=[1], y=[3], mode="lines", name="one")])
    assert any("'one' is a line through one point" in p for p in check_figure(lone))
    assert check_figure(lone.update_traces(mode="lines+markers", selector=dict(name="one"))) == []
    assert check_figure(lone.update_traces(mode="lines+text", text=["3"], selector=dict(name="one"))) == []
    hidden = go.Figure([go.Scatter(x=[1, 2], y=[1, 2], name="a"), go.Scatter(x=[1, 2], y=[1, 2], name="b")])
    assert any("drawn exactly over" in p for p in check_figure(hidden))
    unnamed = go.Figure([go.Scatter(x=[1, 2], y=[1, 2]), go.Scatter(x=[1, 2], y=[2, 3])])
    unnamed.update_layout(showlegend=False)
    assert any("no legend" in p for p in check_figure(unnamed))
    over = go.Figure([go.Bar(x=["a"], y=[1], name="one"), go.Bar(x=["a"], y=[2], name="two")])
    over.update_layout(title="a title", legend=dict(orientation="h", y=1.02, yanchor="bottom"))
    assert "the legend sits over the title" in check_figure(over)


def _needs_chromium():
    import shutil

    if not (shutil.which("chromium") or os.environ.get("BROWSER_PATH") or os.access("/usr/bin/chromium", os.X_OK)):
        pytest.skip("plotly lays out figures in a Chromium")


def two_series(**layout):
    fig = go.Figure(
        [go.Scatter(x=[1, 2, 3], y=[1, 3, 2], name="one"), go.Scatter(x=[1, 2, 3], y=[2, 1, 3], name="two")]
    )
    return provenance(fig.update_layout(title="t", **layout), "modelled", "none", "a test")


def test_check_figure_finds_a_legend_over_or_under_the_footer():
    _needs_chromium()
    from mk.figures import check_figure

    assert check_figure(two_series(legend=dict(orientation="h", y=1.02, yanchor="bottom", x=0))) == []
    assert check_figure(two_series()) == []  # plotly's own, at the right of the plot
    under = two_series(legend=dict(orientation="h", y=-0.25, yanchor="top", x=0))  # 10_speculation's, before
    assert "the legend sits over (or under) the footer" in check_figure(under)
    over = two_series(legend=dict(orientation="h", y=-0.2, yanchor="top", x=0))
    assert "the legend sits over (or under) the footer" in check_figure(over)


def test_check_figure_finds_tick_labels_that_collide():
    _needs_chromium()
    from plotly.subplots import make_subplots

    from mk.figures import check_figure

    def panels(tokens, **xaxis):  # 08_quality's, before: a tick a token in each of two panels
        fig = make_subplots(rows=1, cols=2)
        for col in (1, 2):
            fig.add_scatter(x=list(range(tokens)), y=[1.0] * tokens, name=f"s{col}", row=1, col=col)
        fig.update_xaxes(**xaxis)
        return provenance(fig.update_layout(title="t"), "modelled", "none", "a test")

    crowded = check_figure(panels(32, dtick=1))
    assert any("tick labels of xaxis collide" in p for p in crowded), crowded
    assert check_figure(panels(32, dtick=4)) == []
    assert check_figure(panels(8, dtick=1)) == []
    words = ["a rather long label", "another long label", "yet another label", "and one more"] * 3
    flat = provenance(go.Figure(go.Bar(x=words[:12], y=list(range(12)), name="b")), "modelled", "none", "a test")
    flat.update_layout(
        xaxis=dict(tickangle=0, categoryorder="array", categoryarray=[f"{w} {i}" for i, w in enumerate(words)])
    )
    flat.data[0].x = [f"{w} {i}" for i, w in enumerate(words)]
    assert any("collide" in p for p in check_figure(flat))  # held flat, they run into each other
    flat.update_layout(xaxis_tickangle=None)  # plotly may tilt them: at 90 degrees they fit
    assert check_figure(flat) == []
    rows = provenance(go.Figure(go.Scatter(x=list(range(40)), y=[f"row {i}" for i in range(40)], name="r")), "modelled",
                      "none", "a test")  # fmt: skip
    rows.update_yaxes(dtick=1)  # every row labelled
    assert any("yaxis collide" in p for p in check_figure(rows))  # 40 rows in 420 pixels
    assert check_figure(rows.update_layout(height=40 * 22 + 200)) == []


def test_check_figure_finds_a_log_axis_with_fewer_than_three_ticks():
    _needs_chromium()
    from mk.figures import check_figure

    fig = two_series(yaxis=dict(type="log"))
    fig.data[0].y, fig.data[1].y = (1, 300, 20), (5, 2, 100)
    assert check_figure(fig) == []  # plotly's own: every decade and its 2s and 5s
    few = go.Figure(fig).update_yaxes(tickvals=[1, 100], range=[0, 2.5])
    assert "the log axis yaxis has 2 labelled ticks: fewer than three" in check_figure(few)
    assert check_figure(go.Figure(fig).update_yaxes(tickvals=[1, 10, 100], range=[0, 2.5])) == []


def test_save_figure_refuses_a_figure_a_reader_cannot_read(tmp_path):
    _needs_chromium()
    bad = two_series(legend=dict(orientation="h", y=-0.25, yanchor="top", x=0))
    with pytest.raises(ValueError, match="legend sits over"):
        save_figure(bad, "bad", out_dir=tmp_path)
    assert not list(tmp_path.iterdir())  # nothing written
    assert save_figure(two_series(), "good", out_dir=tmp_path)


@pytest.mark.skipif(
    not os.access("/usr/bin/chromium", os.X_OK), reason="needs Debian's chromium (apt-get install chromium)"
)
def test_a_tall_figure_is_exported_whole_with_its_footer(tmp_path):
    import struct

    fig = provenance(small_figure().update_layout(height=900, margin=dict(l=300)), "modelled", "h100", "test")
    footer_shift = [a.xshift for a in fig.layout.annotations if a.name == FOOTER_NAME][0]
    assert footer_shift == 20 - 300  # from near the image's left edge, not the plot's
    save_figure(fig, "tall", out_dir=tmp_path)
    width, height = struct.unpack(">II", (tmp_path / "tall.png").read_bytes()[16:24])
    assert (width, height) == (2000, 1800)  # its own height, at twice the pixels: nothing cropped


def test_log_ticks_floors_and_stubs():
    from mk.figures import floored, log_floor, log_tick_values

    assert log_tick_values(6, 3861) == [5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]  # 1-2-5
    narrow = log_tick_values(38, 105)  # 1-2-5 would leave 50 and 100: finer steps
    assert [t for t in narrow if 38 <= t <= 105] == [40, 50, 70, 100]
    assert log_floor([0.43, 0.00078]) == pytest.approx(1e-4) and log_floor([1.76, 0.003]) == pytest.approx(1e-3)
    heights, patterns, texts = floored([0.5, 0.0005, 0.0, float("nan")], 1e-3)
    assert heights[0] == 0.5 and all(h > 1e-3 for h in heights)  # every bar of the group seen
    assert patterns == ["", "/", "/", "."] and texts == ["", "0.0005", "≤ 0", "none"]


def timeline_runs():
    from mk import timing
    from mk.chips import get_chip
    from mk.config import get_config
    from mk.kernel_setup import Collective, KernelSetup

    cfg, chip = get_config("tiny-moe"), get_chip("tpu-v5e-8")
    setups = {on: KernelSetup(collective=Collective(overlap=on)) for on in (False, True)}
    plans = {on: timing.step_plan(cfg, chip, 64, 1, "bf16", setup) for on, setup in setups.items()}
    return {f"overlap {on}": timing.pace_timeline(plan, chip) for on, plan in plans.items()}


def test_the_timeline_draws_blocks_marks_layers_and_keeps_one_colour_per_lane():
    import pandas as pd

    from mk.views.timeline import LANES, blocks, timeline_figure

    runs = timeline_runs()
    fig = timeline_figure(runs, 2, "t")
    bars = sum(len(t.x) for t in fig.data)
    drawn = sum(sum(r["start_s"] < 1e9 for r in rows) for rows in runs.values())
    assert bars < drawn / 3  # blocks, not one sliver per tile
    rows = pd.DataFrame(runs["overlap False"]).assign(drawn=lambda t: t.lane.map(LANES))
    b = blocks(rows, 0.0)
    for lane, g in rows.groupby("drawn"):  # merging keeps every row's busy time, and each row in one block
        assert b[b.drawn == lane].busy_s.sum() == pytest.approx((g.end_s - g.start_s).sum())
        assert b[b.drawn == lane].rows.sum() == len(g)
    labels = [a.text for a in fig.layout.annotations]
    assert labels.count("layer 0") == labels.count("layer 1") == 2  # in both panels
    assert any(s.type == "rect" for s in fig.layout.shapes) and any(s.type == "line" for s in fig.layout.shapes)
    colours = {}
    for trace in fig.data + timeline_figure({"one": runs["overlap True"]}, 1, "u").data:
        assert colours.setdefault(trace.name, trace.marker.color) == trace.marker.color  # one scheme everywhere


def test_the_validation_figure_has_one_trace_per_role():
    import pandas as pd

    from mk.views.verdict import ROLES, role_group, validation_figure

    roles = ["test", "fitted", "input", "by construction", "same point as a", "same point as b", "test"]
    table = pd.DataFrame(dict(key=list("abcdefg"), component="", case="c", unit="s", role=roles,
                              published=1.0, modelled=[1.1, 1.0, 1.0, 1.0, 0.9, 0.9, 1e-4]))  # fmt: skip
    roles = ["derived: a / b", "test (baseline fitted)", "fitted (megakernel step)", "not modelled (no config)",
             "stand-in (another model)"]  # fmt: skip
    verdicts = pd.DataFrame(
        dict(key=list("vwyxz"), situation="s", published=2.0, modelled=[1.9, 2.2, 2.4, None, 1.7], role=roles)
    )
    fig = validation_figure(table, verdicts)
    names = [t.name for t in fig.data]
    assert names == [look[2] for look in ROLES.values()]  # one trace per role, in one order, each named
    assert names[0] == "test" and len(fig.data[0].x) == 2
    assert sum(len(t.x) for t in fig.data) == len(table) + 4  # one marker per row; the unmodelled one has none
    assert role_group("same point as mk_v5e8_moe_step") == "same point as" and role_group("derived: a / b") == "derived"
    assert fig.data[0].marker.symbol[1] == "triangle-left"  # beyond the axis: at its edge


def test_the_quality_figure_says_its_weights_are_random():
    import pandas as pd

    from mk.views.quality import quality_figure

    rows = pd.DataFrame(dict(model=["tiny-moe"] * 4 + ["real"] * 4, scheme="int8-experts", step=[0, 1] * 4,
                             user=[0, 0, 1, 1] * 2, max_abs_logit_error=[0.1, 0.2, 0.3, 0.1] * 2))  # fmt: skip
    fig = quality_figure(rows[rows.model == "tiny-moe"], random_models={"tiny-moe"})
    assert "random weights" in fig.layout.title.text and "random weights" in fig.layout.annotations[0].text
    assert list(fig.data[0].y) == [0.3, 0.2]  # the worst user at each step
    mixed = quality_figure(rows, random_models={"tiny-moe"})
    assert [a.text for a in mixed.layout.annotations] == ["tiny-moe (random weights)", "real (trained checkpoint)"]


def test_bytes_by_component_writes_every_bar_in_gb_and_reads_whole():
    import pandas as pd

    from mk.figures import check_figure
    from mk.sol import component_table
    from mk.views.components import component_bytes_figure

    rows = pd.concat(
        [component_table(["gemma4-26b-a4b", "gemma4-31b"], 1024, 1, d).assign(dtype=d) for d in ("bf16", "int8")],
        ignore_index=True,
    )
    fig = component_bytes_figure(rows, "dtype", "bytes")
    bars = [t for t in fig.data if t.type == "bar"]
    assert {t.orientation for t in bars} == {"h"} and [t.name for t in bars] == ["bf16", "int8"] * 2
    norms = rows[(rows.model == "gemma4-26b-a4b") & (rows.component == "norms") & (rows.dtype == "bf16")].bytes.iloc[0]
    assert f"{norms / 1e9:.3g} GB" in bars[0].text  # too small to draw, still read
    if os.access("/usr/bin/chromium", os.X_OK):  # laid out by plotly in a Chromium
        assert not check_figure(provenance(fig, "modelled", "any chip", "mk.sol"))


def test_context_axes_are_ticked_at_the_data_contexts_in_k():
    import pandas as pd

    from mk.views.sol import kv_figure

    kv = pd.DataFrame(dict(model="m", series="s", context=[1024, 8192, 131072], GB=[0.1, 0.2, 0.3]))
    axis = kv_figure(kv, "kv").layout.xaxis
    # every context the data has, labelled in K; with fewer than four, powers of two between (mk.figures.context_ticks)
    ticks = dict(zip(axis.tickvals, axis.ticktext))
    assert {1024: "1K", 8192: "8K", 131072: "128K"}.items() <= ticks.items()
    assert all(t & (t - 1) == 0 for t in ticks) and ticks[32768] == "32K"


def test_a_ratio_and_its_interval_keep_three_significant_figures():
    """Notebook 02's slowdowns: an interval that rounds to its median is left out rather than written as '7x (7-7x)',
    and a ratio keeps three significant figures whatever its size."""
    from mk.views.general import times

    assert times(7.3123, 6.93, 7.851, " slower") == "7.31x slower (6.93-7.85x)"
    assert times(11.046, 7.351, 14.648) == "11.0x (7.35-14.6x)"
    assert times(7.0001, 6.9999, 7.0003) == "7.00x"
    assert times(0.01234, 0.01, 0.02) == "0.0123x (0.0100-0.0200x)"
