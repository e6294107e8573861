"""The seed's published numbers, read from ``data/published.csv`` (each row names its source).

They are compared against, never used as results.
"""

from __future__ import annotations

from functools import lru_cache

import pandas as pd

from .chips import DATA_DIR

PUBLISHED_CSV = DATA_DIR / "published.csv"


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


def published_speed_of_light() -> pd.DataFrame:
    """The seed's speed-of-light table: chip and tok/s."""
    t = published_table()
    columns = ["key", "model", "chip", "context", "batch", "dtype", "value", "source"]
    return t[t["quantity"] == "speed_of_light"][columns]
