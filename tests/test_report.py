"""mk.report: tables exported with their provenance, and the one offline page gathering figures and tables."""

import html
import json
import re

import pandas as pd
import plotly.graph_objects as go
import pytest

import mk.figures
from mk.__main__ import main
from mk.analysis import on_tpu
from mk.analysis.claims import CLAIMS, OTHER_COMPARISON, WORKBOOK_CLAIMS, claims_table
from mk.analysis.verdict import STAND_IN_ROLE, is_test
from mk.figures import provenance, save_figure
from mk.notebook import Table, in_ms, show
from mk.paths import FIGURES_ENV, NOTEBOOKS_DIR
from mk.published import published, published_table
from mk.report import export_table, kinds_named, write_report


def table():
    return pd.DataFrame({"chip": ["h100", "tpu-v5e-8"], "tokens_per_s": [1234.56789, 0.000012345], "users": [1, 8]})


def test_export_table_writes_csv_and_meta(tmp_path):
    csv, meta = export_table(table(), "01_sol_table", "published + modelled", "h100, tpu-v5e-8", "mk.sol", tmp_path)
    assert (csv.name, meta.name) == ("01_sol_table.csv", "01_sol_table.meta.json")
    back = pd.read_csv(csv)  # floats to 4 significant figures, a tiny value kept
    assert back.tokens_per_s.tolist() == [1235.0, 1.234e-05] and back.users.tolist() == [1, 8]
    m = json.loads(meta.read_text())
    assert m["kind"] == "published + modelled" and m["hardware"] == "h100, tpu-v5e-8" and m["source"] == "mk.sol"
    assert m["columns"] == ["chip", "tokens_per_s", "users"] and re.fullmatch(r"\d{4}-\d\d-\d\d", m["date"])
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


@pytest.mark.parametrize(
    "name, kind, hardware, message",
    [
        ("01_t", "guessed", "cpu", "kind must be one of"),
        ("01_t", "modelled + guessed", "cpu", "kind must be one of"),
        ("01_t", "", "cpu", "kind must be one of"),
        ("sol_table", "modelled", "cpu", "two-digit number"),
        ("1_t", "modelled", "cpu", "two-digit number"),
        ("01_../x", "modelled", "cpu", "two-digit number"),
        ("01_t", "modelled", None, "needs its hardware"),
    ],
)
def test_export_table_rejects_bad_provenance(tmp_path, name, kind, hardware, message):
    with pytest.raises(ValueError, match=message):
        export_table(table(), name, kind, hardware, out_dir=tmp_path)
    assert not list(tmp_path.iterdir())


def test_kinds_named_reads_free_text_labels():
    assert kinds_named(["measured (cpu, JAX 0.6); bytes_time modelled; seed_* published"]) == (
        "published + modelled + measured"
    )
    assert kinds_named(["modelled (mk.sol)", "modelled (mk.sol)"]) == "modelled"
    # a kind said not to apply is not named: an acceptance "given, not measured" makes no table measured
    assert kinds_named(["modelled (mk.timing; acceptance 0.7, given, not measured)"]) == "modelled"
    with pytest.raises(ValueError, match="name none of"):
        kinds_named(["guessed"])


def test_show_exports_what_it_shows(tmp_path, monkeypatch):
    monkeypatch.setenv(FIGURES_ENV, str(tmp_path))  # how the runner points a notebook's exports elsewhere
    show(table(), kind="modelled (mk.sol)", export="02_t", hardware="h100")
    m = json.loads((tmp_path / "02_t.meta.json").read_text())
    assert (m["kind"], m["hardware"], m["source"], m["digits"]) == ("modelled", "h100", "modelled (mk.sol)", 3)
    assert m["caption"] == "kind: modelled (mk.sol)"  # said once: the CSV has no constant kind column
    assert list(pd.read_csv(tmp_path / "02_t.csv").columns) == ["chip", "tokens_per_s", "users"]
    with pytest.raises(ValueError, match="needs its hardware"):
        show(table(), kind="modelled (mk.sol)", export="02_u")
    show(table().assign(kind=["published (the seed)", "modelled (mk.sol)"]), export="02_v", hardware="h100")
    m = json.loads((tmp_path / "02_v.meta.json").read_text())
    assert (m["kind"], m["source"]) == ("published + modelled", "per row, in the kind column")
    assert pd.read_csv(tmp_path / "02_v.csv").kind.tolist() == ["published (the seed)", "modelled (mk.sol)"]


def test_show_says_the_kind_once_in_a_caption_above_the_table():
    shown = Table(table().assign(kind="modelled (mk.sol)"), digits=2)
    assert "kind" not in shown.df.columns and shown.caption == "kind: modelled (mk.sol)"
    page = shown._repr_html_()
    assert page.index("kind: modelled (mk.sol)") < page.index("<table") and ">kind<" not in page
    assert "1234.57" in page and "1.23e-05" in page  # rounded, a tiny value kept
    assert repr(shown).splitlines()[0] == "kind: modelled (mk.sol)"
    mixed = Table(table().assign(kind=["published (the seed)", "modelled (mk.sol)"]))
    assert list(mixed.df.columns)[-1] == "kind" and mixed.caption.startswith("kind: per row")


@pytest.fixture
def figures(tmp_path, monkeypatch):
    """Two saved figures (one with a stand-in PNG), one table, and a stale figure of no notebook."""
    monkeypatch.setattr(mk.figures, "_exporter", False)  # no PNG export here: fast, with or without a Chromium
    claim = dict(key="sol_h100", claim="speed of light: h100", published=427.0, workbook=425.4, unit="tok/s")
    claims = pd.DataFrame(
        [dict(claim, kind="modelled", role="test", op_costs="-", error=425.4 / 427 - 1, shown_in=["01_bars"])]
    )
    monkeypatch.setattr("mk.report.claims_table", lambda: claims)  # the real one: test_the_claims_table
    books, out = tmp_path / "notebooks", tmp_path / "figures"
    books.mkdir()
    for number, title, code in (
        ("01", "The speed of light", 'save_figure(fig, "01_bars")'),
        ("02", "The general stack", 'show(df, export="02_speeds")'),  # 02_line: named nowhere, maybe stale
    ):
        nb = {"cells": [{"cell_type": "markdown", "source": [f"# {number} · {title}\n", "\n", "text"]}]}
        nb["cells"].append({"cell_type": "code", "source": [code]})
        (books / f"{number}_x.ipynb").write_text(json.dumps(nb))
    fig = provenance(go.Figure(go.Bar(x=["a"], y=[1]), layout=dict(title="Bars of one")), "modelled", "h100", "mk.sol")
    save_figure(fig, "01_bars", out_dir=out)
    (out / "01_bars.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    fig = provenance(go.Figure(go.Scatter(x=[1], y=[2]), layout=dict(title="A <b>line</b>")), "measured", "cpu")
    save_figure(fig, "02_line", out_dir=out)
    save_figure(fig, "09_stale", out_dir=out)
    export_table(table(), "02_speeds", "published", "tpu-v5e-8", "data/published.csv", out, digits=2)
    return out, books


def test_report_gathers_figures_and_tables_offline(figures):
    out, books = figures
    page = write_report(out, books).read_text()
    for text in ("01 · The speed of light", "02 · The general stack", "Bars of one", "A line", "speeds"):
        assert text in page
    assert "mk.sol" in page and "h100" in page and "tpu-v5e-8" in page and "data/published.csv" in page
    assert "JAX " in page  # a measured figure's default source
    assert '<img src="01_bars.png"' in page and '<img src="02_line.png"' not in page
    assert 'href="01_bars.html"' in page and 'href="02_line.html"' in page and 'href="02_speeds.csv"' in page
    assert "1235.00" in page and "1.23e-05" in page  # two decimals of the 4 figures exported, a tiny value kept
    assert "09_stale" not in page.split("<h2>Left out</h2>")[0] and "09_stale.json" in page
    assert page.index("01 · The speed of light") < page.index("02 · The general stack")
    assert page.index('id="table-02_speeds"') < page.index('id="fig-02_line"')  # in the notebook's order, unnamed last
    assert page.index('id="claims"') < page.index('id="nb-01"') and 'href="#fig-01_bars"' in page
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)), "duplicate anchors"
    assert page.count("may be left from an older version") == 1
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "the page must not need the network"
    assert "<script" not in page


def test_cli_report(figures, capsys):
    out, _ = figures
    assert main(["report", "--figures", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out / "index.html")
    assert main(["report", "--figures", str(out / "missing")]) == 2


def test_the_claims_table_holds_every_claim_computed_and_the_page_opens_with_it(tmp_path, monkeypatch):
    monkeypatch.setattr(mk.figures, "_exporter", False)
    claims = claims_table()
    measured = [k for k in claims.key if k.endswith("_measured")]  # what a TPU measured (data/measured/tpu.csv)
    modelled = [k for k in claims.key if not k.endswith("_measured")]
    assert modelled == [*CLAIMS, *WORKBOOK_CLAIMS] and claims.key.is_unique
    keys = list(claims.key)
    c = claims.set_index("key")
    assert {k.removesuffix("_measured") for k in measured} <= set(CLAIMS) | set(WORKBOOK_CLAIMS)
    steps = on_tpu.tpu_steps()
    for k in measured:  # right below its modelled twin, against the same published value, the chip and its own date
        twin = k.removesuffix("_measured")
        assert keys[keys.index(k) - 1] == twin, k
        assert c.kind[k].startswith("measured") and "TPU v5e" in c.kind[k], k
        assert c.published[k] == c.published[twin] or pd.isna(c.published[k]) and pd.isna(c.published[twin])
        dates = set(re.findall(r"\d{4}-\d\d-\d\d", c.kind[k]))
        assert len(dates) == 1 and dates <= set(steps.date.str[:10]), (k, c.kind[k])  # its own date, one
    # the dense speed-up the chip measured is against XLA, not vLLM: its scope in its words, and no error against vLLM's
    same_tpu = "verdict_dense_same_tpu_measured"
    if same_tpu in c.index:
        assert "XLA" in c.claim[same_tpu] and "not vLLM" in c.kind[same_tpu] and "tpu-v5e-8" not in c.claim[same_tpu]
        assert pd.isna(c.error[same_tpu]) and c.role[same_tpu] == OTHER_COMPARISON
    assert c.published["mk_v5e8_moe_tps"] == published("mk_v5e8_moe_tps")  # read, never typed
    assert abs(c.error["sol_h100"]) < 0.01 and abs(c.error["bytes_per_token_moe"]) < 0.02  # mk.sol's count
    assert c.workbook["straggler_max_experts"] == pytest.approx(2.53, abs=0.005)  # exact, mk.routing
    assert c.kind["vllm_h100_moe_tps"].startswith("fitted") and c.kind["vllm_h100_moe_kernels"] == "input"
    assert c.kind["mk_v5e8_moe_step"] == "modelled" and "same point as" in c.kind["mk_v5e8_moe_tps"]
    assert c.kind["verdict_moe_one_user"].startswith("derived")
    assert c.workbook.notna().all()  # every claim computed, the Llama 1B verdict from its config (data/configs)
    # the small model's megakernel step is the point the GPU megakernel's cost per op is fitted to: not a test
    assert c.kind["verdict_small_model"].startswith("fitted (its megakernel step") and not is_test(
        c.role["verdict_small_model"]
    )
    # every row says what it is and where a timed step's per-op costs come from
    roles = {"test", "test (baseline fitted)", "fitted", "fitted (megakernel step)", "input", "by construction",
             "derived", "bound", "measured", OTHER_COMPARISON, "workbook's own", STAND_IN_ROLE}  # fmt: skip
    assert set(c.role) <= roles
    assert c.role["sol_h100"] == "test" and c.op_costs["sol_h100"] == "-"
    assert c.op_costs["mk_v5e8_moe_step"] in ("compiler-scheduled", "assumed")
    # a published "over 700 tok/s" is a bound: compared as one, on the page too
    assert c.role["kimi_speculative_tps"] == "bound" and published_table().set_index("key").quantity[
        "kimi_speculative_tps"
    ].endswith("lower_bound")
    assert c.published[list(CLAIMS)].notna().all()
    out, books = tmp_path / "figures", tmp_path / "notebooks"
    books.mkdir()
    nb = {
        "cells": [{"cell_type": "markdown", "source": ["# 07 · Verdict"]}, {"cell_type": "code", "source": ['"07_x"']}]
    }
    (books / "07_x.ipynb").write_text(json.dumps(nb))
    fig = provenance(go.Figure(go.Bar(x=["a"], y=[1])), "modelled", "h100", "mk.timing")
    save_figure(fig, "07_validation", out_dir=out)
    export_table(table(), "07_validation", "modelled", "h100", "mk.timing", out)  # a figure and a table, one name
    page = write_report(out, books, claims=claims).read_text()
    assert page.count('<tr id="claim-') == len(CLAIMS) + len(measured) + len(WORKBOOK_CLAIMS)
    bound = "meets the bound" if c.error["kimi_speculative_tps"] >= 0 else "short of the bound"
    assert page.count(bound) == 1
    assert 'href="#fig-07_validation"' in page and page.index('id="claims"') < page.index('id="nb-07"')
    # the page opens with the measured answer (here: where notebook 12 would export it), then the claims with the
    # legend of every role they use
    assert page.index('id="answer"') < page.index('id="claims"') and "12_measured_answer.csv" in page
    assert all(f"<i>{html.escape(r)}</i>" in page for r in set(c.role))
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids)) and {"fig-07_validation", "table-07_validation"} <= set(ids)


def test_the_workbooks_own_claims_are_computed_with_their_setup_and_assumptions():
    """The workbook's claims have no published value and no error; each value is the timing model's now, for the
    workbook's kernel (speculation: for the setup the kernel verifies drafts in), and its kind names the model, the
    setup and the assumed costs (and speculation's K and a)."""
    from mk import timing
    from mk.analysis.claims import SPECULATION, workbook_claims
    from mk.analysis.sweeps import speculation_table
    from mk.kernel_setup import VERIFYING_KERNEL, WORKBOOK_KERNEL

    w = workbook_claims().set_index("key")
    assert list(w.index) == list(WORKBOOK_CLAIMS) and w.published.isna().all() and w.error.isna().all()
    for key, (what, model, context, users, dtype, _) in WORKBOOK_CLAIMS.items():
        kind = w.kind[key]
        setup = WORKBOOK_KERNEL if what == "fraction_of_sol" else VERIFYING_KERNEL
        assert kind.startswith("modelled (mk.timing") and setup.name in kind, key
        # where its per-op costs come from: the compiler's schedule where data/schedule keeps the plan's, else assumed
        if what == "fraction_of_sol":
            p0 = timing.predict(model, "tpu-v5e-8", context, users, dtype=dtype, setup=setup)
            assert p0.op_cost_words in kind, key
        else:  # a ratio of two steps, each from either source
            assert timing.op_costs_label("tpu") in kind, key
        if what == "fraction_of_sol":
            p = timing.predict(model, "tpu-v5e-8", context, users, dtype=dtype, setup=WORKBOOK_KERNEL)
            assert w.workbook[key] == pytest.approx(p.fraction_of_sol) and 0 < w.workbook[key] < 1, key
        else:
            k, a = SPECULATION["draft_tokens"], SPECULATION["accept_rate"]
            want = speculation_table([model], ["tpu-v5e-8"], [users], [k], [a], context).speedup.iloc[0]
            assert w.workbook[key] == pytest.approx(want) and f"{k} drafts" in kind and f"{a:g}" in kind, key
    # more users: the fixed part of the step is a smaller share, the fraction rises
    assert w.workbook["wb_moe_sol_fraction"] < w.workbook["wb_moe_sol_fraction_eight_users"]
    # more context: with no per-op cost the fixed part is a smaller share and the fraction rises; with the compiler's
    # schedule each user's loop over KV tiles issues bundles for every tile, so the issued time grows with the context
    from mk.analysis.claims import MOE
    from mk.chips import get_chip
    from mk.config import get_config
    from mk.timing import scheduled_pace, step_plan

    costs = timing.GivenCosts(op_overhead_s=0.0, dma_issue_s=0.0)
    short, long = (timing.predict(MOE, "tpu-v5e-8", n, setup=WORKBOOK_KERNEL, costs=costs) for n in (1024, 131072))
    assert short.fraction_of_sol < long.fraction_of_sol
    chip = get_chip("tpu-v5e-8")
    issued = [scheduled_pace(step_plan(get_config(MOE), chip, n, 1, "bf16", WORKBOOK_KERNEL), chip).bundles
              for n in (1024, 131072)]  # fmt: skip
    assert issued[1] > issued[0]


def test_every_claim_links_to_a_figure_or_table_a_notebook_writes():
    code = "".join(path.read_text() for path in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.ipynb"))
    claims = [*CLAIMS.values(), *(c[-1] for c in WORKBOOK_CLAIMS.values())]
    missing = [name for names in claims for name in names if f'\\"{name}\\"' not in code]
    assert not missing, missing


@pytest.mark.parametrize(
    "columns, bad",
    [
        (dict(step=[0.006], allreduce_overhead=[1e-4]), ["step", "allreduce_overhead"]),
        (dict(step_ms=[6.0], ici_ms_per_step=[0.1], overhead_ns=[640.0], compile_s=[3.0]), []),
        (dict(bytes_per_step=[1e9], step_GB=[2.0], step_vs_plain=[1.2], host_over_device=[1.3]), []),
        (dict(quantity=["step_time", "tokens_per_s"], published=[1.56e-3, 640.0]), ["published"]),
        (dict(quantity=["step_time", "tokens_per_s"], unit=["ms", "tok/s"], published=[1.56, 640.0]), []),
    ],
)
def test_an_exported_time_column_names_its_unit(tmp_path, columns, bad):
    """A float column whose name says it is a time (a step, an overhead: not a rate's "per step", a size, a ratio)
    names its unit; a table of several quantities, one a time, says each row's unit in a 'unit' column."""
    df = pd.DataFrame(columns)
    if bad:
        with pytest.raises(ValueError, match=re.escape(str(bad)) + ".*name no unit"):
            export_table(df, "01_t", "modelled", "cpu", out_dir=tmp_path)
        assert not list(tmp_path.iterdir())
    else:
        export_table(df, "01_t", "modelled", "cpu", out_dir=tmp_path)


@pytest.mark.parametrize(
    "columns, bad",
    [
        # every value of a time column under a hundredth of its unit: a quantity in the next smaller unit
        (dict(op_ms=[0.0042, 0.0011, float("nan")]), ("op_ms", "op_us", "times 1,000")),
        (dict(ici_ms_per_step=[0.003]), ("ici_ms_per_step", "ici_us_per_step", "times 1,000")),
        (dict(step_s=[0.0015, 0.0017]), ("step_s", "step_ms", "times 1,000")),
        # every value 100,000 of it or more: a quantity in the next larger unit (an integer column too)
        (dict(wait_us=[250_000, 120_000]), ("wait_us", "wait_ms", "divided by 1,000")),
        (dict(compile_ms=[1.2e5]), ("compile_ms", "compile_s", "divided by 1,000")),
        # one value in range is enough; zeros say nothing of the unit; no unit past ns or s; a rate's s is no time
        (dict(op_ms=[0.004, 0.02], overhead_ms=[0.0, 0.0], wait_us=[99_999.0, 2e5]), None),
        (dict(overhead_ns=[0.004], compile_s=[3e5], tokens_per_s=[2e5], GB_per_s=[0.001]), None),
        (dict(step_vs_plain_ms=[0.001], label=["a"]), None),
    ],
)
def test_an_exported_time_column_whose_magnitudes_betray_its_unit_is_refused(tmp_path, columns, bad):
    """A column named in ms whose every value is under 0.01 (microseconds shown in ms) is refused, naming the column
    and the name to show it under; so is the symmetric case, every value 100,000 of its unit or more."""
    df = pd.DataFrame(columns)
    if bad:
        column, shown, how = bad
        with pytest.raises(ValueError, match=rf"'01_t'.*'{column}' has every value.*show it {how} as `{shown}`"):
            export_table(df, "01_t", "modelled", "cpu", out_dir=tmp_path)
        assert not list(tmp_path.iterdir())
    else:
        export_table(df, "01_t", "modelled", "cpu", out_dir=tmp_path)


def test_a_shown_number_keeps_three_significant_figures():
    from mk.report import number_format

    three = number_format(3)
    shown = [three(x) for x in (0.004796, 0.003, 1234.5, 0.5, 0.0, 1.234e-05)]
    assert shown == ["0.00480", "0.00300", "1234.500", "0.500", "0.000", "1.23e-05"]


def test_in_ms_shows_published_seconds_in_milliseconds():
    t = pd.DataFrame(dict(quantity=["step_time", "tokens_per_s"], published=[1.56e-3, 640.0], modelled=[1.6e-3, 600.0]))
    ms = in_ms(t.assign(modelled_assumed=[1.5e-3, 610.0]))
    assert list(ms.columns) == ["quantity", "unit", "published", "modelled", "modelled_assumed"]
    assert ms.unit.tolist() == ["ms", "tok/s"] and ms.published.tolist() == pytest.approx([1.56, 640.0])
    assert ms.modelled_assumed.tolist() == pytest.approx([1.5, 610.0])  # every value column of the row, one unit
    assert in_ms(ms.assign(unit=["s", "tok/s"])).modelled.tolist() == pytest.approx([1600.0, 600.0])


def test_html_table_leaves_missing_cells_empty_in_any_column():
    """A nullable integer column with every value missing (pandas' NA, as mk.analysis.quality.quality_summary's
    first_divergence when no token diverges) is shown empty, as None and NaN are, not refused."""
    from mk.report import html_table

    df = pd.DataFrame(dict(a=[1.5, float("nan")], b=pd.array([None, None], dtype="Int64"), c=[None, "x"]))
    cells = re.findall(r"<td[^>]*>(.*?)</td>", html_table(df, 2))
    assert cells == ["1.50", "", "", "", "", "x"]


def test_long_headers_may_break_and_long_tables_fold_behind_their_csv():
    from mk.report import LONG_TABLE, html_table, table_item_html

    wide = pd.DataFrame({"seed_megakernel_v5e8_ms": [1.5], "why": ["a long reason " * 20]})
    page = html_table(wide, 3)
    assert "seed_<wbr>megakernel_<wbr>v5e8_<wbr>ms" in page  # breaks after each underscore, not across the page
    item = dict(
        type="table", name="09_x", title="x", df=pd.DataFrame({"n": range(LONG_TABLE + 5)}), kind="modelled", date="d"
    )
    long = table_item_html(item)
    assert "<details>" in long and f"show all {LONG_TABLE + 5} rows" in long and 'href="09_x.csv"' in long
    short = item | dict(df=item["df"].head(LONG_TABLE))
    assert "<details>" not in table_item_html(short)  # a short table is shown whole
