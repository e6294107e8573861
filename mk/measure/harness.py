"""What every measurement driver shares (mk.measure.cpu, .gpu, .tpu): the row schema, the provenance and
versions collector, the speed of light a row is set against, and timing engines into rows.

- **Rows**: ``SHARED`` columns, each with one name in every CSV of data/measured/ (the fraction of the speed of
  light is ``fraction_of_sol``), then a driver's own (``columns``): where and when (date, device, backend,
  chips, the software's versions, the commit), what (engine, model, dtype, context, batch, weights), the step
  (rounds, what it was interleaved with, median and 95% interval, tokens/s, the machine's load) and the speed of
  light (bytes per token, where its bandwidth comes from, the fraction reached with its interval). Each driver
  appends its rows with mk.files.append_csv_rows, which refuses a file with other columns.
- **Versions**: JAX, jaxlib, libtpu, torch and transformers as installed (read from their packages: nothing is
  imported; "none" where absent), CUDA as JAX's GPU client and torch (when the run used it) report it.
- **Code**: the commit as git (or, in a copy without its .git, ``$MK_COMMIT``) states it, and what ran, computed from
  the files where it runs: ``code_digest``, the digest of mk/'s source, and ``kernel_digest``, of mk/megakernel/'s
  (mk.files.source_digest; data/kernel_revisions.csv names the revision a kernel digest is); and each engine's row
  the digest of the program it timed (``program_digest``: mk.measure.steps.traced_digest; blank for a step that is
  no JAX program, transformers').
- **Speed of light**: ``mk.sol``'s bytes per step over the chips' spec bandwidth (data/chips.csv, where the
  device is a known chip or one is named), or over a GEMV probe's timed in the same rounds, round by round, or
  unknown (the row says so, and has no fraction).
- **Timing**: ``time_engines`` runs the engines (and the probe) through mk.measure.loop's one loop and
  stopping rule, and gives one row per engine.
"""

from __future__ import annotations

import datetime
import gc
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import jax
import jax.numpy as jnp

from ..chips import get_chip, known_chip, slice_of
from ..dtypes import BASES, get_dtype
from ..files import git_commit, source_digest
from ..profiling import Estimate, device_name, fraction_of_sol, gemv_probe
from ..timing.scheduled import kernel_digest
from ..tpu import libtpu_version
from ..units import significant
from .loop import MIN_ROUNDS, PRECISION, Comparison, back_to_back, interleaved


def array_dtype(policy: str):
    """The JAX element type of a measured step's weights and cache under ``policy`` (mk.dtypes.BASES: ``f32`` or
    ``bf16``, each also the policy that counts its bytes), or a refusal naming them."""
    if policy not in BASES:
        raise ValueError(f"dtype must be one of {list(BASES)}, got {policy!r}")
    return jnp.dtype(get_dtype(policy).arrays)


MIN_TIMING_S = 3.0  # the least a group of engines is timed for, whatever is left of a run's budget
PROBE = "probe"  # the GEMV probe's name in the rounds
BACK_TO_BACK = " back to back"  # appended to an engine's label for its steps dispatched back to back in the rounds
# a driver's own columns for the device's time a step (steps dispatched back to back, waited on once), where it asks
DEVICE_TIMING = ("steps_back_to_back", "device_step_ms", "device_step_low_ms", "device_step_high_ms")

PROVENANCE = (
    "date",
    "device",
    "backend",
    "chips",
    "jax_version",
    "jaxlib_version",
    "libtpu_version",
    "torch_version",
    "transformers_version",
    "cuda_version",
    "commit",
    "code_digest",
    "kernel_digest",
)
RUN = ("engine", "program_digest", "model", "dtype", "context", "batch", "weights")
TIMING = (
    "rounds",
    "interleaved_with",
    "step_ms",
    "step_low_ms",
    "step_high_ms",
    "tokens_per_s",
    "tokens_per_s_total",
    "load_before",
    "load_after",
)
SOL = (
    "bytes_per_token",
    "sol_source",
    "sol_bandwidth_GBps",
    "sol_bandwidth_low_GBps",
    "sol_bandwidth_high_GBps",
    "sol_tokens_per_s",
    "fraction_of_sol",
    "fraction_of_sol_low",
    "fraction_of_sol_high",
)
SHARED = PROVENANCE + RUN + TIMING + SOL


def columns(*own: str) -> tuple[str, ...]:
    """A driver's CSV columns: the shared ones, then its own."""
    clash = sorted(set(own) & set(SHARED))
    if clash or len(set(own)) != len(own):
        raise ValueError(f"a driver's own columns must be new and each once; {clash or own} are not")
    return SHARED + own


# Provenance -----------------------------------------------------------------------------------------------
def versions(device=None) -> dict:
    """The software a measurement ran on ("none" where not installed), the commit and the code's digests (module
    docstring)."""
    from importlib import metadata

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "none"

    cuda = []
    if device is not None and device.platform == "gpu":
        cuda.append(f"jax: {' '.join(str(device.client.platform_version).split())}")
    torch = sys.modules.get("torch")  # its CUDA only where this run used it: importing torch is slow
    if torch is not None and torch.version.cuda:
        cuda.append(f"torch: {torch.version.cuda}")
    return dict(
        jax_version=jax.__version__,
        jaxlib_version=installed("jaxlib"),
        libtpu_version=libtpu_version(),
        torch_version=installed("torch"),
        transformers_version=installed("transformers"),
        cuda_version="; ".join(cuda) or "none",
        commit=git_commit() or "unknown",
        code_digest=source_digest(),
        kernel_digest=kernel_digest(),
    )


# The first day every driver records the code's digests (the rows before it carry none: blank, not recorded)
DIGESTS_FROM = "2026-12-07"
# the columns a chip check's rows lead with
CHIP_PROVENANCE = ("date", "device", "jax_version", "libtpu_version", "commit", "code_digest", "kernel_digest")


def chip_provenance(device=None) -> dict:
    """:func:`provenance`'s :data:`CHIP_PROVENANCE` columns."""
    prov = provenance(device)
    return {k: prov[k] for k in CHIP_PROVENANCE}


def provenance(device=None, chips: int = 1) -> dict:
    """Where and when a measurement is taken: date (UTC), device, backend, the chips it runs on, versions."""
    device = device or jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device_name(device),
        "backend": device.platform,
        "chips": chips,
        **versions(device),
    }


# The speed of light ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MeasuredSpeedOfLight:
    """Where a run's speed of light comes from: ``bytes_per_step`` (mk.sol) over ``bandwidth`` (bytes/s, a
    spec), or over ``probe``'s bandwidth in each round (it reads ``probe_bytes``, counted ``chips`` times:
    the chips the step runs on), or unknown (neither)."""

    source: str
    bytes_per_step: float
    bandwidth: float | None = None
    chip: str = ""  # the chip or slice of data/chips.csv, "" where none
    probe: Callable[[], Any] | None = field(default=None, repr=False)
    probe_bytes: int = 0
    chips: int = 1

    @property
    def known(self) -> bool:
        return self.probe is not None or self.bandwidth is not None

    def bandwidths(self, times: dict[str, list[float]]) -> list[float] | None:
        """The bandwidth in each round of ``times`` (bytes/s); None where unknown."""
        if self.probe is not None:
            return [self.chips * self.probe_bytes / t for t in times[PROBE]]
        if self.bandwidth is None:
            return None
        return [self.bandwidth] * len(next(iter(times.values())))

    def fractions(self, times: dict[str, list[float]], name: str) -> list[float] | None:
        """``name``'s fraction of the speed of light round by round: the bytes over that round's bandwidth,
        over that round's step (a slow round slows a probe and the step together: the pairs cancel it)."""
        bw = self.bandwidths(times)
        return None if bw is None else [fraction_of_sol(t, self.bytes_per_step, b) for t, b in zip(times[name], bw)]


def spec_speed_of_light(bytes_per_step: float, device, chips: int = 1, chip: str | None = None):
    """The speed of light over the spec bandwidth of ``chips`` chips of ``chip`` (or of the chip ``device``
    is) from data/chips.csv; None where the device is no known chip and none is named."""
    name = chip or known_chip(device)
    if name is None:
        return None
    base = get_chip(name).base
    c = slice_of(base, chips)
    given = "" if name == known_chip(device) else f"; given, the device is {device_name(device)}"
    source = f"{c.name} spec ({c.hbm_bandwidth / 1e12:.2f} TB/s, mk.sol){given}"
    return MeasuredSpeedOfLight(source, bytes_per_step, c.hbm_bandwidth, c.name)


def probed_speed_of_light(bytes_per_step: float, nbytes: int, device=None, dtype: str = "f32", chips: int = 1):
    """The speed of light over a GEMV probe of ``nbytes`` in ``dtype`` timed in the same rounds as the step:
    this device's own limit (``chips`` devices stream ``chips`` times the bytes)."""
    call, size = gemv_probe(nbytes, device, array_dtype(dtype))
    source = f"measured: GEMV probe ({dtype}, {size >> 20} MiB) in the same rounds"
    return MeasuredSpeedOfLight(source, bytes_per_step, probe=call, probe_bytes=size, chips=chips)


def unknown_speed_of_light(bytes_per_step: float, device) -> MeasuredSpeedOfLight:
    return MeasuredSpeedOfLight(f"unknown: {device_name(device)} is no chip in data/chips.csv", bytes_per_step)


# Of a chip's HBM, what a run's arrays may take together; XLA's own buffers and the steps' temporaries the rest (an
# assumption: the measured rows record the bytes in use beside the bytes planned, and a build that runs out all the
# same is caught and skipped).
HBM_USE = 0.9


def usable_hbm(device, fraction: float) -> float | None:
    """What a run's arrays may hold on one chip: ``fraction`` of its HBM (the device's own figure, else data/chips.csv's
    for a known chip); None where unknown (a CPU)."""
    try:
        limit = (device.memory_stats() or {}).get("bytes_limit")
    except Exception:  # a backend without memory statistics
        limit = None
    if limit is None and known_chip(device) is not None:
        limit = get_chip(known_chip(device)).hbm_bytes
    return None if limit is None else fraction * limit


def release_device_memory(device, caches: bool = False) -> None:
    """Between a measurement's cases on an accelerator: a full collection, so that arrays held only by reference
    cycles leave its memory before the next case allocates; with ``caches``, JAX's compiled programs dropped too (they
    hold their calls, and a failed call its weights: a case after two failed ones on the v5e ran out of HBM). On a
    CPU, nothing: its arrays are the process's own memory, freed as their last reference goes, and in a long-lived
    process a full collection costs seconds (a test worker's: 1.3-1.6 s), a cleared cache more (4.8 s) and every
    later program its compile."""
    if device.platform == "cpu":
        return
    if caches:
        jax.clear_caches()
    gc.collect()


# Timing engines into rows ---------------------------------------------------------------------------------
@dataclass
class TimedStep:
    """A decode step ready to time: ``call()`` runs one step (holding the engine's arrays). ``label``: its
    name in the rounds (``megakernel[split]``); ``engine``: the row's; ``columns``: the driver's own columns
    that describe it (kernels, placement, ...); ``close()`` lets its memory go."""

    label: str
    call: Callable[[], Any]
    engine: str = ""
    columns: dict = field(default_factory=dict)
    close: Callable[[], None] = field(default=lambda: None, repr=False)

    def __post_init__(self):
        self.engine = self.engine or self.label


def _program_digest(call) -> str | None:
    """The digest of the program ``call`` runs where it names one (mk.measure.steps.decode_call's calls do); None for
    a call that is no JAX program (transformers' torch step)."""
    digest = getattr(call, "program_digest", None)
    return None if digest is None else digest()


def _significant(x: float | None) -> float | None:
    """``x`` to 4 significant digits: an interpreted kernel's tiny fraction of a TPU's speed of light stays
    readable, and above zero."""
    return None if x is None else significant(x)


def _timed_row(
    e: TimedStep, cmp: Comparison, sol: MeasuredSpeedOfLight, bw: Estimate | None, run: dict, calls: list, steps: int
) -> dict:
    """One engine's row of :func:`time_engines`: the run's columns, the engine's, its step (the host's), the speed of
    light's bandwidth and its fraction of it, and with ``steps`` back to back the device's time a step."""
    step = cmp.times[e.label]
    fractions = sol.fractions(cmp.raw, e.label)
    frac = None if fractions is None else Estimate.of(fractions, cmp.confidence)
    device = {}
    if steps:
        d = Estimate.of([t / steps for t in cmp.raw[e.label + BACK_TO_BACK]], cmp.confidence)
        device = dict(zip(DEVICE_TIMING, (steps, *(round(x * 1e3, 4) for x in (d.median, d.low, d.high)))))
    return {
        **run,
        "engine": e.engine,
        "program_digest": _program_digest(e.call),
        **e.columns,
        "rounds": cmp.rounds,
        "interleaved_with": ", ".join(n for n in calls if n not in (e.label, e.label + BACK_TO_BACK)),
        "step_ms": round(step.median * 1e3, 4),
        "step_low_ms": round(step.low * 1e3, 4),
        "step_high_ms": round(step.high * 1e3, 4),
        "tokens_per_s": round(1 / step.median, 2),
        "tokens_per_s_total": round(run["batch"] / step.median, 2),
        "load_before": round(cmp.load[0], 2),
        "load_after": round(cmp.load[1], 2),
        "bytes_per_token": int(sol.bytes_per_step),
        "sol_source": sol.source,
        "sol_bandwidth_GBps": None if bw is None else round(bw.median / 1e9, 3),
        "sol_bandwidth_low_GBps": None if bw is None else round(bw.low / 1e9, 3),
        "sol_bandwidth_high_GBps": None if bw is None else round(bw.high / 1e9, 3),
        "sol_tokens_per_s": None if bw is None else round(bw.median / sol.bytes_per_step, 2),
        "fraction_of_sol": _significant(frac and frac.median),
        "fraction_of_sol_low": _significant(frac and frac.low),
        "fraction_of_sol_high": _significant(frac and frac.high),
        **device,
    }


def time_engines(
    engines: list[TimedStep],
    sol: MeasuredSpeedOfLight,
    run: dict,
    budget_s: float,
    precision: float = PRECISION,
    min_rounds: int = MIN_ROUNDS,
    max_rounds: int | None = None,
    warmup: int = 2,
    watch_fractions: bool = False,
    log: Callable[[str], None] = lambda _: None,
    steps_back_to_back: int = 0,
) -> tuple[Comparison, list[dict]]:
    """Time ``engines`` (and the speed of light's probe, if it has one) interleaved in mk.measure.loop's one
    loop for up to ``budget_s``, until each engine's step (``watch_fractions``: its fraction of the speed of
    light) is known to +-``precision`` of itself. Returns the rounds and one row per engine: ``run``'s
    columns (provenance, model, dtype, context, batch, weights, the driver's own), the engine's, the step's
    and the speed of light's. The step (``step_ms``) is the host's: one step, waited on. With
    ``steps_back_to_back`` = n each engine also runs n steps dispatched back to back in every round (the device's
    time a step: :data:`DEVICE_TIMING`'s columns, known to the same precision)."""
    calls = {e.label: e.call for e in engines}
    if steps_back_to_back:
        calls.update({e.label + BACK_TO_BACK: back_to_back(e.call, steps_back_to_back) for e in engines})
    if sol.probe is not None:
        calls[PROBE] = sol.probe
    watch = None
    if watch_fractions and sol.known:

        def watch(times):
            return {e.label: sol.fractions(times, e.label) for e in engines}

    log(f"timing {', '.join(calls)} interleaved, up to {budget_s:.0f} s")
    cmp = interleaved(
        calls,
        engines[0].label,
        precision=precision,
        budget_s=budget_s,
        min_rounds=min_rounds,
        max_rounds=max_rounds,
        warmup=warmup,
        watch=watch,
    )
    log(f"timed {cmp.rounds} rounds in {cmp.elapsed_s:.1f} s")
    rounds_bw = sol.bandwidths(cmp.raw)
    bw = None if rounds_bw is None else Estimate.of(rounds_bw, cmp.confidence)
    rows = [_timed_row(e, cmp, sol, bw, run, list(calls), steps_back_to_back) for e in engines]
    return cmp, rows
