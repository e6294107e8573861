"""The write-up's component table, modelled: how much the step shrinks when each component is switched off (its
megakernel column), and the general stack's own kernel time per component (its profiler column)."""

from __future__ import annotations

import pandas as pd

from ..params import KNOCKOUTS
from ..timing import MODELLED, predict


def knockouts(
    model, chip, context: int, batch: int = 1, engine: str = "megakernel", dtype: str = "bf16", components=None, **kw
) -> pd.DataFrame:
    """Per component: how much the modelled step shrinks when it is switched off (the megakernel column of
    the write-up's component table), and for the general stack also the time of its own kernels (the
    profiler's column). ``kw``: mk.timing.predict's keywords (the kernel setup, the assumed costs)."""
    base = predict(model, chip, context, batch, engine, dtype, **kw)
    rows = []
    for c in components or KNOCKOUTS:
        off = predict(model, chip, context, batch, engine, dtype, knockout={c}, **kw)
        rows.append(
            dict(
                component=c,
                step_ms=base.step_s * 1e3,
                knocked_out_ms=off.step_s * 1e3,
                shrink_ms=(base.step_s - off.step_s) * 1e3,
                kernel_time_ms=base.components.get(c, float("nan")) * 1e3,
                # where the megakernel's per-op costs came from, both steps (mk.timing.predict)
                op_costs=base.op_costs if off.op_costs == base.op_costs else f"{base.op_costs} / {off.op_costs}",
            )
        )
    return pd.DataFrame(rows).assign(
        model=base.model, chip=base.chip, engine=engine, dtype=dtype, setup=base.setup, kind=MODELLED
    )
