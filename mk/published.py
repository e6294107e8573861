"""The seed's published numbers, read from ``data/published.csv`` (each row names its source), and independent
published decode measurements from ``data/independent.csv`` (each row with its page and a quoted sentence).

They are compared against, never used as results.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path

import pandas as pd

from .chips import get_chip
from .config.presets import PRESETS
from .paths import CONFIGS_DIR, INDEPENDENT_CSV, PUBLISHED_CSV


@lru_cache(maxsize=None)
def published_table() -> pd.DataFrame:
    return pd.read_csv(PUBLISHED_CSV)


def published(key: str) -> float:
    """One published value by its key (``sol_h100``, ``vllm_h100_moe_tps``, ...)."""
    t = published_table()
    row = t[t["key"] == key]
    if row.empty:
        raise KeyError(f"no published value {key!r} in {PUBLISHED_CSV.name}; keys: {', '.join(t['key'])}")
    return float(row["value"].iloc[0])


# ---------------------------------------------------------------------------------------------------------------------
# Independent published decode measurements (data/independent.csv): megakernels and general stacks at one to eight
# users, each row with its page and a sentence copied from it. None is fitted to: the timing model is held to them.

INDEPENDENT_COLUMNS = (
    "key", "model", "config", "chip", "chips", "engine", "stack", "batch", "prompt_tokens", "output_tokens", "dtype",
    "quantity", "value", "unit", "bound", "date", "url", "quote", "note",
)  # fmt: skip
BOUNDS = ("", "upper", "lower")  # a value the page gives as a bound ("under one millisecond": upper), or as it is
ENGINES = ("megakernel", "general")

MAX_BATCH = 8  # the file's scope: one to eight users decoded together
# quantity -> unit -> milliseconds per unit. step_ms: time per output token per user; tokens_per_s: tokens per second
# per user (step_ms = 1000 / value); request_latency: end-to-end time of one batch, its prompt's prefill included, for
# output_tokens tokens (step_ms = value in ms / output_tokens, which slightly overstates the decode step).
QUANTITY_UNITS = {
    "step_ms": {"ms": 1.0, "us": 1e-3, "s": 1e3},
    "tokens_per_s": {"tok/s": None},
    "request_latency": {"ms": 1.0, "s": 1e3},
}


def bound_words(error: float) -> str:
    """A value set against a published lower bound (``error``: value / bound - 1), in words: how far past the bound
    it is, or how far short of it."""
    return f"meets the bound (+{error:.1%})" if error >= 0 else f"short of the bound ({error:+.1%})"


_KEY = re.compile(r"^[a-z0-9]+(?:_[a-z0-9]+)*$")
_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def quote_has_value(quote: str, value: str) -> bool:
    """Whether ``quote`` states ``value`` as written in the file: its digits, not inside a longer number, thousands
    separators in the quote ignored (``1,793`` states ``1793``); a whole number up to ten may be spelt out (``one``)."""
    text = re.sub(r"(?<=\d)[,\u202f\u00a0](?=\d{3}\b)", "", quote)
    number = value.strip().replace(",", "")
    if re.search(rf"(?<![\d.]){re.escape(number)}(?!\.?\d)", text):
        return True
    if re.fullmatch(r"\d+", number) and int(number) < len(_WORDS):
        return re.search(rf"\b{_WORDS[int(number)]}\b", quote, re.IGNORECASE) is not None
    return False


def _int(raw: str, field: str, *, optional: bool = False) -> int | None:
    s = raw.strip()
    if not s and optional:
        return None
    if not re.fullmatch(r"\d+", s) or int(s) < 1:
        raise ValueError(f"{field} must be a positive integer{' or empty' if optional else ''}, got {raw!r}")
    return int(s)


def _check_row(r: dict) -> float:
    """The row's step_ms (time per output token per user); ValueError saying what is wrong."""
    for field in ("model", "chip", "stack", "dtype", "value"):
        if not r[field].strip():
            raise ValueError(f"{field} is empty")
    if not _KEY.match(r["key"]):
        raise ValueError(f"key {r['key']!r} is not snake_case")
    if r["engine"] not in ENGINES:
        raise ValueError(f"unknown engine {r['engine']!r}; engines: {', '.join(ENGINES)}")
    if r["bound"] not in BOUNDS:
        raise ValueError(f"bound {r['bound']!r} is none of {BOUNDS}: empty (the value as it is), upper or lower")
    if r["quantity"] not in QUANTITY_UNITS:
        raise ValueError(f"unknown quantity {r['quantity']!r}; quantities: {', '.join(QUANTITY_UNITS)}")
    units = QUANTITY_UNITS[r["quantity"]]
    if r["unit"] not in units:
        raise ValueError(f"unknown unit {r['unit']!r} for {r['quantity']}; units: {', '.join(units)}")
    if not re.match(r"^https?://\S+$", r["url"].strip()):
        raise ValueError(f"url is missing or not an address: {r['url']!r}")
    if not r["quote"].strip():
        raise ValueError("quote is missing")
    if not quote_has_value(r["quote"], r["value"]):
        raise ValueError(f"the quote does not contain the value {r['value']!r} as written")
    chips = _int(r["chips"], "chips")
    batch = _int(r["batch"], "batch")
    if batch > MAX_BATCH:
        raise ValueError(f"batch {batch} is outside the file's scope of 1 to {MAX_BATCH} users")
    _int(r["prompt_tokens"], "prompt_tokens", optional=True)
    output_tokens = _int(r["output_tokens"], "output_tokens", optional=True)
    named = get_chip(r["chip"]).chips
    if named != chips:
        raise ValueError(f"chip {r['chip']!r} is {named} chip(s) but chips is {chips}")
    if r["config"] and r["config"] not in PRESETS and not (CONFIGS_DIR / r["config"] / "config.json").is_file():
        raise ValueError(
            f"config {r['config']!r} is neither a preset nor a folder of {CONFIGS_DIR.name}/ with a config.json"
        )
    try:
        value = float(r["value"].replace(",", ""))
    except ValueError:
        raise ValueError(f"value {r['value']!r} is not a number") from None
    if not value > 0:
        raise ValueError(f"value {r['value']!r} is not positive")
    if r["quantity"] == "tokens_per_s":
        return 1000.0 / value
    ms = value * units[r["unit"]]
    if r["quantity"] == "request_latency":
        if output_tokens is None:
            raise ValueError("request_latency needs output_tokens to give a time per output token")
        return ms / output_tokens
    return ms


def read_independent(path: str | Path) -> pd.DataFrame:
    """``path`` (a file laid out like data/independent.csv) checked row by row, with a derived ``step_ms`` column: the
    time per output token per user in ms. A malformed row raises ValueError naming its line and key."""
    path = Path(path)
    t = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = [c for c in INDEPENDENT_COLUMNS if c not in t.columns]
    if missing:
        raise ValueError(f"{path.name} lacks the column(s) {missing}")
    step, seen = [], {}
    for i, r in enumerate(t.to_dict("records")):
        where = f"{path.name} line {i + 2} (key {r['key']!r})"
        if r["key"] in seen:
            raise ValueError(f"{where}: duplicate key, first on line {seen[r['key']]}")
        seen[r["key"]] = i + 2
        try:
            step.append(_check_row(r))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    for c in ("chips", "batch", "prompt_tokens", "output_tokens"):
        t[c] = pd.to_numeric(t[c]).astype("Int64")
    t["value"] = pd.to_numeric(t["value"].str.replace(",", ""))
    t["step_ms"] = step
    return t


@lru_cache(maxsize=None)
def _independent_table() -> pd.DataFrame:
    return read_independent(INDEPENDENT_CSV)


def independent_table() -> pd.DataFrame:
    """data/independent.csv, checked, with ``step_ms`` (time per output token per user, ms) derived from each row's
    quantity and unit. Published measurements nothing is fitted to; a copy, so callers may change it."""
    return _independent_table().copy()
