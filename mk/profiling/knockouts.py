"""Component knock-outs: the step timed whole and with each component switched off in turn, beside the
seed's published component table."""

from __future__ import annotations

from typing import Callable

import pandas as pd

from ..progress import tqdm
from .timing import Timing


def knockout_table(time_for: Callable[[frozenset[str]], Timing], components) -> pd.DataFrame:
    """Time the step whole and with each component switched off in turn.

    ``time_for(knockout)`` times the step with the components in ``knockout`` off. The shrink is
    how much faster the step gets without the component, as in the seed's megakernel column: it
    is not that component's share of the step, and the rows need not add up to it.
    """
    whole = time_for(frozenset())
    rows = [{"component": "(whole step)", "step_s": whole.median_s, "spread": whole.spread, "shrink_s": 0.0}]
    for c in tqdm(components, desc="knock-outs", leave=False):
        t = time_for(frozenset({c}))
        rows.append({"component": c, "step_s": t.median_s, "spread": t.spread, "shrink_s": whole.median_s - t.median_s})
    df = pd.DataFrame(rows)
    df["shrink_fraction"] = df["shrink_s"] / whole.median_s
    return df


def with_seed_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Add the seed's published component table (vLLM H100 kernel time, megakernel v5e-8 shrink)."""
    from ..published import published, published_table

    pub = published_table()
    pub = pub[pub["quantity"] == "knockout_time"]
    out = table.copy()
    for prefix, col in (("ko_vllm_", "seed_vllm_h100_s"), ("ko_mk_", "seed_megakernel_v5e8_s")):
        vals = {k[len(prefix) :]: v for k, v in zip(pub["key"], pub["value"]) if k.startswith(prefix)}
        out[col] = out["component"].map(vals)
    whole = table.loc[table["component"] == "(whole step)"].index
    out.loc[whole, "seed_vllm_h100_s"] = published("vllm_h100_moe_step")
    out.loc[whole, "seed_megakernel_v5e8_s"] = published("mk_v5e8_moe_step")
    return out
