"""Small helpers for the notebooks: checking papermill parameters and showing tables with a kind.

No analysis here: the numbers come from ``mk.sol`` and friends.
"""

from __future__ import annotations

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


def show(
    df: pd.DataFrame,
    kind: str | None = None,
    digits: int = 3,
    export: str | None = None,
    hardware: str | None = None,
    source: str | None = None,
) -> None:
    """Display ``df`` whole (no rows or columns elided) and rounded, with its ``kind`` column last (set to
    ``kind`` when given). Every table a notebook shows says whether its numbers are published, modelled or
    measured.

    With ``export`` (a name starting with the notebook's number, ``"04_straggler_cost"``) the table is also
    written to ``figures/`` for the report page (:func:`mk.report.export_table`, full precision): its kind is
    the kinds its ``kind`` column names, ``hardware`` is required, and ``source`` defaults to the ``kind``
    column's label (or says the kind is given per row, when the rows differ)."""
    if kind is not None:
        df = df.assign(kind=kind)
    if "kind" not in df.columns:
        raise ValueError("a table shown in a notebook needs a 'kind' column (published, modelled or measured)")
    df = df[[c for c in df.columns if c != "kind"] + ["kind"]]
    if export is not None:
        from .figures import KINDS
        from .report import export_table, kinds_named

        labels = [str(k) for k in df["kind"].dropna().unique()]
        if source is None and len(labels) > 1:
            source = "per row, in the kind column"
        elif source is None and labels and labels[0] not in KINDS:
            source = labels[0]
        export_table(df, export, kinds_named(labels), hardware, source, digits=digits)
    df = df.round(digits)
    from IPython.display import display

    with pd.option_context(
        "display.max_rows", None, "display.max_columns", None, "display.width", None, "display.max_colwidth", None
    ):
        display(df)
