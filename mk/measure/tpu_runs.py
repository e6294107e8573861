"""``python -m mk tpu-measure``: what the workbook measures on a TPU chip, as one command that can be resumed.

In order, each part's rows appended to its CSV under ``out_dir`` (data/measured/ by default) as they come:

1. **parity** (mk.measure.chip_parity): the kernel against the reference for a tiny model of every family and each
   format libtpu compiles, f32 and bf16 -> ``tpu_parity.csv``;
2. **hbm** (mk.measure.hbm): the chip's HBM read rate by method and size, its best sustained figure the chip's
   measured limit -> ``tpu_hbm.csv``;
3. **table** (mk.measure.on_chip): :data:`TABLE`'s models, both engines interleaved, chip 0 of the write-up's and the
   workbook's v5e-8 steps on the one chip, then the truncations too big for both engines, each alone, and
   llama-3.2-1b's greedy steps several a call -> ``tpu.csv`` (and where each step's device time went, op by op ->
   ``tpu_ops.csv``);
4. **clock** (mk.measure.chip_clock): the core's clock, an issue-bound kernel's scheduled bundles over its device
   time -> ``tpu_clock.csv``;
5. **knockouts** (mk.measure.chip_knockouts): each component of a step switched off in turn, in device time ->
   ``tpu_knockouts.csv``;
6. **anchor** (mk.measure.attention_anchor): JAX's ragged paged attention over the same cache beside the megakernel's
   attention, by context -> ``tpu_attention.csv``;
7. **dma** (mk.measure.dma_latency): one copy from HBM alone, start to wait, by size: the time a copy costs where
   nothing else is in flight -> ``tpu_dma.csv``;
8. **copies** (mk.measure.copies_alone): the MoE one-user cells' kernel beside its own copies alone (every tile and
   KV tile it moves, no compute), interleaved on the same weights -> ``tpu_copies.csv``.

A run stops starting work at its ``deadline_s`` (540 s by default, for a session that holds the chip ten minutes at a
time) and a later run skips the table's cells already measured on a TPU, so the parts can be spread over several calls
(``--parts``). The chip is the device's (mk.chips.known_chip: its measured limit, its clock, the schedule its clock
check compiles), never assumed; off a TPU (the tests' interpreted run) no limit, and the clock check's schedule a
v5e's.
"""

from __future__ import annotations

import time
from pathlib import Path

from ..chips import get_chip, known_chip, measured_limit
from ..config import LAYER_PAIR, get_config
from ..files import append_csv_rows
from ..paths import MEASURED_DIR
from ..progress import Log
from ..tpu import on_tpu
from . import attention_anchor, chip_clock, chip_knockouts, chip_parity, copies_alone, dma_latency, hbm, on_chip
from .harness import CHIP_PROVENANCE, provenance
from .on_chip import Case, Cell, grid

PARTS = ("parity", "hbm", "table", "clock", "knockouts", "anchor", "dma", "copies")
CONTEXTS, BATCHES = (1024, 8192, 32768), (1, 4, 8)
ONE_USER = tuple(Cell(c, 1) for c in CONTEXTS)
# Every context for one user, every batch at the first context: the cells a chip's half hour holds for every case (a
# case builds its weights once, 30-60 s on a v5e, and compiles each cell, 7-45 s); llama-3.2-1b, the cheapest, takes
# the whole grid.
CROSS = ONE_USER + tuple(Cell(CONTEXTS[0], b) for b in BATCHES[1:])
# Full-width truncations too big for both engines at once: the deepest that mk.measure.on_chip.planned_bytes says fit
# one v5e beside nothing else (26B-A4B: 7 layers, 31B: 9), then the six layers first tried on this chip.
TRUNCATIONS = (("gemma4-26b-a4b", 7), ("gemma4-31b", 9), ("gemma4-26b-a4b", 6), ("gemma4-31b", 6))
LLAMA_ALONE = (Cell(32768, 4), Cell(32768, 8), Cell(131072, 1))
# The table: dense decoders that fit (llama-3.2-1b whole, a Qwen3 at full width), Gemma 4 at full width (a sliding and
# a full layer: every context's cost at the weights' real shapes; 26B-A4B also with INT8 experts), chip 0 of the
# write-up's v5e-8 step and the workbook's on the one chip, then the truncations too big for both engines at once,
# each engine alone, and llama-3.2-1b's long or many-user cells alone.
TABLE = (
    Case("llama-3.2-1b", cells=grid(CONTEXTS, BATCHES, long=(131072,))),
    Case("gemma4-26b-a4b", LAYER_PAIR, cells=CROSS + (Cell(131072, 1),)),
    Case("gemma4-31b", LAYER_PAIR, cells=CROSS + (Cell(131072, 1),)),
    Case("gemma4-26b-a4b", None, setup="write-up", cells=ONE_USER[:2] + (Cell(1024, 8),)),
    Case("gemma4-26b-a4b", None, setup="workbook", cells=ONE_USER[:2] + (Cell(1024, 8),)),
    Case("gemma4-26b-a4b", LAYER_PAIR, dtype="bf16+int8-experts", cells=CROSS + (Cell(131072, 1),)),
    Case("qwen3-8b", 8, cells=CROSS),
    *(Case(m, n, alone=e, cells=ONE_USER[:1]) for m, n in TRUNCATIONS for e in ("megakernel", "reference")),
    # cells whose caches do not fit both engines at once: each engine alone, where it fits
    *(Case("llama-3.2-1b", alone=e, cells=LLAMA_ALONE) for e in ("megakernel", "reference")),
    *(Case("qwen3-8b", 8, alone=e, cells=(Cell(131072, 1),)) for e in ("megakernel", "reference")),
    # the host's time a token with several greedy steps in one compiled call, beside one step a call, in one run
    Case("llama-3.2-1b", cells=(Cell(1024, 1), Cell(1024, 8)), steps_a_call=(1, 4, 16)),
    # an MoE of many small experts (128, top 8, 768 wide) at full width: three layers hold both engines at once
    Case("qwen3-30b-a3b", 3, cells=(Cell(1024, 1), Cell(1024, 8))),
    # the write-up's subject, MoE at one user, at one and 16 greedy steps a call (mk.analysis.moe_one_user): the deepest
    # cuts one chip holds an engine of, each engine alone, then cuts both engines fit and chip 0 of the workbook's v5e-8
    *(Case(m, n, alone=e, cells=ONE_USER[:1], steps_a_call=(1, 16))
      for m, n in (("qwen3-30b-a3b", 8), ("gemma4-26b-a4b", 7)) for e in ("megakernel", "reference")),
    *(Case(m, n, cells=ONE_USER[:1], steps_a_call=(1, 16))
      for m, n in (("gemma4-26b-a4b", LAYER_PAIR), ("gpt-oss-20b", 2), ("mixtral-8x7b", 2))),
    Case("gemma4-26b-a4b", None, setup="workbook", cells=ONE_USER[:1], steps_a_call=(1, 16)),
)  # fmt: skip
# The kernel beside its copies alone: the MoE one-user cells at 16 steps a call (the deepest cuts one chip holds the
# kernel of, the cuts both engines fit, chip 0 of the workbook's v5e-8), and a dense model's for the contrast.
COPIES_CASES = tuple(
    Case(m, n, alone="megakernel", cells=ONE_USER[:1], steps_a_call=(16,), setup=setup)
    for m, n, setup in (("gemma4-26b-a4b", 7, "one chip"), ("gpt-oss-20b", 2, "one chip"),
                        ("gemma4-26b-a4b", None, "workbook"), ("qwen3-30b-a3b", 8, "one chip"),
                        ("gemma4-26b-a4b", LAYER_PAIR, "one chip"), ("llama-3.2-1b", None, "one chip"))
)  # fmt: skip
CSVS = dict(parity="tpu_parity.csv", hbm="tpu_hbm.csv", table="tpu.csv", clock="tpu_clock.csv",
            knockouts="tpu_knockouts.csv", anchor="tpu_attention.csv", dma="tpu_dma.csv",
            copies="tpu_copies.csv")  # fmt: skip
PARITY_COLUMNS = CHIP_PROVENANCE + chip_parity.COLUMNS


def table_cases(models: str | None = None, cases=TABLE, strict: bool = True) -> tuple[Case, ...]:
    """``cases``' cases of ``models`` (comma-separated names; None: every case). ``strict``: a name no case has is
    refused (otherwise it selects nothing)."""
    if models is None:
        return cases
    names = [m.strip() for m in models.split(",") if m.strip()]
    known = {get_config(c.model).name for c in cases}
    unknown = [m for m in names if m not in known]
    if strict and (unknown or not names):
        raise ValueError(f"--models: {unknown or models!r} not in the table; its models are {sorted(known)}")
    return tuple(c for c in cases if get_config(c.model).name in names)


class NoTPU(RuntimeError):
    """This process found no TPU."""


def run(
    parts=PARTS,
    out_dir: Path | str = MEASURED_DIR,
    deadline_s: float = 540.0,
    cases=TABLE,
    knockout_cases=chip_knockouts.CASES,
    copies_cases=COPIES_CASES,
    copies_knockouts: tuple[str, ...] = (),
    parity_checks=None,
    hbm_probes=None,
    require_tpu: bool = True,
    quiet: bool = False,
    probe_budget_s: float = 5.0,
    **timing,
) -> dict:
    """Run ``parts`` (the module's docstring) in order until ``deadline_s`` from now; rows go to ``out_dir``'s CSVs.
    Returns what was done: rows per part, the notes (what was skipped, what failed), whether every parity check held.
    ``probe_budget_s``: seconds each read-rate probe is timed for at most; ``timing``: mk.measure.on_chip.measure_case's
    ``steps``, ``min_rounds``, ``budget_s``."""
    import jax

    unknown = set(parts) - set(PARTS)
    if unknown or not parts:
        raise ValueError(f"parts must be some of {PARTS}, got {list(parts)}")
    if require_tpu and not on_tpu():
        raise NoTPU(f"tpu-measure: no TPU found (JAX backend: {jax.default_backend()}); run it on a TPU VM")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log, deadline = Log(quiet), time.perf_counter() + deadline_s
    device = jax.devices()[0]
    prov = provenance(device)
    chip = known_chip(device) if device.platform == "tpu" else None
    log(f"{device.device_kind}: JAX {prov['jax_version']}, libtpu {prov['libtpu_version']}, commit {prov['commit']}, "
        f"code {prov['code_digest']}, kernel {prov['kernel_digest']}")  # fmt: skip
    done = dict(parity=0, hbm=0, table=0, clock=0, knockouts=0, anchor=0, dma=0, copies=0, notes=[], parity_held=None)
    if "parity" in parts:
        keep = {k: prov[k] for k in PARITY_COLUMNS if k in prov}

        def write(row):
            append_csv_rows([dict(keep, **row)], out_dir / CSVS["parity"], PARITY_COLUMNS, "a parity row")

        rows = chip_parity.run_checks(parity_checks, quiet=quiet, on_row=write)
        done.update(parity=len(rows), parity_held=all(r["held"] for r in rows))
    if "hbm" in parts and time.perf_counter() < deadline:
        table = hbm.probe_read_rate(device, hbm_probes, budget_s=probe_budget_s, out=out_dir / CSVS["hbm"], quiet=quiet,
                                    interpret=device.platform != "tpu")  # fmt: skip
        done["hbm"] = len(table)
    limit = measured_limit(chip, out_dir / CSVS["hbm"]) if chip is not None else None
    if "table" in parts:
        for case in cases:
            if time.perf_counter() >= deadline:
                done["notes"].append(
                    f"{case.config().name} {case.dtype} ({case.setup_label}): not started, out of time"
                )
                continue
            rows, notes = on_chip.measure_case(case, out_dir / CSVS["table"], deadline=deadline, limit=limit,
                                               device=device, quiet=quiet, **timing)  # fmt: skip
            done["table"] += len(rows)
            done["notes"] += notes
    if "clock" in parts and time.perf_counter() < deadline:
        clock_chip = chip or "tpu-v5e"  # off a TPU the interpreted kernels' rows check the run, not a chip
        done["clock"] = len(chip_clock.measure(out=out_dir / CSVS["clock"], assumed_hz=get_chip(clock_chip).clock_hz,
                                               quiet=quiet, interpret=device.platform != "tpu",
                                               chip=clock_chip))  # fmt: skip
    if "knockouts" in parts:
        rows, notes = chip_knockouts.run(knockout_cases, out_dir / CSVS["knockouts"], limit, device, deadline,
                                         quiet=quiet)  # fmt: skip
        done["knockouts"], done["notes"] = len(rows), done["notes"] + notes
    if "anchor" in parts and time.perf_counter() < deadline:
        done["anchor"] = len(attention_anchor.measure(out=out_dir / CSVS["anchor"], limit=limit, quiet=quiet))
    if "dma" in parts and time.perf_counter() < deadline:
        interpret = device.platform != "tpu"  # off a TPU the interpreted kernels' rows check the run, not a chip
        done["dma"] = len(dma_latency.measure(out=out_dir / CSVS["dma"], quiet=quiet, interpret=interpret))
    if "copies" in parts:
        rows, notes = copies_alone.measure(copies_cases, out_dir / CSVS["copies"], limit, device, deadline, quiet=quiet,
                                           knockouts=copies_knockouts, **_copies_timing(timing))  # fmt: skip
        done["copies"], done["notes"] = len(rows), done["notes"] + notes
    for n in done["notes"]:
        log(n)
    return done


def _copies_timing(timing: dict) -> dict:
    """The table's timing arguments as mk.measure.copies_alone.measure names them."""
    names = dict(steps="steps_back_to_back", min_rounds="min_rounds", budget_s="budget_s")
    return {names[k]: v for k, v in timing.items() if k in names}
