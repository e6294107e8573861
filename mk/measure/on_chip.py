"""Decode steps measured on one real chip: the megakernel beside XLA's compiled reference, interleaved, for models
and truncations that fit the chip, at several contexts and batches; and chip 0 of a slice's step on the one chip
(``python -m mk tpu-measure``, mk.measure.tpu_runs; the rows go to data/measured/tpu.csv).

- **A case** (:class:`Case`): a model (a preset or a data/configs name), how much of it (every layer, its first n at
  full width, or its first sliding and first full layer), the weights' data type (``bf16``, or ``bf16+int8-experts``:
  the kernel streams INT8 expert codes, the reference dequantizes them once at load) and the kernel's setup (one chip,
  or a stand-in for chip 0 of a one-host slice: mk.kernel_setup.KernelSetup.loopback, no reference then). Random
  weights (seed 0): decode time does not depend on their values.
- **Memory**: each engine's bytes (weights as laid out, a cell's cache, and the peak of building its weights:
  :func:`planned_bytes`) are stated before anything is allocated, against ``HBM_USE`` of the chip; a cell that does
  not fit is skipped, said so; the bytes in use once built are read from the device beside them (``hbm_planned_GB``,
  ``hbm_in_use_GB``). Weights are built once a case (the megakernel's drawn on the chip, kept on the
  host, packed on the chip layer by layer), the caches once a cell; one case's arrays are freed before the next.
- **Times**: the engines interleaved in mk.measure.loop's one loop (harness.time_engines): a step waited on (the host's
  time, ``step_ms``) and ``STEPS_BACK_TO_BACK`` steps dispatched back to back and waited on once (the device's,
  ``device_step_ms``), medians with 95% intervals; then each engine's steps in a profiler trace (its device plane's
  program time, ``profiled_step_ms``, where the profiler gives one; and where that time went, each op category's total
  and the longest ops, to ``tpu_ops.csv`` beside the rows).
- **Limits**: each row's step against the speed of light at the chip's spec bandwidth and at its measured limit
  (mk.chips.measured_limit), for the host's and the device's times.
- **Code**: each row's provenance (mk.measure.harness) with the digests of mk/ and mk/megakernel/ computed on the
  machine that ran it, the kernel revision that digest is (data/kernel_revisions.csv; blank where none records it),
  and the digest of the program the row timed (``program_digest``, mk.measure.steps.traced_digest).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..chips import get_chip
from ..config import ModelConfig, get_config, with_layers
from ..files import append_csv_rows
from ..format_trees import FORMAT_SCHEMES, random_codes
from ..generate import cache_multiple
from ..kernel_setup import ONE_CHIP, SETUPS
from ..megakernel import make_step, pack
from ..megakernel.refs import input_shapes
from ..params import param_specs
from ..paths import TPU_OPS_CSV
from ..plan import Tiles, build_plan, round_up
from ..profiling import device_profile, op_summary
from ..progress import Log
from ..quant import quantized_as
from ..reference import init_cache
from ..sharding import chip_config
from ..sharding.mesh import make_mesh
from ..sol import bytes_per_token
from ..timing.scheduled import current_kernel, recorded_revision
from ..units import MIB
from ..weights import device_params, random_tensors
from .harness import (
    CHIP_PROVENANCE,
    DEVICE_TIMING,
    HBM_USE,
    TimedStep,
    columns,
    provenance,
    release_device_memory,
    spec_speed_of_light,
    time_engines,
    usable_hbm,
)
from .steps import decode_call, greedy_steps_call, reference_step, settled

ONE_CHIP_SETUP = "one chip"
STAND_INS = ("write-up", "workbook")  # the kernel setups a stand-in for chip 0 of a v5e-8 runs (mk.kernel_setup)
SLICE = 8  # the stand-in's slice: the write-up's v5e-8
STEPS_BACK_TO_BACK = 20
CELL_BUDGET_S = 4.0
STEPS = "steps_a_call"  # greedy decode steps in one compiled call (1: one step a call); the row's times are a step's
COLUMNS = columns(
    "base_model",
    "layers",
    "setup",
    "kernel_revision",
    "runs_as",
    "compile_s",
    "chip",
    *DEVICE_TIMING,
    "profiled_step_ms",
    "profile_source",
    "device_tokens_per_s",
    "limit_GBps",
    "limit_source",
    "host_fraction_of_limit",
    "device_fraction_of_spec",
    "device_fraction_of_limit",
    "hbm_planned_GB",
    "hbm_in_use_GB",
    STEPS,
)
# Where each measured step's device time went (tpu_ops.csv beside tpu.csv): each op category's total and the longest
# TOP_OPS ops, from the same trace as profiled_step_ms.
TOP_OPS = 12
OP_COLUMNS = (*CHIP_PROVENANCE, "program_digest", "engine", "model", "dtype", "setup", "context", "batch", "what",
              "name", "hlo_category", "tf_op", "runs", "us", "share")  # fmt: skip


@dataclass(frozen=True)
class Cell:
    context: int
    batch: int


def grid(contexts=(1024, 8192, 32768), batches=(1, 4, 8), long=(131072,)) -> tuple[Cell, ...]:
    """Every context with every batch, then each ``long`` context for one user."""
    return tuple(Cell(c, b) for c in contexts for b in batches) + tuple(Cell(c, 1) for c in long)


@dataclass(frozen=True)
class Case:
    """A model measured on one chip (the module's docstring): ``layers`` None (all), n (the first n), or
    ``LAYER_PAIR`` (mk.config.with_layers)."""

    model: str | ModelConfig
    layers: int | str | None = None
    dtype: str = "bf16"
    setup: str = ONE_CHIP_SETUP
    cells: tuple[Cell, ...] = field(default_factory=grid)
    alone: str | None = None  # one engine only (a model too big for both): not interleaved, said so in its row
    # greedy decode steps an engine runs in one compiled call, each a row, all interleaved: a row's times are a call's
    # over its steps (a token's), each step's picks the next one's tokens on the chip
    steps_a_call: tuple[int, ...] = (1,)
    # a shipped format's codes drawn at random (mk.format_trees.random_codes) rather than encoded from the drawn floats
    # on the host, which takes minutes for a big model's experts; what a step costs does not depend on the values
    random_codes: bool = False
    # the kernel's tile sizes and prefetch depths (mk.plan.Tiles), each built and timed interleaved with the rest; tiles
    # other than the default are a kernel variant whose rows' setup says how (:func:`tiles_words`)
    tiles: tuple[Tiles, ...] = (Tiles(),)

    def config(self) -> ModelConfig:
        return with_layers(self.model, self.layers)

    @property
    def layers_label(self) -> str:
        return "all" if self.layers is None else str(self.layers)

    @property
    def engines(self) -> tuple[str, ...]:
        if self.alone is not None:
            return (self.alone,)
        return ("megakernel",) if self.setup != ONE_CHIP_SETUP else ("reference", "megakernel")

    @property
    def setup_label(self) -> str:
        return self.setup_label_at(Tiles())

    def setup_label_at(self, tiles: Tiles | None) -> str:
        """The rows' setup for the kernel built with ``tiles`` (None, the reference's, or the default: nothing said)."""
        how = tiles_words(tiles or Tiles())
        if self.setup == ONE_CHIP_SETUP:
            return ONE_CHIP_SETUP + how
        return SETUPS[self.setup].name + how + "; loopback stand-in"

    def timed(self) -> tuple[tuple[str, Tiles | None], ...]:
        """(engine, its tiles) of each engine build the case times: the reference once (None), the kernel at each of its
        tiles."""
        return tuple((e, t) for e in self.engines for t in (self.tiles if e == "megakernel" else (None,)))

    def kernel_setup(self):
        if self.setup == ONE_CHIP_SETUP:
            return ONE_CHIP
        return SETUPS[self.setup].on(SLICE).replace(loopback=True)


def tiles_words(tiles: Tiles) -> str:
    """How ``tiles`` differ from the default, as a setup label's tail ("" for the default): "; 4 slots a weight buffer",
    "; weight tiles of 1 MiB" and so on."""
    default, said = Tiles(), []
    if tiles.slots != default.slots:
        said.append(f"{tiles.slots} slots a weight buffer")
    for field_, words in (("weight_tile_bytes", "weight tiles"), ("head_tile_bytes", "head tiles")):
        if getattr(tiles, field_) != getattr(default, field_):
            said.append(f"{words} of {getattr(tiles, field_) / MIB:g} MiB")
    if tiles.kv_tile != default.kv_tile:
        said.append(f"KV tiles of {tiles.kv_tile} positions")
    if tiles.lookahead_bytes != default.lookahead_bytes:
        said.append(f"copies held to a window of {tiles.lookahead_bytes / MIB:g} MiB")
    if tiles.kv_ahead != default.kv_ahead:
        said.append("KV tiles read ahead" if tiles.kv_ahead else "KV tiles read at attention")
    if tiles.expert_bias_ahead != default.expert_bias_ahead:
        said.append("expert biases read ahead" if tiles.expert_bias_ahead else "expert biases read where used")
    if tiles.weight_priority != default.weight_priority:
        said.append(f"weight copies at priority {tiles.weight_priority}")
    if tiles.head_equal_share != default.head_equal_share:
        share = tiles.head_equal_share
        said.append(f"head tiles equal down to {share:g} of their budget" if share else "head tiles equal at any size")
    return "".join(f"; {w}" for w in said)


# what :func:`tiles_words` says of a kernel built with other tiles than the default, at the head of each "; " part
VARIANT_PARTS = (
    "slots a weight buffer",
    "weight tiles of",
    "head tiles",
    "KV tiles",
    "copies held to a window",
    "expert biases",
    "weight copies at priority",
)


def is_variant(setup: str) -> bool:
    """Whether a row's ``setup`` names a kernel built with other tiles than the default (:func:`tiles_words`): the rows
    a cell's analyses leave to those that compare a variant with the default kernel."""
    parts = [p.strip() for p in str(setup).split(";")[1:]]
    return any(p.startswith(VARIANT_PARTS) or p.endswith(VARIANT_PARTS[0]) for p in parts)


def variant(engine: str, tiles: Tiles | None) -> str:
    """The key of ``engine``'s build at ``tiles`` (None or the default: the engine itself)."""
    how = tiles_words(tiles or Tiles())
    return f"{engine}[{how[2:]}]" if how else engine


# Memory ---------------------------------------------------------------------------------------------------------
def _nbytes(shapes) -> int:
    return int(sum(math.prod(s.shape) * jnp.dtype(s.dtype).itemsize for s in jax.tree.leaves(shapes)))


def planned_bytes(case: Case, engine: str, cell: Cell) -> tuple[int, int]:
    """(bytes ``engine`` holds on the chip for ``cell``: weights and cache, bytes more at the peak of building its
    weights). The reference draws and lays out its tensors in order on the chip (each drawn and laid out beside those
    before it; XLA draws and casts in one fusion, so no f32 copy is made); the megakernel draws each on the chip and
    keeps it on the host, then packs layer by layer into its stacked tensors (one layer in flight)."""
    cfg, setup = case.config(), case.kernel_setup()
    drawn = chip_config(setup.laid_out(cfg), setup) if setup.loopback else cfg
    sizes = [2 * math.prod(s.shape) for s in param_specs(drawn)]
    if engine == "reference":
        cache = jax.eval_shape(lambda: init_cache(cfg, cell.batch, cell.context, jnp.bfloat16))
        before = np.cumsum([0, *sizes[:-1]])
        return sum(sizes) + _nbytes(cache), max(0, int(max(b + 2 * n for b, n in zip(before, sizes))) - sum(sizes))
    max_len = round_up(cell.context, cache_multiple("megakernel"))
    plan = build_plan(cfg, cell.batch, max_len, cell.context, weight_dtype="bfloat16", kv_dtype="bfloat16", setup=setup,
                      quantize=_scheme(case.dtype))  # fmt: skip
    shapes = input_shapes(plan)
    weights = _nbytes(shapes.weights)
    return _nbytes(shapes), max(2 * max(sizes), weights + max(sizes)) - weights


def _scheme(dtype: str) -> str:
    """The scheme the kernel streams for a case's ``dtype``: ``bf16+int8-experts``'s INT8, a shipped format as it is
    (``fp8-block``), else none."""
    if "+" in dtype:
        return dtype.split("+", 1)[1]
    return dtype if dtype in FORMAT_SCHEMES else "none"


def in_use_bytes(device) -> float | None:
    try:
        return float((device.memory_stats() or {})["bytes_in_use"])
    except Exception:  # a backend without memory statistics
        return None


# Engines --------------------------------------------------------------------------------------------------------
class CaseEngines:
    """A case's engines with their weights on the chip (built once), and a call for each cell."""

    def __init__(self, case: Case, device, seed: int, log):
        self.case, self.device, self.seed, self.log = case, device, seed, log
        self.cfg, self.setup = case.config(), case.kernel_setup()
        self.weights: dict[str, dict] = {}
        self.steps: dict = {}

    def build(self, engine: str) -> None:
        t = time.perf_counter()
        with jax.default_device(self.device):
            if engine == "reference":
                mesh = make_mesh(1, [self.device])
                self.weights[engine] = device_params(self.cfg, self.seed, jnp.bfloat16, mesh)
                self.steps[engine] = reference_step(mesh)
            else:
                step = make_step(self.cfg, self.setup)
                tree = self._stand_in_weights(step) if self.setup.loopback else step.packed(self._kernel_tree())
                self.weights[engine], self.steps[engine] = tree, step
                for tiles in self.case.tiles:  # the other tiles read the same packed weights
                    if tiles != Tiles():
                        key = variant(engine, tiles)
                        self.steps[key] = make_step(self.cfg, self.setup, tiles=tiles)
                        self.weights[key] = tree
        jax.block_until_ready(self.weights[engine])
        self.log(f"{engine}: weights on the chip in {time.perf_counter() - t:.1f} s")

    def _kernel_tree(self) -> dict:
        """The model's weights drawn on the chip one tensor at a time and kept on the host (the kernel packs them on the
        chip layer by layer), INT8 experts quantized on the host where the case asks, a shipped format's codes encoded
        there or drawn at random (``Case.random_codes``)."""
        host = {p: np.asarray(x) for p, x in random_tensors(self.cfg, self.seed, jnp.bfloat16, self.device)}
        scheme = _scheme(self.case.dtype)
        if self.case.random_codes and scheme in FORMAT_SCHEMES:
            return random_codes(host, self.cfg, scheme, self.seed)
        return quantized_as(host, self.cfg, scheme)

    def _stand_in_weights(self, step) -> dict:
        """Chip 0's slice of the model, drawn at its own shapes (the whole model need not fit the host), packed."""
        local = chip_config(step.cfg, self.setup)
        host = {p: np.asarray(x) for p, x in random_tensors(local, self.seed, jnp.bfloat16, self.device)}
        return pack(quantized_as(host, local, _scheme(self.case.dtype)), local)

    def call(self, engine: str, cell: Cell, knockout=frozenset(), steps: int = 1, tiles: Tiles | None = None):
        """``engine``'s step for ``cell`` (a zero cache of its context, position context - 1; with ``steps`` > 1 that
        many greedy steps a call, ending there), ``knockout``'s components off, built with ``tiles`` (the kernel's:
        one of the case's, None its default), compiled and run twice: (the call, seconds to compile and run it)."""
        t = time.perf_counter()
        key = variant(engine, tiles)
        step, weights, multiple = self.steps[key], self.weights[key], cache_multiple(engine)
        with jax.default_device(self.device):
            if steps > 1:
                call = greedy_steps_call(step, weights, self.cfg, cell.context, cell.batch, "bf16", steps, multiple,
                                         knockout)  # fmt: skip
            else:
                call = decode_call(step, weights, self.cfg, cell.context, cell.batch, "bf16", knockout,
                                   cache_multiple=multiple)  # fmt: skip

        def placed():  # every call under the device its arrays were made on: a jit keyed alike, compiled once
            with jax.default_device(self.device):
                return call()

        placed.program_digest = call.program_digest
        return settled(placed), time.perf_counter() - t

    def close(self) -> None:
        """Let the case's weights go: its trees, its steps, and on a chip the compiled calls that hold them
        (mk.measure.harness.release_device_memory)."""
        self.weights.clear()
        self.steps.clear()
        release_device_memory(self.device, caches=True)


# Rows -----------------------------------------------------------------------------------------------------------
def runs_as(engine: str, case: Case, device) -> str:
    if engine == "reference":
        return "XLA, one chip" + ("" if case.alone is None else "; alone (the kernel does not fit beside it)")
    how = (
        "Pallas kernel compiled by Mosaic" if device.platform == "tpu" else "Pallas TPU interpret mode, no TPU's speed"
    )
    alone = "" if case.alone is None else "; alone (the other engine does not fit beside it), not interleaved"
    if case.kernel_setup().loopback:
        return f"{how}: chip 0 of a v5e-{SLICE}'s step, its exchanges local copies of the same bytes (a stand-in)"
    return f"{how}, one chip{alone}"


def limit_columns(row: dict, limit, spec_bw: float | None, chips: int) -> dict:
    """The row's step (host) and device step against the speed of light at the spec and at the measured limit."""
    per_token = row["bytes_per_token"]
    host_s, dev_s = row["step_ms"] / 1e3, row["device_step_ms"] / 1e3

    def frac(bw, s):
        return None if bw is None else float(f"{per_token / (bw * chips) / s:.4g}")

    return dict(
        device_tokens_per_s=round(1 / dev_s, 2),
        limit_GBps=None if limit is None else round(limit.bandwidth / 1e9, 2),
        limit_source=None if limit is None else limit.source,
        host_fraction_of_limit=frac(limit and limit.bandwidth, host_s),
        device_fraction_of_spec=frac(spec_bw, dev_s),
        device_fraction_of_limit=frac(limit and limit.bandwidth, dev_s),
    )


def complete(row: dict, limit, spec_bw: float | None, chips: int) -> dict:
    """A timed row (harness.time_engines's, with the device's times) with this table's other columns: its limits,
    and no profile or memory plan (a run that took neither)."""
    row = dict(row, profiled_step_ms=None, profile_source="not profiled", hbm_planned_GB=None, hbm_in_use_GB=None,
               kernel_revision=recorded_revision())  # fmt: skip
    row.update(limit_columns(row, limit, spec_bw, chips))
    return {k: row.get(k) for k in COLUMNS}


def cell_speed_of_light(engines: CaseEngines, cell: Cell):
    """(the speed of light a case's step at ``cell`` is timed against: its bytes a token over the spec bandwidth of the
    chips its step stands for, a v5e's off a TPU; those chips: a stand-in's slice, else one)."""
    chips = SLICE if engines.case.kernel_setup().loopback else 1
    per_token = bytes_per_token(engines.cfg, cell.context, cell.batch, engines.case.dtype).total
    device = engines.device
    return spec_speed_of_light(per_token, device, chips, "tpu-v5e" if device.platform != "tpu" else None), chips


def measure_cell(engines: CaseEngines, cell: Cell, limit, prov: dict, budget_s: float, log, steps: int,
                 min_rounds: int) -> tuple[list[dict], list[dict]]:  # fmt: skip
    """Both engines of a case at ``cell``, each at each of the case's steps a call: compiled, timed interleaved (host
    and device), profiled (one step a call); (its rows, where each engine's device time went: OP_COLUMNS rows)."""
    case, device = engines.case, engines.device
    sol, chips = cell_speed_of_light(engines, cell)
    timed, compile_s, built = [], {}, {}
    for name, tiles in case.timed():
        key = variant(name, tiles)
        for n in case.steps_a_call:
            e = TimedStep(key if n == 1 else f"{key}[{n} steps a call]", None, engine=name, columns={STEPS: n})
            e.call, compile_s[e.label] = engines.call(name, cell, steps=n, tiles=tiles)
            timed.append(e)
            built[e.label] = tiles
            log(f"{e.label}: compiled and run twice in {compile_s[e.label]:.1f} s")
    in_use = in_use_bytes(device)
    planned = sum(planned_bytes(case, e, cell)[0] for e in case.engines)
    run = dict(prov, model=engines.cfg.name, dtype=case.dtype, context=cell.context, batch=cell.batch,
               weights=f"random (seed {engines.seed})")  # fmt: skip
    _, rows = time_engines(timed, sol, run, budget_s, min_rounds=min_rounds, steps_back_to_back=steps, log=log)
    spec_bw = None if sol.chip == "" else get_chip(sol.chip).per_chip_bandwidth
    out, ops = [], []
    for e, row in zip(timed, rows):
        row, profiled, source = a_token(row, e.columns[STEPS]), None, "not profiled: several steps a call"
        setup = case.setup_label_at(built[e.label])
        if e.columns[STEPS] == 1:
            profile = device_profile(e.call, steps)
            profiled, source = profile.seconds, profile.source
            cell_of = {k: row.get(k) for k in OP_COLUMNS} | dict(engine=e.label, setup=setup)
            ops += [cell_of | {k: v for k, v in r.items() if k in OP_COLUMNS} | dict(us=round(r["seconds"] * 1e6, 3))
                    for r in op_summary(list(profile.ops), TOP_OPS)]  # fmt: skip
        row.update(
            base_model=get_config(case.model).name, layers=case.layers_label, setup=setup,
            kernel_revision=recorded_revision(),
            runs_as=runs_as(e.engine, case, device), compile_s=round(compile_s[e.label], 2), chip=sol.chip,
            profiled_step_ms=None if profiled is None else round(profiled * 1e3, 4), profile_source=source,
            hbm_planned_GB=round(planned / 1e9, 3), hbm_in_use_GB=None if in_use is None else round(in_use / 1e9, 3),
            **limit_columns(row, limit, spec_bw, chips),
        )  # fmt: skip
        out.append({k: row.get(k) for k in COLUMNS})
        log(
            f"{e.label}: host {row['step_ms']:.3f} ms, device {row['device_step_ms']:.3f} ms a step"
            + ("" if profiled is None else f", profiled {profiled * 1e3:.3f} ms")
            + ("" if row["device_fraction_of_limit"] is None else f", {row['device_fraction_of_limit']:.1%} of limit")
        )
    return out, ops


def a_token(row: dict, steps: int) -> dict:
    """A timed row of calls of ``steps`` decode steps as a step's: times over ``steps``, rates and fractions of the
    speed of light (a token's bytes against a call's time) times ``steps``."""
    if steps == 1:
        return row
    over = ("step_ms", "step_low_ms", "step_high_ms", "device_step_ms", "device_step_low_ms", "device_step_high_ms")
    rates = ("tokens_per_s", "tokens_per_s_total", "fraction_of_sol", "fraction_of_sol_low", "fraction_of_sol_high")
    return (
        row
        | {k: round(row[k] / steps, 4) for k in over if row.get(k) is not None}
        | {k: float(f"{row[k] * steps:.4g}") for k in rates if row.get(k) is not None}
    )


def done_cells(path: Path | str | None, backend: str) -> set[tuple]:
    """(model, dtype, setup, context, batch, engine, steps a call) of the rows ``path`` holds from a ``backend``
    device for the kernel in this tree (mk.timing.scheduled.current_kernel: a run resumed on one skips a cell every
    engine of whose case has a row; a new revision of the kernel, or code no revision records, measures every cell
    again)."""
    import pandas as pd

    if path is None or not Path(path).exists():
        return set()
    t = pd.read_csv(path)
    t = t[(t["backend"] == backend) & current_kernel(t)]
    steps = t[STEPS].fillna(1).astype(int) if STEPS in t else [1] * len(t)
    keys = zip(t.model, t["dtype"], t.setup, t.context.astype(int), t.batch.astype(int), t.engine, steps)
    return set(keys)


def measure_case(case: Case, out=None, seed: int = 0, budget_s: float = CELL_BUDGET_S, deadline: float | None = None,
                 limit=None, device=None, quiet: bool = False, steps: int = STEPS_BACK_TO_BACK,
                 min_rounds: int = 5) -> tuple[list[dict], list[str]]:  # fmt: skip
    """Every cell of ``case`` that fits the chip (the module's docstring), rows appended to ``out`` after each cell
    (None: none); cells already in ``out`` from this kind of device are skipped, and so is what is left at ``deadline``
    (time.perf_counter()). ``steps``: dispatched back to back for the device's time (and traced by the profiler).
    Returns (rows, notes: what was skipped and why)."""
    device = device or jax.devices()[0]
    log, notes, rows = Log(quiet), [], []
    cfg = case.config()
    setup_name = case.setup_label
    done = done_cells(out, device.platform)
    cells = [
        c for c in case.cells
        if any((cfg.name, case.dtype, case.setup_label_at(tiles), c.context, c.batch, e, n) not in done
               for e, tiles in case.timed() for n in case.steps_a_call)
    ]  # fmt: skip
    capacity = usable_hbm(device, HBM_USE)
    fitting = []
    for c in cells:
        need = sum(planned_bytes(case, e, c)[0] for e in case.engines)
        extra = max(planned_bytes(case, e, c)[1] for e in case.engines)
        if capacity is not None and need + extra > capacity:
            notes.append(f"{cfg.name} {case.dtype} context {c.context} batch {c.batch}: skipped, "
                         f"{' and '.join(case.engines)} need {(need + extra) / 1e9:.1f} GB, {capacity / 1e9:.1f} GB "
                         "usable")  # fmt: skip
            log(notes[-1])
        else:
            fitting.append(c)
    if not fitting:
        return rows, notes
    log(f"{cfg.name} {case.dtype} ({setup_name}): {len(fitting)} cells; planned per engine at the largest: "
        + ", ".join(f"{e} {planned_bytes(case, e, fitting[-1])[0] / 1e9:.2f} GB" for e in case.engines)
        + ("" if capacity is None else f" of {capacity / 1e9:.1f} GB usable"))  # fmt: skip
    engines = CaseEngines(case, device, seed, log)
    prov = provenance(device)
    try:
        for e in case.engines:
            engines.build(e)
        for c in fitting:
            if deadline is not None and time.perf_counter() > deadline:
                notes.append(f"{cfg.name} {case.dtype} context {c.context} batch {c.batch}: not measured, out of time")
                log(notes[-1])
                continue
            try:
                got, ops = measure_cell(engines, c, limit, prov, budget_s, log, steps, min_rounds)
            except Exception as e:  # a cell that does not compile or run: said, the run goes on
                first = str(e).strip().splitlines()
                notes.append(f"{cfg.name} {case.dtype} context {c.context} batch {c.batch}: failed "
                             f"({type(e).__name__}: {first[0] if first else ''})"[:400])  # fmt: skip
                log(notes[-1])
                release_device_memory(device)
                continue
            rows += got
            if out is not None:
                append_csv_rows(got, Path(out), COLUMNS, "an on-chip row")
                if ops:
                    append_csv_rows(ops, Path(out).with_name(TPU_OPS_CSV.name), OP_COLUMNS, "an op-profile row")
    finally:
        engines.close()
    return rows, notes
