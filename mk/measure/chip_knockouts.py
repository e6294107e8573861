"""Component knock-outs timed on the chip (``python -m mk tpu-measure --parts knockouts``): a case's megakernel step
whole and with each of its components switched off in turn (mk.params.KNOCKOUTS: the kernel skips the component's
weight tiles, its KV reads and its ops), in device time (``STEPS_BACK_TO_BACK`` steps dispatched back to back, waited on
once), all interleaved in one run (mk.measure.knockouts.knockout_table: the shrink is the median of the paired per-round
differences, with its 95% interval). Beside each shrink: the time the component's bytes take at the chip's measured
limit (one-chip cases), so a shrink reads as the component's bytes streamed at the limit, more (its ops' issue time
showing) or less (hidden under other reads). A case timed at several greedy steps a call (its largest
``Case.steps_a_call``) has its knock-outs timed so too, every step of a call with the component off, its times a
token's: what one step a call adds (the chip between programs, the host's first dispatch) spread over the steps.
Rows go to data/measured/tpu_knockouts.csv; notebook 12 sets them beside the timing model's knock-outs of the same
steps (mk.analysis.knockouts)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import pandas as pd

from ..config import LAYER_PAIR
from ..files import append_csv_rows
from ..params import KNOCKOUTS, ROUTE_WAIT, ROUTER, knocked_out, param_specs
from ..progress import Log
from ..sol import bytes_per_token
from ..timing.scheduled import current_kernel, recorded_revision
from .harness import CHIP_PROVENANCE, chip_provenance
from .knockouts import WHOLE, knockout_table
from .loop import back_to_back
from .on_chip import Case, CaseEngines, Cell

STEPS_BACK_TO_BACK = 10
CASES = (
    Case("llama-3.2-1b", cells=(Cell(1024, 1), Cell(32768, 1), Cell(1024, 8))),
    Case("gemma4-26b-a4b", LAYER_PAIR, cells=(Cell(1024, 1), Cell(1024, 8))),
    Case("gemma4-26b-a4b", None, setup="workbook", cells=(Cell(1024, 1), Cell(1024, 8))),
    # MoE at one user, 16 steps a call: where a layer's time past its bytes goes (mk.analysis.moe_one_user)
    Case("qwen3-30b-a3b", 8, alone="megakernel", cells=(Cell(1024, 1),), steps_a_call=(16,)),
    Case("gemma4-26b-a4b", LAYER_PAIR, cells=(Cell(1024, 1),), steps_a_call=(16,)),
)
COLUMNS = (*CHIP_PROVENANCE, "kernel_revision", "program_digest", "model", "layers", "setup", "dtype", "context",
           "batch", "component", "steps_back_to_back", "rounds", "whole_ms", "device_step_ms", "shrink_ms",
           "shrink_low_ms", "shrink_high_ms", "bytes_at_limit_ms", "limit_GBps", "verdict",
           "steps_a_call")  # fmt: skip


def component_bytes(case: Case, cell: Cell) -> dict[str, float] | None:
    """Bytes a step reads for each component it has (mk.sol.ByteCount.by_knockout: an attention type's with its KV
    cache); None for a stand-in (chip 0 of a slice reads its own share, not the model's: mk.analysis.chip_checks
    counts it)."""
    if case.kernel_setup().loopback:
        return None
    got = bytes_per_token(case.config(), cell.context, cell.batch, case.dtype).by_knockout
    if ROUTER in got:  # the route's wait goes with the router's knock-out, and its bytes
        got[ROUTE_WAIT] = got[ROUTER]
    return got


def measure_knockouts(case: Case, cell: Cell, engines: CaseEngines, limit, budget_s: float, log,
                      clock: Callable[[], float] = time.perf_counter) -> list[dict]:  # fmt: skip
    """The rows of ``case`` at ``cell`` (the module's docstring), the megakernel built in ``engines``; ``clock``: what
    the timing loop reads the time from (mk.measure.loop.interleaved)."""
    by = component_bytes(case, cell)
    present = {s.component for s in param_specs(case.config())}
    components = [c for c in KNOCKOUTS if c in present]
    if ROUTER in components:  # and the probe of the stream's wait for the route (mk.params.ROUTE_WAIT)
        components.append(ROUTE_WAIT)
    n, steps = STEPS_BACK_TO_BACK, max(case.steps_a_call)
    t = time.perf_counter()
    programs = {}  # each knock-out's program digest, by its row's component

    def call_for(knockout):
        call = engines.call("megakernel", cell, frozenset().union(*map(knocked_out, knockout)), steps=steps)[0]
        programs[next(iter(knockout)) if knockout else WHOLE] = call.program_digest()
        return back_to_back(call, n)

    tokens = n * steps  # a timed call of back-to-back calls decodes this many tokens
    bytes_time = None if by is None or limit is None else {c: tokens * b / limit.bandwidth for c, b in by.items()}
    table = knockout_table(call_for, components, bytes_time_s=bytes_time, budget_s=budget_s, min_rounds=5, clock=clock)
    log(f"{cell}: {len(components) + 1} steps compiled and timed in {time.perf_counter() - t:.0f} s")
    whole = table.loc[table.component == WHOLE, "step_s"].iloc[0]
    ms = 1e3 / tokens
    return [
        dict(
            component=r.component, program_digest=programs[r.component], steps_back_to_back=n,
            rounds=table.attrs["rounds"], whole_ms=round(whole * ms, 4),
            device_step_ms=round(r.step_s * ms, 4), shrink_ms=round(r.shrink_s * ms, 4),
            shrink_low_ms=round(r.shrink_low_s * ms, 4), shrink_high_ms=round(r.shrink_high_s * ms, 4),
            bytes_at_limit_ms=None if bytes_time is None or r.component == WHOLE else round(r.bytes_time_s * ms, 4),
            limit_GBps=None if limit is None else round(limit.bandwidth / 1e9, 2), verdict=r.verdict,
            steps_a_call=steps,
        )
        for r in table.itertuples()
    ]  # fmt: skip


def _key(case: Case, cell: Cell) -> tuple:
    return case.config().name, case.setup_label, case.dtype, cell.context, cell.batch, max(case.steps_a_call)


def _done(out, backend: str) -> set[tuple]:
    """The cells ``out`` holds rows of from a ``backend`` device of this tree's kernel
    (mk.timing.scheduled.current_kernel: a resumed run skips them; a CPU's interpreted rows never stand for a
    chip's)."""
    if out is None or not Path(out).exists():
        return set()
    t = pd.read_csv(out)
    t = t[current_kernel(t) & t.device.str.startswith(f"{backend}:")]
    steps = t.steps_a_call.fillna(1).astype(int)  # rows from before the column: one step a call
    return set(zip(t.model, t.setup, t["dtype"], t.context.astype(int), t.batch.astype(int), steps))


def run(cases=CASES, out: Path | str | None = None, limit=None, device=None, deadline: float | None = None,
        budget_s: float = 8.0, quiet: bool = False) -> tuple[list[dict], list[str]]:  # fmt: skip
    """Every cell of ``cases`` not in ``out`` at this kernel revision, rows appended to ``out`` after each cell; what is
    left at ``deadline`` (time.perf_counter()) is not started, said so. Returns (rows, notes)."""
    import jax

    device = device or jax.devices()[0]
    log, rows, notes = Log(quiet), [], []
    keep = chip_provenance(device)
    done = _done(out, device.platform)
    for case in cases:
        cells = [c for c in case.cells if _key(case, c) not in done]
        if not cells:
            continue
        engines = CaseEngines(case, device, 0, log)
        try:
            engines.build("megakernel")
            for cell in cells:
                what = f"{case.config().name} ({case.setup_label}) context {cell.context} batch {cell.batch}"
                if deadline is not None and time.perf_counter() > deadline:
                    notes.append(f"knock-outs of {what}: not measured, out of time")
                    continue
                got = [dict(keep, kernel_revision=recorded_revision(), model=case.config().name,
                            layers=case.layers_label, setup=case.setup_label, dtype=case.dtype,
                            context=cell.context, batch=cell.batch, **r)
                       for r in measure_knockouts(case, cell, engines, limit, budget_s, log)]  # fmt: skip
                rows += got
                if out is not None:
                    append_csv_rows(got, Path(out), COLUMNS, "a knock-out row")
        finally:
            engines.close()
    return rows, notes
