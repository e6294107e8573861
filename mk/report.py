"""The report page: every exported figure and table in one offline HTML page, ``figures/index.html``.

Figures are exported by :func:`mk.figures.save_figure` (``NAME.html``, ``NAME.json``, ``NAME.png``), tables
by :func:`export_table` (``NAME.csv`` and its provenance, ``NAME.meta.json``). Every name starts with the
number of the notebook that wrote it (``01_sol_by_chip``). :func:`write_report` gathers them by notebook,
each with its kind (published, modelled, measured), hardware, source and date, into one page that needs no
network: PNGs and interactive pages are relative links to the files beside it, and there is no script.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import re
from pathlib import Path

import pandas as pd

from .analysis.answer import answer_sentence
from .analysis.claims import claims_table
from .analysis.copies_floor import floor_sentence
from .analysis.moe_one_user import layers_past_bytes, moe_one_user, moe_sentence, revision_changes
from .figures import FOOTER_NAME, KINDS
from .files import git_commit, write_atomic
from .paths import NOTEBOOKS_DIR, figures_dir
from .published import bound_words
from .units import SIGNIFICANT, significant as significant_figures

REPORT_NAME = "index.html"
NAME = re.compile(r"(\d\d)_[A-Za-z0-9_-]+")  # NN_name: the notebook's number, then a plain file name
META_SUFFIX = ".meta.json"
LONG_TABLE = 25  # rows beyond which the page folds a table away behind its row count (its CSV holds every row)
# A time column names its unit: one of these among the words of its name (``step_ms``, ``ici_ms_per_step``).
TIME_UNITS = ("s", "ms", "us", "ns")
# Words that make a column a time (a word after "per" names a rate's denominator, not the column's quantity) ...
TIME_WORDS = {"time", "step", "seconds", "latency", "overhead", "elapsed", "duration", "wall", "round"}
# ... unless the column is a ratio of two times (a share, a speed-up, one over another)
RATIO_WORDS = {"vs", "over", "share", "fraction", "speedup", "ratio", "change"}
OTHER_UNITS = {"gb", "mb", "gib", "mib", "bytes", "gbps", "tbps", "gflop"}  # a size or a rate: no time
# A time column's magnitudes that betray its unit: every value (zeros and missing ones aside) under a hundredth of it,
# under 10 of the next smaller unit (microseconds shown in ms: 0.00480); or every value 100,000 of it or more, 100 of
# the next larger or more (seconds shown in ms). The unit to show it in instead, each way:
UNIT_TOO_SMALL, UNIT_TOO_LARGE = 0.01, 1e5
SMALLER_UNIT = {"s": "ms", "ms": "us", "us": "ns"}
LARGER_UNIT = {v: k for k, v in SMALLER_UNIT.items()}


def _words(column) -> list[str]:
    return [w for w in re.split(r"[_\s=-]+", str(column).lower()) if w]


def unitless_time_columns(df: pd.DataFrame) -> list[str]:
    """The float columns of ``df`` whose name says they hold a time but names no unit of :data:`TIME_UNITS`; and, in a
    table of several quantities (a ``quantity`` column), every value column when some quantity is a time and the
    table has no ``unit`` column saying each row's unit."""
    bad = []
    for c in df.columns:
        if not pd.api.types.is_float_dtype(df[c]):
            continue
        words = _words(c)
        own = [w for i, w in enumerate(words) if i == 0 or words[i - 1] != "per"]
        if set(own) & TIME_WORDS and not set(words) & (set(TIME_UNITS) | RATIO_WORDS | OTHER_UNITS):
            bad.append(str(c))
    if "quantity" in df.columns and "unit" not in df.columns:
        if any(str(q).endswith("_time") for q in df["quantity"]):
            bad += [str(c) for c in df.columns if pd.api.types.is_float_dtype(df[c]) and str(c) not in bad]
    return bad


def _time_unit(column) -> str | None:
    """The time unit a column's name gives its values (``step_ms``, ``ici_ms_per_step``: ms); None for none, for a
    rate's (``tokens_per_s``), for a ratio or a size, or for two units."""
    words = _words(column)
    if set(words) & (RATIO_WORDS | OTHER_UNITS):
        return None
    units = {w for i, w in enumerate(words) if w in TIME_UNITS and (i == 0 or words[i - 1] != "per")}
    return units.pop() if len(units) == 1 else None


def misunit_time_columns(df: pd.DataFrame) -> dict[str, tuple[str, str, float]]:
    """The number columns of ``df`` whose magnitudes betray the time unit their name gives (:data:`UNIT_TOO_SMALL`,
    :data:`UNIT_TOO_LARGE`): column -> (its unit, the unit to show it in, its largest or smallest |value|). A column
    with no value but zeros says nothing of its unit."""
    out = {}
    for c in df.columns:
        unit = _time_unit(c)
        if unit is None or not pd.api.types.is_numeric_dtype(df[c]) or pd.api.types.is_bool_dtype(df[c]):
            continue
        values = df[c].dropna().abs()
        values = values[values > 0]
        if values.empty:
            continue
        if unit in SMALLER_UNIT and values.max() < UNIT_TOO_SMALL:
            out[str(c)] = (unit, SMALLER_UNIT[unit], float(values.max()))
        elif unit in LARGER_UNIT and values.min() >= UNIT_TOO_LARGE:
            out[str(c)] = (unit, LARGER_UNIT[unit], float(values.min()))
    return out


def _renamed(column: str, unit: str, shown: str) -> str:
    """``column`` with its unit word ``unit`` (not a rate's) replaced by ``shown``: ``op_ms`` -> ``op_us``."""
    words = re.split(r"([_\s=-]+)", column)
    for i, w in enumerate(words):
        if w.lower() == unit and (i < 2 or words[i - 2].lower() != "per"):
            words[i] = shown
            break
    return "".join(words)


def check_units(df: pd.DataFrame, name: str) -> None:
    """Refuse a table whose time columns do not say their unit (:func:`unitless_time_columns`), or whose magnitudes
    betray the unit they say (:func:`misunit_time_columns`)."""
    bad = unitless_time_columns(df)
    if bad:
        raise ValueError(
            f"table {name!r}: the time column(s) {bad} name no unit; put it in the name ({', '.join(TIME_UNITS)}: "
            "step_ms, overhead_ns), or give a table of several quantities a 'unit' column"
        )
    wrong = misunit_time_columns(df)
    if wrong:
        said = []
        for c, (unit, shown, x) in wrong.items():
            if shown == SMALLER_UNIT.get(unit):
                how = f"every value under {UNIT_TOO_SMALL:g} {unit} (the largest {x:.3g})"
                fix = f"times 1,000 as `{_renamed(c, unit, shown)}`"
            else:
                how = f"every value {UNIT_TOO_LARGE:,.0f} {unit} or more (the smallest {x:.4g})"
                fix = f"divided by 1,000 as `{_renamed(c, unit, shown)}`"
            said.append(f"{c!r} has {how}: a quantity in {shown} shown in {unit}; show it {fix}")
        raise ValueError(f"table {name!r}: " + "; ".join(said))


def check_name(name: str) -> str:
    """The notebook number of an export name (``"01"`` for ``01_sol_table``); a ValueError otherwise."""
    m = NAME.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(
            f"an exported name must start with its notebook's two-digit number and an underscore, then only "
            f"letters, digits, '_' or '-' (e.g. '01_sol_table'), got {name!r}"
        )
    return m.group(1)


def check_kind(kind: str) -> str:
    """``kind`` if it is one of :data:`mk.figures.KINDS` or several joined by ``" + "``; a ValueError otherwise."""
    if not isinstance(kind, str) or not kind or any(k not in KINDS for k in kind.split(" + ")):
        raise ValueError(f"kind must be one of {KINDS}, or several joined by ' + ', got {kind!r}")
    return kind


def kinds_named(texts) -> str:
    """The kinds that free-text ``kind`` labels name (a table's ``kind`` column), in :data:`KINDS` order,
    joined by ``" + "``: ``"measured (cpu, JAX 0.6); seed_* published"`` gives ``"published + measured"``."""
    texts = [str(t) for t in texts]
    # a kind said not to apply ("given, not measured") is not named
    found = [k for k in KINDS if any(re.search(rf"(?<!not )\b{k}\b", t) for t in texts)]
    if not found:
        raise ValueError(f"the kind labels {sorted(set(texts))} name none of {KINDS}")
    return " + ".join(found)


def export_table(
    df: pd.DataFrame,
    name: str,
    kind: str,
    hardware: str,
    source: str | None = None,
    out_dir: Path | None = None,
    digits: int | None = None,
    caption: str | None = None,
    significant: int = SIGNIFICANT,
) -> list[Path]:
    """Write ``figures/NAME.csv`` (the table, every float to ``significant`` figures: a small value keeps its
    own) and ``NAME.meta.json`` (its kind, hardware, source, date, columns, the decimals it is shown with and
    the caption it is shown under, e.g. ``"kind: modelled (mk.sol)"``), each atomically, in ``out_dir`` if
    given, else :func:`mk.paths.figures_dir` ($MK_FIGURES_DIR, else ``figures/``). Returns both paths.

    ``kind`` is one of :data:`mk.figures.KINDS` or several joined by ``" + "``; ``name`` starts with the
    notebook's number (``"04_straggler_cost"``)."""
    check_name(name)
    check_kind(kind)
    if not isinstance(hardware, str) or not hardware.strip():
        raise ValueError(f"table {name!r} needs its hardware (a chip, a slice, this machine's device, or 'any chip')")
    if isinstance(df.index, pd.MultiIndex) or df.index.name is not None:
        df = df.reset_index()  # a meaningful (named) index becomes columns, as the notebook shows it
    else:
        df = df.reset_index(drop=True)  # a filtered table's row numbers are no column
    check_units(df, name)
    out = Path(out_dir) if out_dir is not None else figures_dir()
    df = df.assign(**{c: df[c].map(lambda x: significant_figures(x, significant)) for c in df.columns
                      if pd.api.types.is_float_dtype(df[c])})  # fmt: skip
    csv = write_atomic(out / f"{name}.csv", lambda tmp: df.to_csv(tmp, index=False))
    meta = {
        "name": name,
        "kind": kind,
        "hardware": hardware,
        "source": source,
        "date": datetime.date.today().isoformat(),
        "columns": [str(c) for c in df.columns],
        "rows": len(df),
        "digits": digits,
        "caption": caption,
        "significant": significant,
    }
    text = json.dumps(meta, indent=1, ensure_ascii=False) + "\n"
    side = write_atomic(out / f"{name}{META_SUFFIX}", lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return [csv, side]


# Reading what the notebooks exported. ---------------------------------------------------------------
def _plain(text) -> str:
    """Plotly's label markup (``<br>``, ``<b>``, entities) as plain text."""
    text = re.sub(r"<br\s*/?>", " ", str(text or ""))
    return html.unescape(re.sub(r"<[^>]+>", "", text)).strip()


def _date(path: Path) -> str:
    return datetime.date.fromtimestamp(path.stat().st_mtime).isoformat()


def _notebooks(notebooks_dir: Path) -> dict[str, dict]:
    """``{"01": {"file": "01_speed_of_light.ipynb", "title": ..., "source": all code}}`` for every notebook."""
    books = {}
    for path in sorted(Path(notebooks_dir).glob("[0-9][0-9]_*.ipynb")):
        number = path.name[:2]
        if number in books:
            continue
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])

        def text(c):
            return "".join(c.get("source", [])) if isinstance(c.get("source"), list) else c.get("source", "")

        headings = [
            line.lstrip("#").strip()
            for c in cells
            if c.get("cell_type") == "markdown"
            for line in text(c).splitlines()
            if line.startswith("#")
        ]
        code = "\n".join(text(c) for c in cells if c.get("cell_type") == "code")
        books[number] = dict(file=path.name, title=headings[0] if headings else path.stem, source=code)
    return books


def _figure(path: Path) -> dict:
    layout = json.loads(path.read_text(encoding="utf-8")).get("layout", {})
    title = layout.get("title")
    title = title.get("text") if isinstance(title, dict) else title
    footers = [a.get("text") for a in layout.get("annotations", []) if a.get("name") == FOOTER_NAME]
    parts = _plain(footers[0]).split(" · ", 2) if footers else []
    name = path.stem
    return dict(
        type="figure",
        name=name,
        title=_plain(title) or name,
        kind=parts[0] if parts else None,
        hardware=parts[1] if len(parts) > 1 else None,
        source=parts[2] if len(parts) > 2 else None,
        date=_date(path),
        png=(path.parent / f"{name}.png").exists(),
        interactive=(path.parent / f"{name}.html").exists(),
    )


def _table(path: Path) -> dict:
    name = path.name[: -len(META_SUFFIX)]
    meta = json.loads(path.read_text(encoding="utf-8"))
    df = pd.read_csv(path.parent / f"{name}.csv")
    return dict(
        type="table",
        name=name,
        title=name[3:].replace("_", " "),
        df=df,
        **{k: meta.get(k) for k in ("kind", "hardware", "source", "date", "digits", "caption")},
    )


def _collect(figures_dir: Path, books: dict) -> tuple[dict[str, list[dict]], list[str]]:
    """Figures and tables by notebook number, in the order the notebook writes them; and what was left out."""
    items: dict[str, list[dict]] = {}
    left_out = []
    specs = [(p, _figure) for p in figures_dir.glob("*.json") if not p.name.endswith(META_SUFFIX)]
    specs += [(p, _table) for p in figures_dir.glob(f"*{META_SUFFIX}")]
    for path in sorted(figures_dir.glob("*.csv")):
        if not path.with_name(path.stem + META_SUFFIX).exists():
            left_out.append(f"{path.name} (no {path.stem}{META_SUFFIX}: its provenance is unknown)")
    for path, read in sorted(specs, key=lambda spec: spec[0].name):
        stem = path.name[: -len(META_SUFFIX)] if read is _table else path.stem
        m = NAME.fullmatch(stem)
        if m is None:
            left_out.append(f"{path.name} (its name does not start with a notebook's number)")
            continue
        if m.group(1) not in books:
            left_out.append(f"{path.name} (no notebook numbered {m.group(1)} in notebooks/)")
            continue
        try:
            item = read(path)
        except (OSError, ValueError, KeyError) as e:  # a CSV gone missing, a file that is not JSON
            left_out.append(f"{path.name} (unreadable: {type(e).__name__}: {e})")
            continue
        items.setdefault(m.group(1), []).append(item)
    for number, group in items.items():
        code = books[number]["source"]
        for item in group:  # where the notebook's code names it; a name it never spells out may be stale
            item["at"] = code.find(f'"{item["name"]}"')
        group.sort(key=lambda item: (item["at"] if item["at"] >= 0 else math.inf, item["name"]))
    return items, left_out


def _value(x: float, unit: str) -> str:
    """A claim's value as a reader writes it: 1.56 ms, 640 tok/s, 77%, 7.8 GB, 1,494 kernels, 3.7x."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "none"
    if unit == "s":
        return f"{x * 1e3:.3g} ms"
    if unit == "B":
        return f"{x / 1e9:.3g} GB"
    if unit == "":
        return f"{x:.1%}"
    if unit == "x":
        return f"{x:.3g}x"
    return f"{x:,.4g} {unit}"


def _claims_html(claims: pd.DataFrame, present: dict[str, str]) -> str:
    """The claims table: a row per claim (``id="claim-KEY"``), linked to the first item that shows it on the page
    (``present``: an item's name -> its anchor)."""
    rows = []
    for c in claims.itertuples():
        shown = [n for n in c.shown_in if n in present]
        link = f'<a href="#{_esc(present[shown[0]])}">{_esc(shown[0])}</a>' if shown else "not on this page"
        rows.append(
            f'<tr id="claim-{_esc(c.key)}"><td class="text">{_esc(c.claim)}<br><code>{_esc(c.key)}</code></td>'
            f'<td class="num">{"" if pd.isna(c.published) else _esc(_value(c.published, c.unit))}</td>'
            f'<td class="num">{_esc(_value(c.workbook, c.unit))}</td><td class="text">{_esc(c.kind)}</td>'
            f'<td class="text">{_esc(c.role)}</td><td class="text">{_esc(c.op_costs)}</td>'
            f'<td class="num">{_esc(_error_words(c.error, c.role))}</td><td class="text">{link}</td></tr>'
        )
    head = "".join(
        f"<th>{h}</th>" for h in ("claim", "published", "workbook", "kind", "role", "per-op costs", "error", "shown in")
    )
    return (
        "<h2 id=\"claims\">The write-up's claims against the workbook, and the workbook's own</h2>"
        '<p class="meta">Each claim of the write-up (<code>data/published.csv</code>): its published value, the value '
        "this workbook computes or measures for it, and the error workbook / published - 1. Where one TPU v5e measured "
        "a claim, the measured row (key ending <code>_measured</code>) stands right below its modelled twin, its "
        "scope and date in its kind. Then the workbook's own claims, with no published value and so no error.</p>"
        f"{_definitions(claims)}"
        f'<div class="scroll"><table class="data claims"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
        "</table></div>"
    )


# notebook 12's table of the measured answer (mk.analysis.answer), which the page opens with
ANSWER = "12_measured_answer"
ANSWER_SHOWN = ["model", "dtype", "context", "batch", "megakernel_ms", "xla_ms", "speedup",
                "megakernel_fraction_of_limit", "xla_fraction_of_limit", "note", "date", "kernel_revision"]  # fmt: skip


def _answer_html(folder: Path) -> str:
    """The page's opening: the measured answer's sentence (mk.analysis.answer.answer_sentence, computed from the rows
    notebook 12 exported) above those rows; a line saying where it would come from when notebook 12 has not run."""
    path = folder / f"{ANSWER}.csv"
    if not path.exists():
        return (f'<h2 id="answer">The measured answer</h2><p class="meta">Not here: notebook 12 exports it '
                f"(<code>{ANSWER}.csv</code>) from data/measured/tpu.csv.</p>")  # fmt: skip
    t = pd.read_csv(path)
    meta = json.loads((folder / f"{ANSWER}{META_SUFFIX}").read_text(encoding="utf-8"))
    return (
        '<h2 id="answer">The measured answer: what one kernel a step buys on a TPU</h2>'
        f'<p class="answer">{_esc(answer_sentence(t))}</p>'
        f'<p class="meta">A row a cell both engines ran on the chip ({len(t)}; every column in '
        f'<a href="{ANSWER}.csv">{ANSWER}.csv</a>, drawn in <a href="#fig-{ANSWER}">its figure</a>): '
        f'{_esc(meta.get("source") or "")}. <span class="kind measured">measured</span> on '
        f"{_esc(meta['hardware'])}.</p>"
        f'<div class="scroll">{html_table(t[[c for c in ANSWER_SHOWN if c in t]], 3)}</div>' + _moe_html(folder)
    )


MOE = "12_moe_one_user"  # notebook 12's MoE cells at one user, at one and several steps a call


def _moe_html(folder: Path) -> str:
    """The MoE one-user gap (mk.analysis.moe_one_user.moe_sentence, computed from the rows notebook 12 exported), or
    nothing where notebook 12 has not exported them."""
    path = folder / f"{MOE}.csv"
    if not path.exists():
        return ""
    rows = pd.read_csv(path)
    sentence = moe_sentence(moe_one_user(rows), layers_past_bytes(rows), revision_changes(rows))
    return (
        f'<p class="answer">{_esc(sentence)}</p>'
        f'<p class="meta">Every row in <a href="{MOE}.csv">{MOE}.csv</a>, drawn in <a href="#fig-{MOE}">its '
        "figure</a>.</p>" + _copies_html(folder)
    )


COPIES = ("12_copies_floor", "12_copies_by_component", "12_kernel_switch")  # notebook 12: the kernel beside its copies


def _copies_html(folder: Path) -> str:
    """What each MoE cell's kernel takes past its copies alone (mk.analysis.copies_floor.floor_sentence, computed from
    the rows notebook 12 exported), or nothing where it has not exported them."""
    paths = [folder / f"{name}.csv" for name in COPIES]
    if not paths[0].exists():
        return ""
    floor, parts, switched = (pd.read_csv(p) if p.exists() else pd.DataFrame() for p in paths)
    parts = parts if not parts.empty else pd.DataFrame(columns=["model", "part", "core_us"])
    sentence = floor_sentence(floor, parts, switched)
    return (
        f'<p class="answer">{_esc(sentence)}</p>'
        f'<p class="meta">Every row in <a href="{COPIES[0]}.csv">{COPIES[0]}.csv</a> and '
        f'<a href="{COPIES[1]}.csv">{COPIES[1]}.csv</a>, drawn in <a href="#fig-{COPIES[0]}">its figure</a>; each '
        f'kernel switch in <a href="{COPIES[2]}.csv">{COPIES[2]}.csv</a>, drawn in <a href="#fig-{COPIES[2]}">its '
        "figure</a>.</p>"
    )


# What each kind and role of a claims row means, as the table's legend (only those present are listed).
KIND_WORDS = {
    "modelled": "computed here from a model of the hardware (mk.sol, mk.routing, mk.timing); its kind names the model "
    "and setup",
    "measured": "timed on the chip named, on the date given (data/measured/); a measured + modelled row adds a "
    "modelled part, named in it",
    "fitted": "the model was fitted to this very number: met by design, a test of nothing",
    "input": "the number is an input of the model: met by design",
    "derived": "a ratio of two other claims, named in it",
}
ROLE_WORDS = {
    "test": "a test of the workbook: the model against a published number it was not fitted to",
    "test (baseline fitted)": "a test whose general-stack side is a fitted point",
    "fitted": "a point the model was fitted to (data/timing.csv), not a test",
    "fitted (megakernel step)": "its megakernel side is the point a GPU cost per op was fitted to, not a test",
    "input": "an input of the model, not a test",
    "derived": "a ratio of two other rows",
    "bound": "a published 'over' or 'under' figure, compared as a bound: the error says how far past or short",
    "measured": "measured on a chip: a check of the published number in the scope its kind states",
    "measured, another comparison": "measured, against another baseline than the claim's (its kind says which): no "
    "error",
    "workbook's own": "the workbook's own claim: no published value, so no error",
}


def _definitions(claims: pd.DataFrame) -> str:
    """The legend above the claims table: the kinds and roles its rows use, each in a line, and the per-op costs."""
    kind, role = (claims.get(c, pd.Series(dtype=str)).astype(str) for c in ("kind", "role"))
    kinds = [k for k in KIND_WORDS if kind.str.startswith(k).any()]
    roles = [r for r in ROLE_WORDS if (role == r).any()]
    others = sorted(set(role) - set(ROLE_WORDS))
    items = [f"<li><b>{_esc(k)}</b>: {_esc(KIND_WORDS[k])}</li>" for k in kinds]
    items += [f"<li>role <i>{_esc(r)}</i>: {_esc(ROLE_WORDS[r])}</li>" for r in roles]
    items += [f"<li>role <i>{_esc(r)}</i>: as its kind says</li>" for r in others]
    items.append("<li><i>per-op costs</i>: where a timed step's core costs come from (compiler-scheduled: libtpu's "
                 "schedule of the kernel; assumed or fitted: data/timing.csv; '-': none enters)</li>")  # fmt: skip
    return f'<ul class="meta definitions">{"".join(items)}</ul>'


def _error_words(error: float, role: str) -> str:
    """A claim's error as the table shows it: workbook / published - 1, or for a bound how far past or short of it."""
    if pd.isna(error):
        return ""
    if role == "bound":
        return bound_words(error)
    return "0.0%" if abs(error) < 5e-4 else f"{error:+.1%}"


def anchor(item: dict) -> str:
    """An item's id on the page: ``fig-NAME`` or ``table-NAME`` (a figure and a table may share a name)."""
    return f"{'fig' if item['type'] == 'figure' else 'table'}-{item['name']}"


# The page. ---------------------------------------------------------------------------------------------
CSS = """
body { font-family: "DejaVu Sans", Arial, sans-serif; font-size: 15px; color: #222; max-width: 1100px;
       margin: 2em auto; padding: 0 1em; line-height: 1.45; }
h1 { font-size: 1.6em; margin-bottom: 0.2em; } h2 { margin-top: 2.2em; border-bottom: 1px solid #ccc; }
h3 { margin: 1.6em 0 0.3em; font-size: 1.1em; }
.meta, .prov { color: #555; font-size: 0.9em; }
.caption { font-weight: bold; font-size: 0.9em; margin: 0.3em 0 0; color: #444; }
.kind { font-weight: bold; padding: 0 0.35em; border-radius: 3px; background: #eee; }
.published { background: #e3ecf6; } .modelled { background: #fbe8d5; } .measured { background: #e2f0df; }
img { max-width: 100%; border: 1px solid #ddd; }
.item { margin-bottom: 2em; }
.scroll { overflow-x: auto; max-width: 100%; }
table.data { border-collapse: collapse; font-size: 0.85em; margin: 0.4em 0; }
table.data th, table.data td { border-bottom: 1px solid #e4e4e4; padding: 0.2em 0.6em; vertical-align: top; }
table.data th { background: #f4f4f4; }
.answer { font-size: 1.1em; border-left: 4px solid #4c78a8; padding-left: 0.8em; }
.num { text-align: right; white-space: nowrap; } .text { text-align: left; }
table.data th, table.data th.num { white-space: normal; overflow-wrap: normal; }
table.data td.text { min-width: 6em; max-width: 30em; overflow-wrap: anywhere; }
details > summary { cursor: pointer; color: #555; font-size: 0.9em; }
ul.toc { columns: 2; }
""".strip()


def _esc(x) -> str:
    return html.escape(str(x), quote=True)


def _kind(kind: str | None) -> str:
    if not kind:
        return '<span class="kind">no provenance</span>'
    return " + ".join(f'<span class="kind {_esc(k)}">{_esc(k)}</span>' for k in kind.split(" + "))


def _provenance(item: dict) -> str:
    parts = [_kind(item["kind"])] + [_esc(item[k]) for k in ("hardware", "source") if item.get(k)]
    parts.append(f"written {_esc(item['date'])}")
    if item.get("at", 0) < 0:
        parts.append("<em>its name is not in the notebook's code: it may be left from an older version</em>")
    return f'<p class="prov">{" · ".join(parts)}</p>'


SHOWN_FIGURES = 3  # a shown float keeps at least this many significant figures


def number_format(digits: int):
    """Show a float with ``digits`` decimals (as the notebook did), more where it needs them to keep
    :data:`SHOWN_FIGURES` significant figures (0.004796 with 3 decimals: 0.00480); one under a thousandth in
    scientific notation (1.23e-05)."""

    def fmt(x):
        if _missing(x):  # None, NaN, and pandas' NA (a nullable integer column with every value missing)
            return ""
        if x == 0 or not math.isfinite(x):
            return f"{x:.{digits}f}"
        if abs(x) < 1e-3:
            return f"{x:.{SHOWN_FIGURES}g}"
        needed = SHOWN_FIGURES - 1 - math.floor(math.log10(abs(x)))
        return f"{x:.{max(digits, needed)}f}"

    return fmt


def _missing(x) -> bool:
    """A cell with nothing in it (None, NaN, NA); a cell holding a list or tuple is not missing."""
    return pd.api.types.is_scalar(x) and bool(pd.isna(x))


def header(name) -> str:
    """A column's name as a table header that may break after each underscore (``seed_megakernel_v5e8_ms`` over three
    lines), so a table of long names fits the page instead of running off it."""
    return "_<wbr>".join(_esc(part) for part in str(name).split("_"))


def html_table(df: pd.DataFrame, digits: int | None) -> str:
    """``df`` as an HTML table: numbers right-aligned and rounded as the notebook showed them, text left-aligned."""
    digits = 3 if digits is None else digits
    columns = []
    for c in df.columns:
        col = df[c]
        if pd.api.types.is_bool_dtype(col) or not pd.api.types.is_numeric_dtype(col):
            columns.append(("text", lambda x: "" if _missing(x) else str(x)))
            continue
        values = col.dropna()
        whole = len(values) > 0 and bool((values == values.round()).all()) and bool((values.abs() < 1e15).all())
        columns.append(("num", (lambda x: "" if _missing(x) else f"{x:.0f}") if whole else number_format(digits)))
    head = "".join(f'<th class="{cls}">{header(c)}</th>' for c, (cls, _) in zip(df.columns, columns))
    rows = [
        "<tr>" + "".join(f'<td class="{cls}">{_esc(fmt(x))}</td>' for x, (cls, fmt) in zip(row, columns)) + "</tr>"
        for row in df.itertuples(index=False)
    ]
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def _figure_html(item: dict) -> str:
    name = _esc(item["name"])
    links = [f'<a href="{name}.html">interactive</a>'] if item["interactive"] else []
    links.append(f'<a href="{name}.json">plotly JSON</a>')
    if item["png"]:
        links.append(f'<a href="{name}.png">PNG</a>')
        body = f'<a href="{name}.png"><img src="{name}.png" alt="{_esc(item["title"])}" loading="lazy"></a>'
    else:
        body = '<p class="meta">no PNG (written without a Chromium): open the interactive page.</p>'
    return (
        f'<div class="item" id="{anchor(item)}"><h3>{_esc(item["title"])}</h3>'
        f'<p class="meta">figure <code>{name}</code> · {" · ".join(links)}</p>{body}{_provenance(item)}</div>'
    )


def table_item_html(item: dict) -> str:
    """A table of the report (``item``: its name, title, frame, kind and date) as HTML: its kind above it, a long one
    folded behind its first rows and a link to its CSV."""
    name, df = _esc(item["name"]), item["df"]
    if "kind" in df.columns and df["kind"].nunique(dropna=False) == 1:
        label = str(df["kind"].iloc[0])
        if label in KINDS or label == item.get("source"):  # said once in the provenance line below the table
            df = df.drop(columns="kind")
    caption = f'<p class="caption">{_esc(item["caption"])}</p>' if item.get("caption") else ""
    body = f'<div class="scroll">{html_table(df, item.get("digits"))}</div>'
    if len(df) > LONG_TABLE:  # a long table folded away (no script: HTML's own details), the CSV linked above it
        body = f"<details><summary>show all {len(df)} rows (or open the CSV)</summary>{body}</details>"
    return (
        f'<div class="item" id="{anchor(item)}"><h3>Table: {_esc(item["title"])}</h3>'
        f'<p class="meta">table <code>{name}</code> · {len(item["df"])} rows · <a href="{name}.csv">CSV</a></p>'
        f"{caption}{body}{_provenance(item)}</div>"
    )


def write_report(
    out_dir: Path | None = None, notebooks_dir: Path = NOTEBOOKS_DIR, claims: pd.DataFrame | bool = True
) -> Path:
    """Write ``index.html`` in ``out_dir`` (else :func:`mk.paths.figures_dir`: $MK_FIGURES_DIR, else
    ``figures/``): first the write-up's claims against the workbook (:func:`claims_table`, computed here unless
    ``claims`` is the table already, or False for none), each linked to where it is shown; then per notebook
    (its number, file and first heading), every figure (its title, PNG, interactive page, provenance footer)
    and every exported table (rounded as the notebook showed it, with its caption, kind, hardware, source and
    date), in the order the notebook writes them. Files whose number matches no notebook in ``notebooks_dir``
    are left out and listed. Every id on the page is unique. Returns the page's path."""
    folder, notebooks_dir = Path(out_dir) if out_dir is not None else figures_dir(), Path(notebooks_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"no figures folder at {folder}: run the notebooks first (bash ci/main.sh)")
    books = _notebooks(notebooks_dir)
    items, left_out = _collect(folder, books)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    commit = git_commit()
    n_fig = sum(i["type"] == "figure" for g in items.values() for i in g)
    n_tab = sum(i["type"] == "table" for g in items.values() for i in g)
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>mk: figures and tables</title>",
        f"<style>\n{CSS}\n</style></head><body>",
        "<h1>mk: figures and tables</h1>",
        f'<p class="meta">Generated {now} from commit <code>{_esc(commit or "unknown (no git)")}</code>; '
        f"{n_fig} figures and {n_tab} tables from {len(items)} notebooks. Every item says whether its numbers are "
        f"{_kind('published')} (the write-up's numbers and chip specs, with their source), {_kind('modelled')} "
        f"(computed here from a model of the hardware) or {_kind('measured')} (timed by this code on the "
        "hardware named), on what hardware, and when it was written.</p>",
    ]
    out.append(_answer_html(folder))
    if claims is not False:
        table = claims_table() if claims is True else claims
        present = {}
        for i in sorted((i for g in items.values() for i in g), key=lambda i: i["type"] != "figure"):
            present.setdefault(i["name"], anchor(i))  # a figure before a table of the same name
        out.append(_claims_html(table, present))
    out.append('<ul class="toc">')
    for number, group in sorted(items.items()):
        book = books[number]
        out.append(f'<li><a href="#nb-{number}">{_esc(book["title"])}</a> ({len(group)})</li>')
    out.append("</ul>")
    for number, group in sorted(items.items()):
        book = books[number]
        out.append(f'<h2 id="nb-{number}">{_esc(book["title"])}</h2>')
        out.append(f'<p class="meta">notebook <code>notebooks/{_esc(book["file"])}</code></p>')
        out += [_figure_html(i) if i["type"] == "figure" else table_item_html(i) for i in group]
    if left_out:
        out.append("<h2>Left out</h2><ul>" + "".join(f"<li>{_esc(x)}</li>" for x in left_out) + "</ul>")
    out.append("</body></html>\n")
    page = "\n".join(out)
    return write_atomic(folder / REPORT_NAME, lambda tmp: tmp.write_text(page, encoding="utf-8"))
