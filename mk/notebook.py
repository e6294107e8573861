"""Small helpers for the notebooks: checking papermill parameters, showing tables with a kind, and the words a
sentence uses for where its modelled steps' per-op costs came from.

No analysis here: the numbers come from ``mk.sol`` and friends.
"""

from __future__ import annotations

import html
import types
import typing

import pandas as pd


def _type_name(t) -> str:
    return getattr(t, "__name__", None) if typing.get_origin(t) is None else str(t).replace("typing.", "")


def _matches(value, t) -> bool:
    origin, args = typing.get_origin(t), typing.get_args(t)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin in (list, tuple):
        return isinstance(value, (list, tuple)) and all(_matches(v, args[0]) for v in value)
    if t is float:  # papermill and JSON write 2 for 2.0
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, t)


def check_parameters(namespace: dict, **expected) -> None:
    """Check a notebook's parameters (``globals()`` after the parameters cell) against their types.

        check_parameters(globals(), MODELS=list[str], CONTEXTS=list[int], DTYPE=str)

    A wrong type raises a TypeError naming the parameter, the type expected and the value given;
    a list parameter must not be empty.
    """
    problems = []
    for name, t in expected.items():
        if name not in namespace:
            problems.append(f"{name} is not set (expected {_type_name(t)})")
            continue
        v = namespace[name]
        if not _matches(v, t):
            problems.append(f"{name} must be {_type_name(t)}, got {v!r} ({type(v).__name__})")
        elif typing.get_origin(t) in (list, tuple) and len(v) == 0:
            problems.append(f"{name} must not be empty")
    if problems:
        raise TypeError("bad notebook parameter(s): " + "; ".join(problems))


class Table:
    """A table as a notebook shows it: its ``kind`` said once, in a caption above it, when every row has the
    same one (else in a ``kind`` column, last), numbers rounded to ``digits`` decimals (a tiny non-zero one kept
    at 3 significant figures), every row and column shown."""

    def __init__(self, df: pd.DataFrame, digits: int = 3):
        if "kind" not in df.columns:
            raise ValueError("a table shown in a notebook needs a 'kind' column (published, modelled or measured)")
        labels = [str(k) for k in dict.fromkeys(df["kind"].dropna())]
        self.labels = labels
        if len(labels) == 1 and df["kind"].notna().all():
            self.caption, self.df = f"kind: {labels[0]}", df.drop(columns="kind")
        else:
            self.caption = "kind: per row (" + ", ".join(labels) + ")"
            self.df = df[[c for c in df.columns if c != "kind"] + ["kind"]]
        self.digits = digits

    def _repr_html_(self) -> str:
        # mk.report here, not at the top: it loads the claims table's analysis (JAX, the timing model), seconds a
        # notebook that only shows tables should not pay at its first import
        from .report import html_table

        body = html_table(self.df, self.digits)
        return f'<p style="margin:0.2em 0;font-size:0.9em;color:#444"><b>{html.escape(self.caption)}</b></p>{body}'

    def __repr__(self) -> str:
        from .report import number_format

        fmt = number_format(self.digits)
        numbers = {c: fmt for c in self.df.columns if _is_float(self.df[c])}
        return self.caption + "\n" + self.df.to_string(index=False, formatters=numbers)


def _is_float(col: pd.Series) -> bool:
    return pd.api.types.is_float_dtype(col)


def show(
    df: pd.DataFrame,
    kind: str | None = None,
    digits: int = 3,
    export: str | None = None,
    hardware: str | None = None,
    source: str | None = None,
) -> None:
    """Display ``df`` whole (no rows or columns elided) and rounded, with its kind (``kind``, or its ``kind``
    column) in a caption above it when every row has the same one, else in a ``kind`` column last
    (:class:`Table`). Every table a notebook shows says whether its numbers are published, modelled or
    measured.

    With ``export`` (a name starting with the notebook's number, ``"04_straggler_cost"``) the table is also
    written to ``figures/`` for the report page (:func:`mk.report.export_table`, to 4 significant figures): its
    kind is the kinds its ``kind`` column names, ``hardware`` is required, its caption goes with it into its
    ``.meta.json`` (a constant ``kind`` column is not repeated in the CSV), and ``source`` defaults to the kind
    label (or says the kind is given per row, when the rows differ). Returns nothing (a cell that ends with it
    shows the table once)."""
    if kind is not None:
        df = df.assign(kind=kind)
    table = Table(df, digits)
    if export is not None:
        from .figures import KINDS
        from .report import export_table, kinds_named

        labels = table.labels
        if source is None and len(labels) > 1:
            source = "per row, in the kind column"
        elif source is None and labels and labels[0] not in KINDS:
            source = labels[0]
        export_table(table.df, export, kinds_named(labels), hardware, source, digits=digits, caption=table.caption)
    from IPython.display import display

    display(table)


UNITS = {"step_time": "s", "knockout_time": "s", "tokens_per_s": "tok/s", "fraction_of_sol": "", "speedup": "x"}


def in_ms(df: pd.DataFrame, columns=("published", "modelled", "modelled_assumed", "measured")) -> pd.DataFrame:
    """``df`` with its rows in seconds (``unit`` "s", or without a unit column a time ``quantity``) shown in
    milliseconds: ``columns`` times 1,000, unit "ms" (a unit column is added after ``quantity`` where missing)."""
    out = df.copy()
    if "unit" not in out.columns:
        out.insert(out.columns.get_loc("quantity") + 1, "unit", out["quantity"].map(UNITS).fillna(""))
    seconds = out["unit"] == "s"
    for c in columns:
        if c in out.columns:
            out[c] = out[c].astype(float).where(~seconds, out[c] * 1e3)
    out["unit"] = out["unit"].where(~seconds, "ms")
    return out


def with_unit(x: float, unit: str) -> str:
    """``x`` to 4 significant figures and its unit (a row's ``unit`` column; none for a fraction)."""
    return f"{x:.4g}" + (f" {unit}" if unit else "")


# Where a modelled megakernel step's per-op costs came from, in a sentence: a table's ``op_costs`` column holds
# mk.timing.predict's (``compiler-scheduled`` or ``assumed``), "-" where a row has none (the general stack, the speed
# of light).
NO_OP_COSTS = "-"


def op_cost_sources(*columns) -> str:
    """The distinct sources of per-op costs in ``columns`` (``op_costs`` columns, or any iterables of their values),
    sorted and joined with "and" (``"assumed and compiler-scheduled"``); rows without per-op costs ("-") left out,
    and "none" when no row has any."""
    found = set().union(*map(set, columns)) - {NO_OP_COSTS}
    return " and ".join(sorted(found)) or "none"


def not_like_for_like(steps: dict) -> str:
    """A clause for steps set side by side (a name -> its ``op_costs``) whose per-op costs came from different
    sources, saying which and that they are not like for like: ``" (per-op costs whole assumed, split
    compiler-scheduled: not like for like)"``; nothing ("") when they all came from one source."""
    if len(set(steps.values())) < 2:
        return ""
    return f" (per-op costs {', '.join(f'{k} {v}' for k, v in steps.items())}: not like for like)"
