"""A step's copies alone: a Pallas kernel that moves what a megakernel step moves and computes nothing, timed on the
chip beside the kernel itself, interleaved, on the same weights (``python -m mk tpu-measure --parts copies``).

- **What it moves** (:func:`copies_alone_call`): every weight tile's copy of the step's plan, started and waited where
  the plan starts and waits it (the same order, into the same slots of the same buffers, each routed slot a fixed
  expert: one user's distinct experts are always its top k), and each layer's KV cache tiles two deep where its
  attention reads them. Left out: the few small reads compute waits for (the vectors, the embedding rows, the route's
  table, the write-back blocks) and a stand-in's exchanges.
- **What it tells**: the kernel's step less these copies' time is what the core adds on top of its copies (compute,
  the route, waits no copy needs), which a better schedule could remove; the copies' time less their bytes at the
  chip's measured limit is what the copy engine takes on these tiles (their shapes, their padding, a call's fixed
  time), which no kernel streaming these tiles goes below. The same split, modelled, is mk.analysis.stream_waits'.
- **Rows** (:data:`COLUMNS`) go to data/measured/tpu_copies.csv (mk.paths.TPU_COPIES_CSV), the kernel's and the
  copies' in one round each, with the bytes the copies move (``copies_bytes``) and the bytes the step's fraction of
  the limit is of (``bytes_per_token``; a knocked-out step's rows take no fraction).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ..config import get_config
from ..files import append_csv_rows
from ..generate import cache_multiple
from ..params import knocked_out
from ..plan import Attend, ReadAhead, Start, Wait, build_plan
from ..progress import Log
from ..timing.scheduled import recorded_revision
from ..tpu import interpret_params
from ..units import MIB, round_up
from .harness import DEVICE_TIMING, TimedStep, columns, provenance, time_engines
from .on_chip import STEPS, Case, CaseEngines, Cell, _scheme, a_token, cell_speed_of_light, limit_columns, variant
from .steps import traced_digest

COPIES = "copies alone"  # the rows' engine for the copies (the kernel's: megakernel)
COLUMNS = columns("base_model", "layers", "setup", "kernel_revision", STEPS, "knockout", *DEVICE_TIMING,
                  "copies_bytes", "limit_GBps", "limit_source", "device_fraction_of_limit")  # fmt: skip


def step_plan_of(engine, cell: Cell, dtype: str, knockout=frozenset()):
    """The plan the kernel ``engine`` (mk.megakernel.make_step's) runs for one step of ``cell`` in ``dtype`` (a case's)
    with ``knockout``'s components off, with the context the copies read the KV cache to."""
    max_len = round_up(cell.context, cache_multiple("megakernel"))
    return build_plan(engine.cfg, cell.batch, max_len, cell.context, weight_dtype="bfloat16", kv_dtype="bfloat16",
                      tiles=engine.tiles, setup=engine.setup, quantize=_scheme(dtype),
                      knockout=frozenset(knockout))  # fmt: skip


def copies_bytes(plan) -> int:
    """What :func:`copies_alone_call` moves a step: every weight tile (its scales too), and one user's KV tiles of
    every layer, K and V, at the plan's context."""
    tiles = sum(ld.nbytes for ld in plan.loads)
    kv = sum(_kv_tile_bytes(plan, op.layer_type) * plan.kv_tiles_read(op.layer_type) for op in _attends(plan))
    return tiles + kv * plan.users


def _attends(plan) -> list:
    return [it for it in plan.items if isinstance(it, Attend)]


def _kv_tile(plan, t: str) -> tuple[int, int, int]:
    """A layer type's KV tile: (head groups, positions, a group's lanes)."""
    *_, groups, _, lanes = plan.arrays.cache[f"{t}.k"].shape
    return groups, plan.kv_tile(t), lanes


def _kv_tile_bytes(plan, t: str) -> int:
    return 2 * math.prod(_kv_tile(plan, t)) * plan.kv_itemsize


class _Cache(NamedTuple):
    """A layer type's KV tiles in VMEM as mk.megakernel.attention's tile copies take them."""

    k: Any  # [2, head groups, T, a group's lanes]
    v: Any
    sem: Any  # DMA [2 (k, v), 2 (slot)]


def copies_alone_call(plan, weights: dict, steps: int = 1, device=None, interpret=None):
    """A no-argument call that runs ``steps`` times, in one compiled call, a Pallas kernel moving what a step of
    ``plan`` moves (the module's docstring) from ``weights`` (the kernel's packed HBM weights, name -> array) and a zero
    KV cache of the plan's shapes; and the bytes it moves a step. ``interpret``: Pallas TPU interpreter parameters (off
    a TPU)."""
    run, cache_shapes = copies_alone_program(plan, sorted(weights), steps, interpret)
    device = device or jax.devices()[0]
    ws = [weights[n] for n in sorted(weights)]
    cs = [jnp.zeros(s.shape, s.dtype, device=device) for s in cache_shapes]

    def call():
        return run(ws, cs)

    call.program_digest = lambda: traced_digest(run, ws, cs)
    return call, copies_bytes(plan)


def copies_alone_program(plan, names: list[str], steps: int = 1, interpret=None):
    """(the jitted program of :func:`copies_alone_call`: weights in the order of ``names`` and the KV cache it reads,
    as two lists, to an [8, 128] f32 sum; the cache's shapes). What a chip compiles, also ahead of time."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    from ..megakernel.stream import WeightStream

    if plan.layout.latent_attention is not None:
        raise ValueError(f"{plan.share.name}: the copies alone read a K and a V cache; a latent cache is not covered")
    loads, buffers = {ld.id: ld for ld in plan.loads}, list(plan.buffers.values())
    types = sorted({op.layer_type for op in _attends(plan)})
    cache = {n: a for n, a in plan.arrays.cache.items() if n.split(".")[0] in types}
    cache_names = sorted(cache)
    kv_dtype = jnp.dtype(plan.kv_dtype)

    def kernel(*refs):
        refs = list(refs)
        hbm = {n: refs.pop(0) for n in names}
        caches = {n: refs.pop(0) for n in cache_names}
        acc_in, out = refs.pop(0), refs.pop(0)
        bufs = {b.name: refs.pop(0) for b in buffers}
        sems = {b.name: refs.pop(0) for b in buffers}
        kv = {t: _Cache(refs.pop(0), refs.pop(0), refs.pop(0)) for t in types}
        stream = WeightStream(hbm, bufs, sems, expert_id=lambda j: j, priority=plan.tiles.weight_priority)
        for it in plan.items:
            if isinstance(it, Start | Wait):
                (stream.start if isinstance(it, Start) else stream.wait)(loads[it.load])
            elif isinstance(it, ReadAhead | Attend):
                _read_cache(plan, it, caches, kv[it.layer_type])
        out[...] = acc_in[...] + bufs[buffers[0].name][0, :8, :128].astype(jnp.float32)

    def kv_tiles(t):
        tile = (2, *_kv_tile(plan, t))
        return [pltpu.VMEM(tile, kv_dtype), pltpu.VMEM(tile, kv_dtype), pltpu.SemaphoreType.DMA((2, 2))]

    weight_dtype = jnp.dtype(plan.weight_dtype)
    need = sum(b.nbytes for b in buffers) + sum(2 * _kv_tile_bytes(plan, t) for t in types)
    call = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)] * (len(names) + len(cache_names))
        + [pl.BlockSpec(memory_space=pltpu.VMEM)],
        out_specs=pl.BlockSpec(memory_space=pltpu.VMEM),
        scratch_shapes=[pltpu.VMEM((b.slots, *b.shape), b.dtype or weight_dtype) for b in buffers]
        + [pltpu.SemaphoreType.DMA((b.slots,)) for b in buffers]
        + [s for t in types for s in kv_tiles(t)],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=need + need // 4 + 8 * MIB, has_side_effects=True),
        **(dict(interpret=interpret) if interpret is not None else {}),
    )

    @jax.jit
    def run(ws, cs):  # each call reads the last one's sum: no call is hoisted out of the loop
        return jax.lax.fori_loop(0, steps, lambda i, acc: call(*ws, *cs, acc), jnp.zeros((8, 128), jnp.float32))

    return run, [jax.ShapeDtypeStruct(cache[n].shape, cache[n].dtype) for n in cache_names]


def _read_cache(plan, op, caches: dict, buf: _Cache) -> None:
    """Layer ``op``'s K and V tiles at the plan's context, one user at a time, two deep, as the kernel's attention
    reads them (mk.megakernel.attention), with nothing folded: at a ReadAhead user 0's first ones started, at its
    Attend the rest."""
    from ..megakernel.attention import read_tile, start_first_tiles, start_user_tiles

    t = op.layer_type
    kc, vc = caches[f"{t}.k"].at[op.index], caches[f"{t}.v"].at[op.index]
    T, n = plan.kv_tile(t), plan.kv_tiles_read(t)
    if isinstance(op, ReadAhead):
        return start_first_tiles(kc, vc, buf, T, 0, n)
    ahead = plan.tiles.kv_ahead
    for b in range(plan.users):
        start_user_tiles(kc, vc, buf, T, b, n, ahead)

        def body(tix, carry, b=b):
            return read_tile(kc, vc, buf, T, b, tix, n, ahead, lambda slot: carry)

        jax.lax.fori_loop(0, n, body, 0)


def measure_case(case: Case, limit, device, budget_s: float, log, min_rounds: int = 5, steps_back_to_back: int = 20,
                 knockouts: tuple[str, ...] = ()) -> list[dict]:  # fmt: skip
    """``case``'s kernel (each of its tiles, each of its steps a call; whole, and with each of ``knockouts`` switched
    off, mk.params.knocked_out) beside its copies alone at each cell, interleaved in one loop, on the same packed
    weights: a row each. A component's kernel shrink less its copies' is what the core adds for it past its copies."""
    engines = CaseEngines(case, device, 0, log)
    rows = []
    try:
        engines.build("megakernel")
        for cell in case.cells:
            rows += _measure_cell(engines, cell, limit, budget_s, log, min_rounds, steps_back_to_back, knockouts)
    finally:
        engines.close()
    return rows


def _timed_pair(engines: CaseEngines, cell: Cell, tiles, steps: int, name: str, interpret, log) -> tuple:
    """The kernel built with ``tiles`` at ``steps`` a call, component ``name`` off ("": none), and its copies alone,
    compiled and run once."""
    case, key, knockout = engines.case, variant("megakernel", tiles), knocked_out(name) if name else frozenset()
    label = f"{case.setup_label_at(tiles)} [{steps} a call{f'; {name} off' if name else ''}]"
    call = engines.call("megakernel", cell, knockout, steps=steps, tiles=tiles)[0]
    kernel = TimedStep(label, call, engine="megakernel")
    plan = step_plan_of(engines.steps[key], cell, case.dtype, knockout)
    t = time.perf_counter()
    call, moved = copies_alone_call(plan, engines.weights[key]["weights"], steps, engines.device, interpret)
    jax.block_until_ready(call())
    log(f"{label}: its copies alone ({moved / MIB:.1f} MiB a step) compiled and run in {time.perf_counter() - t:.1f} s")
    about = dict(setup=case.setup_label_at(tiles), copies_bytes=moved, knockout=name, **{STEPS: steps})
    kernel.columns = dict(about)
    return kernel, TimedStep(f"{label} {COPIES}", call, engine=COPIES, columns=dict(about))


def _measure_cell(engines: CaseEngines, cell: Cell, limit, budget_s, log, min_rounds, steps_back_to_back,
                  knockouts) -> list:  # fmt: skip
    case, device = engines.case, engines.device
    sol, chips = cell_speed_of_light(engines, cell)
    interpret = None if device.platform == "tpu" else interpret_params()
    timed = [e for _, tiles in case.timed() if _ == "megakernel" for n in case.steps_a_call for name in ("", *knockouts)
             for e in _timed_pair(engines, cell, tiles, n, name, interpret, log)]  # fmt: skip
    run = dict(provenance(device), model=engines.cfg.name, dtype=case.dtype, context=cell.context, batch=cell.batch,
               weights="random (seed 0)")  # fmt: skip
    _, rows = time_engines(timed, sol, run, budget_s, min_rounds=min_rounds, steps_back_to_back=steps_back_to_back,
                           log=log)  # fmt: skip
    out = []
    for e, row in zip(timed, rows):
        row = a_token(row, e.columns[STEPS])
        row.update(base_model=get_config(case.model).name, layers=case.layers_label,
                   kernel_revision=recorded_revision())  # fmt: skip
        lim = limit_columns(row, limit, None, chips)
        row.update({k: lim[k] for k in ("limit_GBps", "limit_source", "device_fraction_of_limit")})
        if row["knockout"]:  # the step's bytes are the whole step's: no fraction of a knocked-out one
            row["device_fraction_of_limit"] = None
        out.append({k: row.get(k) for k in COLUMNS})
        log(f"{e.label}: device {row['device_step_ms']:.4f} ms a step")
    return out


def measure(cases, out: Path | str | None = None, limit=None, device=None, deadline: float | None = None,
            budget_s: float = 8.0, quiet: bool = False, min_rounds: int = 5,
            steps_back_to_back: int = 20, knockouts: tuple[str, ...] = ()) -> tuple[list[dict], list[str]]:  # fmt: skip
    """Every case of ``cases`` (the module's docstring; each also with ``knockouts`` off in turn), rows appended to
    ``out`` after each case; what is left at ``deadline`` (time.perf_counter()) is not started, said so. Returns (rows,
    notes)."""
    device = device or jax.devices()[0]
    log, rows, notes = Log(quiet), [], []
    for case in cases:
        if deadline is not None and time.perf_counter() > deadline:
            notes.append(f"copies alone of {case.config().name} ({case.setup_label}): not measured, out of time")
            continue
        got = measure_case(case, limit, device, budget_s, log, min_rounds, steps_back_to_back, knockouts)
        rows += got
        if out is not None:
            append_csv_rows(got, Path(out), COLUMNS, "a copies-alone row")
    return rows, notes
