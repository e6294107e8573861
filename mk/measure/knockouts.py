"""Component knock-outs: the step timed whole and with each component switched off in turn
(``knockout_table``), and the seed's published component table joined beside them (``with_seed_columns``)."""

from __future__ import annotations

from typing import Any, Callable

import pandas as pd

from ..profiling.kernels import compiled_kernels
from ..published import published, published_table
from .loop import interleaved

WHOLE = "(whole step)"


def knockout_table(
    call_for: Callable[[frozenset[str]], Callable[[], Any]],
    components,
    bytes_time_s: dict[str, float] | None = None,
    **method,
) -> pd.DataFrame:
    """Time the whole step and the step with each component switched off, interleaved in one run
    (mk.measure.loop.interleaved, its one stopping rule: each variant's step known to +-``precision`` of
    itself; ``method`` sets its precision, budget, ...).

    ``call_for(knockout)`` gives a no-argument call running the step with the components in ``knockout``
    off. The shrink is how much faster the step gets without the component (the median of the paired
    per-round differences, with its interval), as in the seed's megakernel column: not that component's
    share of the step, and the rows need not add up to it. ``bytes_time_s``: each component's bytes over
    the measured bandwidth; a shrink well above it (more than twice, beyond its interval) is flagged: the
    knock-out removed more than reads (kernels, fusions), and a shrink whose interval holds zero is noise.
    A call with a ``program`` (mk.measure.steps.decode_call(program=True)) has its kernels counted in the program it
    was timed with (compiled once): column ``kernels``.
    """
    calls = {WHOLE: call_for(frozenset())}
    for c in components:
        calls[c] = call_for(frozenset({c}))
    cmp = interleaved(calls, WHOLE, **method)
    whole = cmp.times[WHOLE]
    rows = []
    for name in calls:
        t, d = cmp.times[name], cmp.differences[name]
        byte_s = (bytes_time_s or {}).get(name)
        shrink = (-d.median, -d.high, -d.low)
        if name == WHOLE:
            verdict = "baseline"
        elif d.holds_zero:
            verdict = "noise: the interval holds zero"
        elif byte_s is not None and shrink[1] > 2 * byte_s:
            verdict = "above its bytes' time: more than reads removed (kernels, fusions)"
        else:
            verdict = "resolved"
        rows.append(
            dict(
                component=name,
                **t.columns("step"),
                shrink_s=0.0 if name == WHOLE else shrink[0],
                shrink_low_s=0.0 if name == WHOLE else shrink[1],
                shrink_high_s=0.0 if name == WHOLE else shrink[2],
                bytes_time_s=byte_s,
                verdict=verdict,
                **_kernels(calls[name]),
            )
        )
    df = pd.DataFrame(rows)
    df["shrink_fraction"] = df["shrink_s"] / whole.median
    df.attrs.update(cmp.provenance())
    return df


def _kernels(call) -> dict:
    program = getattr(call, "program", None)
    return {} if program is None else {"kernels": compiled_kernels(program, *call.args()).total}


def with_seed_columns(table: pd.DataFrame) -> pd.DataFrame:
    """Add the seed's published component table (vLLM H100 kernel time, megakernel v5e-8 shrink)."""
    pub = published_table()
    pub = pub[pub["quantity"] == "knockout_time"]
    out = table.copy()
    for prefix, col in (("ko_vllm_", "seed_vllm_h100_s"), ("ko_mk_", "seed_megakernel_v5e8_s")):
        vals = {k[len(prefix) :]: v for k, v in zip(pub["key"], pub["value"]) if k.startswith(prefix)}
        out[col] = out["component"].map(vals)
    whole = table.loc[table["component"] == WHOLE].index
    out.loc[whole, "seed_vllm_h100_s"] = published("vllm_h100_moe_step")
    out.loc[whole, "seed_megakernel_v5e8_s"] = published("mk_v5e8_moe_step")
    return out
