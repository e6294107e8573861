"""``python -m mk tpu-smoke``: the megakernel's first run on a TPU, prepared as one command.

On a TPU VM or slice it finds the chips, checks the megakernel against the reference on them, times both
decode steps interleaved, and appends one row per engine timed to ``data/measured/tpu.csv``:

- **The chips**: ``jax.devices()``, all of them in a one-axis mesh (``chips``: the first N).
- **Parity**: over the chips a small model that fits anywhere (``parity_model``, default ``cpu-moe``), random f32
  weights (``seed``), a few users with prompts of different lengths: the megakernel's greedy tokens over the chips
  must be the reference's, for each expert placement asked (a dense model, or one chip, has none). With
  ``families`` and ``formats`` (``--family-parity``) first every family's tiny model and each compiled format on one
  chip, f32 and bf16 (mk.measure.chip_parity). Both run with f32 matrix products at full precision
  (``jax.default_matmul_precision("highest")``: XLA on a TPU otherwise multiplies f32 in one bf16 pass). Off a TPU
  the kernel runs in Pallas's TPU interpreter with its race detector on, and a race fails the check.

  Why the family checks wait to be asked for and the parity model does not: on one v5e the nineteen family checks
  took 229 s and the parity model 67 s (``tpu-smoke --model llama-3.2-1b`` when both ran by default, under a budget
  that counted them: it spent its 300 s before timing anything). The family checks are the work of
  ``tpu-measure --parts parity``, whose rows data/measured/tpu_parity.csv keeps; a smoke run need not repeat them.
  The parity model stays: it is the one check that this chip, JAX and libtpu give the reference's tokens from the
  kernel about to be timed (a fast wrong kernel is no result), and on a slice the only check of the experts placed
  over its chips, for about a minute.
- **Timing**: the decode step of each engine at position ``context - 1`` of a zero cache of ``context``
  positions (``mk.measure.steps.decode_call``; decode time does not depend on what the cache holds), random
  weights (seed 0, the same draws for both: ``mk.weights.random_tensors``), full size, bf16 by default, timed
  interleaved round by round (``mk.measure.harness.time_engines``, mk.measure.loop's one loop: each median
  step known to +-1%, medians with 95% intervals), one step waited on (the host's time) and ``steps`` dispatched
  back to back, waited on once (the device's). The reference runs
  as XLA compiles it, its parameters and cache split over the mesh for GSPMD to partition
  (``mk.sharding.gspmd_sharding``); the megakernel as ``python -m mk generate --engine megakernel
  --chips N`` runs it, each chip's slice packed on that chip.
- **Memory**: what each engine holds per chip (the reference's arrays as split; the megakernel's inputs as
  its plan lays them out, ``mk.megakernel.refs.input_shapes``, and its packing's transient copy) against
  ``HBM_USE`` of a chip's HBM (the device's own figure, else ``data/chips.csv``'s). The engines that fit
  together are timed together; where they do not, each megakernel placement beside the reference, else each
  alone; an engine that does not fit even alone, or whose build runs out of memory all the same
  (RESOURCE_EXHAUSTED), is skipped and the run says so.
- **Speed of light**: ``mk.sol``'s bytes per step over the chips' spec HBM bandwidth from data/chips.csv,
  where the device is a known chip (``mk.chips.known_chip``: tpu-v5e, tpu-v6e, tpu-v7x) or ``chip`` names
  one; otherwise it is unknown and the row says so; on a TPU also its measured limit (mk.chips.measured_limit).
- **Budget**: ``budget_s`` for the builds and the timing, counted from the end of the checks. The checks run to
  their end, whatever they take, before it starts (their seconds are logged): a check cannot be cut short, and a
  budget that counted them left the timing nothing. A build started before the deadline runs to its end (a compile
  cannot be interrupted); the timing gets what is left, at least ``MIN_TIMING_S`` per group, and a group not started
  by the deadline is skipped, said so. A run takes the checks' time, then about ``budget_s`` at most.

``require_tpu=False`` runs the same path anywhere (the tests: the CPU's simulated devices, the kernel in
interpret mode); every row names its device and how the kernel ran, so a CPU row is never taken for a TPU's.
Rows have mk.measure.on_chip's columns (data/measured/tpu.csv is one table, written by ``tpu-measure`` too); the
arrays of one group of engines are let go before the next group's are built.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from ..chips import get_chip, measured_limit
from ..config import ModelConfig, get_config
from ..files import append_csv_rows
from ..generate import cache_multiple, generate
from ..kernel_setup import KernelSetup
from ..megakernel import make_step
from ..megakernel.refs import input_shapes
from ..params import param_specs
from ..paths import TPU_CSV
from ..plan import build_plan, round_up
from ..progress import Log
from ..reference import forget_prepared, init_cache
from ..sharding import chip_config
from ..sharding.mesh import make_mesh
from ..sol import bytes_per_token
from ..tpu import on_tpu, races_detected, reset_interpreter
from ..units import positive_int
from ..weights import device_params, random_params, random_tensors
from . import chip_parity, on_chip
from .harness import (
    HBM_USE,
    MIN_TIMING_S,
    TimedStep,
    array_dtype,
    provenance,
    release_device_memory,
    spec_speed_of_light,
    time_engines,
    unknown_speed_of_light,
    usable_hbm,
)
from .steps import decode_call, reference_step, settled

COLUMNS = on_chip.COLUMNS  # one table of steps measured on TPUs, data/measured/tpu.csv
STEPS_BACK_TO_BACK = 20  # a step's device time: this many dispatched back to back, waited on once
PLACEMENTS = ("whole", "split")
NO_PLACEMENT = "-"  # a dense model, or one chip: experts are not placed
PARITY_PROMPTS = (7, 3, 12)  # the parity users' prompt lengths: ragged, each decoding from its own position
PARITY_NEW_TOKENS = 4
# ``tpu-smoke --family-parity``: every family's tiny model and every format checked on one chip before the parity model
FAMILY_PARITY = dict(families=chip_parity.FAMILIES, formats=chip_parity.FORMATS)


class NoTPU(RuntimeError):
    """This process found no TPU (``run(require_tpu=True)``)."""


def no_tpu_message() -> str:
    return (
        f"tpu-smoke: no TPU found (JAX backend: {jax.default_backend()}); run it on a TPU VM or slice "
        "(pip install -r requirements-tpu.txt)"
    )


@dataclass(frozen=True)
class EngineChoice:
    """One engine to time: the reference, or the megakernel with its experts placed."""

    name: str  # "reference" or "megakernel"
    placement: str = NO_PLACEMENT

    @property
    def label(self) -> str:
        return self.name if self.placement == NO_PLACEMENT else f"{self.name}[{self.placement}]"


@dataclass
class Result:
    """A run: the rows written (or that would be), the parity check per placement, and what was skipped or
    failed and why."""

    rows: list[dict]
    parity: list[dict]
    notes: list[str]
    failed: bool  # parity did not hold, or an engine failed (not for lack of memory)
    csv: Path | None = None
    family_checks: list = field(default_factory=list)  # mk.measure.chip_parity's rows: every family and format

    def to_dict(self) -> dict:
        return dict(
            rows=self.rows,
            parity=self.parity,
            notes=self.notes,
            failed=self.failed,
            csv=self.csv and str(self.csv),
            family_checks=self.family_checks,
        )


# Checks -------------------------------------------------------------------------------------------------
def placements_for(cfg: ModelConfig, chips: int, asked) -> tuple[str, ...]:
    """The expert placements to run ``cfg`` under on ``chips`` chips: those asked, for an MoE model over
    several chips; none otherwise. A placement the chips do not divide is refused (mk.sharding.chip_config)."""
    if not cfg.is_moe or chips == 1:
        return (NO_PLACEMENT,)
    for p in asked:
        chip_config(cfg, KernelSetup(chips, p))
    return tuple(asked)


# Parity ---------------------------------------------------------------------------------------------------
def parity_prompts(cfg: ModelConfig, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, cfg.vocab_size, n).tolist() for n in PARITY_PROMPTS]


def check_parity(cfg: ModelConfig, chips: int, placements, new_tokens: int, seed: int, log) -> list[dict]:
    """The megakernel's greedy tokens over ``chips`` chips against the reference's, random f32 weights, ragged
    prompts: one row per placement (same_tokens, the first token that differs, races off a TPU, an error)."""
    params = random_params(cfg, seed)
    prompts = parity_prompts(cfg, seed)
    interpret = not on_tpu()
    rows = []
    with jax.default_matmul_precision("highest"):
        want = generate(params, cfg, prompts, new_tokens)
        for placement in placements:
            options = dict(setup=_setup(chips, placement), detect_races=interpret)
            row = dict(placement=placement, same_tokens=False, first_difference="", races=None, error="")
            t = time.perf_counter()
            try:
                if interpret:
                    reset_interpreter()
                got = generate(params, cfg, prompts, new_tokens, engine="megakernel", engine_options=options)
                row["races"] = races_detected() if interpret else None
                row["same_tokens"] = bool(np.array_equal(got, want))
                diff = np.argwhere(got != want)
                if len(diff):
                    u, n = diff[0]
                    row["first_difference"] = f"user {u}, new token {n}: {got[u, n]} != {want[u, n]}"
            except Exception as e:  # a kernel that does not compile or run here: the check fails, the run goes on
                row["error"] = _first_line(e)
            row["held"] = row["same_tokens"] and not row["races"]
            rows.append(row)
            why = row["error"] or row["first_difference"] or ("the race detector fired" if row["races"] else "")
            log(
                f"parity, {placement if placement != NO_PLACEMENT else 'no placement'}: "
                f"{'held' if row['held'] else 'FAILED (' + why + ')'} in {time.perf_counter() - t:.1f} s"
            )
    return rows


def _setup(chips: int, placement: str):
    """The kernel's setup over ``chips`` chips with its experts placed so (KernelSetup's default without a
    placement: a dense model, or one chip)."""
    return KernelSetup(chips) if placement == NO_PLACEMENT else KernelSetup(chips, placement)


# Memory ---------------------------------------------------------------------------------------------------
def _bytes(shapes) -> float:
    return float(sum(math.prod(s.shape) * jnp.dtype(s.dtype).itemsize for s in jax.tree.leaves(shapes)))


def _split_bytes(shape: tuple[int, ...], itemsize: int, chips: int) -> float:
    """One chip's bytes of an array split as gspmd_sharding splits it."""
    n = math.prod(shape) * itemsize
    return n / chips if any(d % chips == 0 for d in shape) else n


def hbm_per_chip_needed(cfg: ModelConfig, engine: EngineChoice, chips: int, context: int, batch: int, dtype: str):
    """(bytes one chip holds for ``engine``'s step, bytes more while it is built). The reference: its
    decode layout (every expert its own array, ``mk.reference.prepare``) and its cache, split as
    gspmd_sharding splits them. The megakernel: its inputs as its plan lays them out on one chip (padded,
    ``refs.input_shapes``), and while packing, one stacked weight beside the layers it is stacked from."""
    item = array_dtype(dtype).itemsize
    if engine.name == "reference":
        weights = 0.0
        for s in param_specs(cfg):
            experts = s.path.startswith("layers.") and len(s.shape) == 3
            shape = s.shape[1:] if experts else s.shape
            weights += _split_bytes(shape, item, chips) * (s.shape[0] if experts else 1)
        cache = jax.eval_shape(lambda: init_cache(cfg, batch, context, array_dtype(dtype)))
        kv = sum(_split_bytes(a.shape, item, chips) for a in cache.values())
        return weights + kv, 0.0

    setup = _setup(chips, engine.placement)
    max_len = round_up(context, cache_multiple("megakernel"))
    arrays = array_dtype(dtype).name
    plan = build_plan(cfg, batch, max_len, context, weight_dtype=arrays, kv_dtype=arrays, setup=setup)
    shapes = input_shapes(plan)
    return _bytes(shapes), max(_bytes(w) for w in shapes.weights.values())


def groups_that_fit(needs: dict[str, tuple[float, float]], capacity: float | None):
    """Which engines to time together, given each one's (bytes per chip, extra bytes while built) and what a
    chip may hold (None: unknown, all together): all of them if they fit; else each megakernel beside the
    reference if every such pair fits; else each alone. Returns (groups of labels, {label: why skipped})
    for the engines that do not fit even alone. A group fits when its engines' bytes, plus the largest extra
    of a build, fit (the engines are built one after the other)."""

    def fits(group) -> bool:
        return capacity is None or sum(needs[e][0] for e in group) + max(needs[e][1] for e in group) <= capacity

    skipped = {
        e: f"needs {(n + extra) / 1e9:.1f} GB per chip, {capacity / 1e9:.1f} GB usable"
        for e, (n, extra) in needs.items()
        if not fits([e])
    }
    left = [e for e in needs if e not in skipped]
    if not left:
        return [], skipped
    if fits(left):
        return [left], skipped
    ref, rest = "reference", [e for e in left if e != "reference"]
    if ref in left and all(fits([ref, e]) for e in rest):
        return [[ref, e] for e in rest], skipped
    return [[e] for e in left], skipped


def _out_of_memory(e: BaseException) -> bool:
    """XLA refusing an allocation: a runtime error with status RESOURCE_EXHAUSTED."""
    return isinstance(e, RuntimeError) and "RESOURCE_EXHAUSTED" in str(e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]


# Engines ----------------------------------------------------------------------------------------------------
class _EngineBuilds:
    """Builds each engine's step on the mesh: the reference's weights drawn split over it, the megakernel's
    drawn there too and brought to the host, from where each chip packs its slice (kept for every placement
    until the last megakernel is built)."""

    def __init__(self, cfg, mesh, context, batch, dtype, seed, log, megakernels: int):
        self.cfg, self.mesh, self.seed, self.log = cfg, mesh, seed, log
        self.context, self.batch, self.dtype = context, batch, dtype
        self.host: dict | None = None
        self.megakernels_left = megakernels

    def build(self, engine: EngineChoice, columns: dict) -> TimedStep:
        """``engine``'s step compiled and run twice, its row's own ``columns`` beside its compile time."""
        cfg, chips = self.cfg, self.mesh.size
        t = time.perf_counter()

        def log(msg: str) -> None:
            self.log(f"{engine.label}: {msg}")

        try:
            if engine.name == "reference":
                params = device_params(cfg, self.seed, array_dtype(self.dtype), self.mesh, log)
                call = decode_call(reference_step(self.mesh), params, cfg, self.context, self.batch, self.dtype)
            else:
                if self.host is None:
                    tensors = random_tensors(cfg, self.seed, array_dtype(self.dtype), self.mesh, log)
                    self.host = {path: np.asarray(x) for path, x in tensors}
                    log(f"weights: {_bytes(self.host) / 1e9:.2f} GB on the host, each chip packs its slice")
                step = make_step(cfg, _setup(chips, engine.placement), detect_races=not on_tpu())
                multiple = cache_multiple("megakernel")
                call = decode_call(step, self.host, cfg, self.context, self.batch, self.dtype, cache_multiple=multiple)
            log(f"weights and cache placed in {time.perf_counter() - t:.1f} s; compiling")
            t = time.perf_counter()
            settled(call)
        finally:
            if engine.name == "megakernel":
                self.megakernels_left -= 1
                if not self.megakernels_left:
                    self.host = None  # every placement has packed its own copy
        compile_s = time.perf_counter() - t
        log(f"compiled and run twice in {compile_s:.1f} s")
        return TimedStep(engine.label, call, engine.name, {**columns, "compile_s": round(compile_s, 2)})


# Timing -----------------------------------------------------------------------------------------------------
def _runs_as(engine: EngineChoice, dev, chips: int) -> str:
    if engine.name == "reference":
        return "XLA" + (f", GSPMD over {chips} chips" if chips > 1 else ", one chip")
    if on_tpu():
        return f"Pallas kernel compiled by Mosaic, {chips} chip(s)"
    return f"Pallas TPU interpret mode on {chips} {dev.platform} device(s), races checked: no TPU's speed"


# The run ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SmokeRun:
    """What one ``tpu-smoke`` run checks and times (the module's docstring). ``out``: the CSV the rows are appended
    to (None: no file); ``require_tpu``: refuse (NoTPU) anywhere but on a TPU; ``chip``: the speed of light's chip
    where the device is none of data/chips.csv's; ``min_rounds``, ``max_rounds``: the timing loop's (None:
    mk.measure.loop.MAX_ROUNDS); ``families``, ``formats``: the tiny models and formats checked on one chip first
    (mk.measure.chip_parity; none by default, :data:`FAMILY_PARITY` for every one); ``steps``: dispatched back to back
    for the device's time of a step. Checked when made."""

    model: ModelConfig | str = "gemma4-26b-a4b"
    parity_model: ModelConfig | str = "cpu-moe"
    context: int = 1024
    batch: int = 1
    placements: tuple[str, ...] = PLACEMENTS
    chips: int | None = None
    budget_s: float = 300.0
    out: Path | str | None = TPU_CSV
    require_tpu: bool = True
    chip: str | None = None
    dtype: str = "bf16"
    seed: int = 0
    parity_tokens: int = PARITY_NEW_TOKENS
    min_rounds: int = 7
    max_rounds: int | None = None
    quiet: bool = False
    families: tuple[str, ...] = ()
    formats: tuple[tuple[str, str], ...] = ()
    steps: int = STEPS_BACK_TO_BACK

    def __post_init__(self):
        object.__setattr__(self, "placements", tuple(self.placements))
        cfgs = (self.cfg, self.parity_cfg)  # an unknown model is refused here
        positive_int("context", self.context)
        positive_int("batch", self.batch)
        if self.chips is not None:
            positive_int("chips", self.chips)
        placements = self.placements
        if not placements or any(p not in PLACEMENTS for p in placements) or len(set(placements)) != len(placements):
            raise ValueError(f"placements must be some of {PLACEMENTS}, each once, got {placements!r}")
        array_dtype(self.dtype)
        if not self.budget_s > 0:
            raise ValueError(f"budget_s must be positive, got {self.budget_s!r}")
        if self.chips is not None:  # refused before JAX looks for chips
            for c in cfgs:
                placements_for(c, self.chips, placements)
        if self.chip is not None:
            get_chip(self.chip)

    @cached_property
    def cfg(self) -> ModelConfig:
        return get_config(self.model)

    @cached_property
    def parity_cfg(self) -> ModelConfig:
        return get_config(self.parity_model)


@dataclass
class _Timing:
    """The engines one run times, the speed of light of their rows, and the groups that fit a chip together."""

    engines: dict[str, EngineChoice]  # by label
    sol: object  # mk.measure.harness's speed of light
    groups: list[list[str]]
    skipped: dict[str, str]  # label -> why it does not fit


def _mesh(smoke: SmokeRun):
    devices = jax.devices()
    n = smoke.chips or len(devices)
    if n > len(devices):
        raise ValueError(
            f"chips: {n} asked, this process sees {len(devices)} {devices[0].platform} device(s) "
            f"({devices[0].device_kind}); ask for at most {len(devices)}"
        )
    return make_mesh(n, devices[:n]), devices[0]


def _check_parity(smoke: SmokeRun, chips: int, log) -> tuple[list, list[dict]]:
    """The tiny models and formats asked for (``families``, ``formats``) on one chip, then ``parity_model`` over the
    chips."""
    t = time.perf_counter()
    family_checks = chip_parity.run_checks(chip_parity.checks(smoke.families, smoke.formats), smoke.seed, smoke.quiet)
    if family_checks:
        log(f"parity of {len(family_checks)} tiny models and formats on one chip: {time.perf_counter() - t:.0f} s")
    cfg = smoke.parity_cfg
    log(
        f"parity: {cfg.name} f32, {len(PARITY_PROMPTS)} users (prompts of {', '.join(map(str, PARITY_PROMPTS))} "
        f"tokens), {smoke.parity_tokens} new tokens, {chips} chip(s), seed {smoke.seed}"
        + ("" if on_tpu() else ", races checked")
    )
    places = placements_for(cfg, chips, smoke.placements)
    parity = check_parity(cfg, chips, places, smoke.parity_tokens, smoke.seed, log)
    forget_prepared()  # the reference kept the parity model's decode layout on the first chip
    return family_checks, parity


def _timing(smoke: SmokeRun, chips: int, dev, log) -> _Timing:
    """The engines to time, what each needs of a chip's HBM, and the groups that fit together."""
    cfg, context, batch, dtype = smoke.cfg, smoke.context, smoke.batch, smoke.dtype
    engines = [EngineChoice("reference")]
    engines += [EngineChoice("megakernel", p) for p in placements_for(cfg, chips, smoke.placements)]
    per_token = bytes_per_token(cfg, context, batch, dtype).total
    sol = spec_speed_of_light(per_token, dev, chips, smoke.chip) or unknown_speed_of_light(per_token, dev)
    capacity = usable_hbm(dev, HBM_USE)
    needs = {e.label: hbm_per_chip_needed(cfg, e, chips, context, batch, dtype) for e in engines}
    groups, skipped = groups_that_fit(needs, capacity)
    log(
        f"{cfg.name}, {dtype}, context {context}, batch {batch}; speed of light: {sol.source}; per chip "
        + ", ".join(f"{k} {v[0] / 1e9:.2f} GB" for k, v in needs.items())
        + (f" of {capacity / 1e9:.1f} GB usable" if capacity else " (HBM unknown: not checked)")
        + f"; timed as {' then '.join('[' + ', '.join(g) + ']' for g in groups) or 'nothing'}"
    )
    return _Timing({e.label: e for e in engines}, sol, groups, skipped)


def _build_group(
    group, built: dict, failed_builds: set, builds: _EngineBuilds, timing: _Timing, dev, notes, log
) -> bool:
    """Build the engines of ``group`` not built yet (an engine that failed once is not tried again); whether one
    failed for another reason than memory."""
    failed, chips = False, builds.mesh.size
    for label in group:
        if label in built or label in failed_builds:
            continue
        engine = timing.engines[label]
        try:
            row_columns = dict(setup=_setup_word(engine, chips), runs_as=_runs_as(engine, dev, chips))
            built[label] = builds.build(engine, row_columns)
        except Exception as e:
            failed_builds.add(label)
            release_device_memory(dev)
            if _out_of_memory(e):
                notes.append(f"{label}: skipped, it ran out of memory ({_first_line(e)})")
            else:
                failed = True
                notes.append(f"{label}: failed ({_first_line(e)})")
            log(notes[-1])
    return failed


def _time_groups(smoke: SmokeRun, timing: _Timing, mesh, dev, prov, deadline, notes, log) -> tuple[list[dict], bool]:
    """Each group built (the previous group's arrays let go first) and timed interleaved: the rows, and whether an
    engine failed."""
    cfg, chips = smoke.cfg, mesh.size
    megakernels = sum(timing.engines[x].name == "megakernel" for g in timing.groups for x in g)
    builds = _EngineBuilds(cfg, mesh, smoke.context, smoke.batch, smoke.dtype, smoke.seed, log, megakernels)
    run_columns = dict(prov, model=cfg.name, dtype=smoke.dtype, context=smoke.context, batch=smoke.batch)
    run_columns.update(weights=f"random (seed {smoke.seed})", chip=timing.sol.chip, base_model=cfg.name, layers="all")
    limit = measured_limit(timing.sol.chip) if timing.sol.chip and on_tpu() else None  # a chip's, for its rows
    spec = get_chip(timing.sol.chip).per_chip_bandwidth if timing.sol.chip else None
    built: dict[str, TimedStep] = {}
    failed_builds: set[str] = set()
    rows, failed = [], False
    for i, group in enumerate(timing.groups):
        for label in [x for x in built if x not in group]:
            del built[label]
        release_device_memory(dev)
        if time.perf_counter() >= deadline:
            notes.append(
                f"{', '.join(group)}: not timed, the {smoke.budget_s:g} s budget for the builds and the timing was "
                "spent (a larger --budget-s)"
            )
            log(notes[-1])
            continue
        failed |= _build_group(group, built, failed_builds, builds, timing, dev, notes, log)
        ready = [built[x] for x in group if x in built]
        if not ready:
            continue
        seconds = max(MIN_TIMING_S, (deadline - time.perf_counter()) / (len(timing.groups) - i))
        _, timed = time_engines(
            ready,
            timing.sol,
            run_columns,
            seconds,
            min_rounds=smoke.min_rounds,
            max_rounds=smoke.max_rounds,
            warmup=1,  # each has run once already (its compile)
            log=log,
            steps_back_to_back=smoke.steps,
        )
        rows += [on_chip.complete(r, limit, spec, chips) for r in timed]
        del ready  # the group's arrays go with their engines before the next group's are built
    built.clear()
    return rows, failed


def run(smoke: SmokeRun) -> Result:
    """Check the megakernel against the reference on this machine's chips and time both (the module's docstring);
    append the rows to ``smoke.out``."""
    if smoke.require_tpu and not on_tpu():
        raise NoTPU(no_tpu_message())
    log = Log(smoke.quiet)
    mesh, dev = _mesh(smoke)
    prov = provenance(dev, chips=mesh.size)
    log(
        f"{mesh.size} x {dev.device_kind} ({dev.platform}); JAX {prov['jax_version']}, jaxlib {prov['jaxlib_version']},"
        f" libtpu {prov['libtpu_version']}, commit {prov['commit']}"
    )
    family_checks, parity = _check_parity(smoke, mesh.size, log)
    deadline = time.perf_counter() + smoke.budget_s  # the checks ran outside the budget (the module's docstring)
    log(f"checks done; {smoke.budget_s:g} s for the builds and the timing")
    timing = _timing(smoke, mesh.size, dev, log)
    notes = [f"{label}: skipped, it does not fit the chips' HBM ({why})" for label, why in timing.skipped.items()]
    for note in notes:
        log(note)
    rows, engine_failed = _time_groups(smoke, timing, mesh, dev, prov, deadline, notes, log)
    written = None
    if smoke.out is not None and rows:
        written = append_csv_rows(rows, Path(smoke.out), COLUMNS, "a tpu-smoke row")
        log(f"appended {len(rows)} rows to {written}")
    held = all(r["held"] for r in parity) and all(r["held"] for r in family_checks)
    return Result(rows, parity, notes, engine_failed or not rows or not held, written, family_checks)


def _setup_word(engine: EngineChoice, chips: int) -> str:
    """A row's setup: the megakernel's chips and where its experts live; the reference's GSPMD split."""
    if chips == 1:
        return on_chip.ONE_CHIP_SETUP
    if engine.name == "reference":
        return f"GSPMD over {chips} chips"
    return f"{chips} chips" + ("" if engine.placement == NO_PLACEMENT else f", {engine.placement} experts")


def _device_words(r: dict) -> str:
    """A row's device time a step (steps back to back: what the chip takes, the host's wait left out) and its share of
    the chip's measured limit, else of the speed of light at the data sheet's bandwidth; the host's share where no
    device time was taken."""
    if r.get("device_step_ms") is None:
        return "" if r["fraction_of_sol"] is None else f"  {100 * r['fraction_of_sol']:.3g}% of the speed of light"
    limit, spec = r.get("device_fraction_of_limit"), r.get("device_fraction_of_spec")
    share = (f", {limit:.1%} of the measured limit" if limit is not None
             else f", {spec:.1%} of the data sheet's bandwidth" if spec is not None else "")  # fmt: skip
    return (f"; device {r['device_step_ms']:.3f} ms ({r['device_step_low_ms']:.3f}-{r['device_step_high_ms']:.3f})"
            f"{share}")  # fmt: skip


def text(result: Result) -> str:
    """The run as a few readable lines."""
    lines = []
    if result.rows:
        r0 = result.rows[0]
        lines.append(
            f"{r0['model']}, {r0['dtype']}, context {r0['context']}, batch {r0['batch']} on {r0['chips']} x "
            f"{r0['device']} (measured {r0['date']}; JAX {r0['jax_version']}, libtpu {r0['libtpu_version']}, "
            f"commit {r0['commit']}; speed of light: {r0['sol_source']})"
        )
        for r in result.rows:
            label = f"{r['engine']} ({r['setup']})"
            lines.append(
                f"  {label:<19} host {r['step_ms']:.3f} ms ({r['step_low_ms']:.3f}-{r['step_high_ms']:.3f}, "
                f"{r['rounds']} rounds, {r['tokens_per_s']:.1f} tok/s){_device_words(r)}"
            )
    else:
        lines.append("nothing was timed")
    checks = ", ".join(
        f"{p['placement'] if p['placement'] != NO_PLACEMENT else 'one run'} {'held' if p['held'] else 'FAILED'}"
        for p in result.parity
    )
    lines.append(f"  parity: {checks}")
    if result.family_checks:
        failed = [f"{r['model']} {r['dtype']}" + ("" if r["quantize"] == "none" else f" {r['quantize']}")
                  for r in result.family_checks if not r["held"]]  # fmt: skip
        held = len(result.family_checks) - len(failed)
        lines.append(
            f"  family parity: {held} of {len(result.family_checks)} held"
            + (f" (FAILED: {', '.join(failed)})" if failed else "")
        )
    lines += [f"  note: {n}" for n in result.notes]
    if result.csv is not None:
        lines.append(f"  appended to {result.csv}")
    return "\n".join(lines)
