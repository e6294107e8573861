"""The decode benchmark: time an engine's compiled step at a context and batch, count its kernels,
set it against the measured speed of light, and append a row with its provenance to
``data/measured/bench.csv``.

The step and a bandwidth probe (a GEMV streaming an array once) run interleaved, round after round
(mk.profiling.interleaved), so both see the same load; each round gives a fraction of the speed of light
(the probe's bandwidth over the bytes per step, against the step), and the run reports the median of
those with its 95% interval, the step's and the bandwidth's, and the machine's load: rounds go on until
the fraction is known to +-``precision`` or the time budget runs out.

The step is timed at position ``context - 1`` of a cache sized to ``context``, so it reads the
KV cache ``mk.sol`` counts for that context. Decode time does not depend on what the cache holds
(the shapes are fixed and masked), so the cache is left zero rather than filled by a prefill.

INT8 weights (``quantize``, mk.quant): the engine gets the quantized tree, and the row's ``dtype`` says so,
``f32+int8-experts``: the float data type, then the scheme (a row without ``+`` is a float run, as every
older row). Its bytes per token are mk.sol's for that policy (INT8 codes and their scales): the speed of
light of the quantized model. The reference dequantizes the tree once at load time and so reads float
weights every step: its fraction of that speed of light shows what it leaves on the table.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp

from . import profiling
from .config import ModelConfig
from .files import append_csv_rows
from .paths import BENCH_CSV
from .sol import bytes_per_token
from .units import positive_int

COLUMNS = (
    "date",
    "device",
    "backend",
    "jax_version",
    "engine",
    "model",
    "dtype",
    "context",
    "batch",
    "rounds",
    "step_ms",
    "step_low_ms",
    "step_high_ms",
    "tokens_per_s",
    "tokens_per_s_total",
    "kernels_per_step",
    "bytes_per_token",
    "bandwidth_GBps",
    "bandwidth_low_GBps",
    "bandwidth_high_GBps",
    "sol_tokens_per_s",
    "sol_fraction",
    "sol_fraction_low",
    "sol_fraction_high",
    "load_before",
    "load_after",
    "weights",
)
# The data type a run's arrays use, and the mk.sol policy that counts its bytes.
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def provenance(device=None) -> dict:
    """Where and when a measurement was taken: date (UTC), device, backend and JAX version."""
    device = device or jax.devices()[0]
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": profiling.device_name(device),
        "backend": device.platform,
        "jax_version": jax.__version__,
    }


def append_row(row: dict, path: Path = BENCH_CSV) -> Path:
    """Append ``row`` to the CSV at ``path`` atomically (mk.files.append_csv_rows): a crash leaves the old
    file or the new."""
    return append_csv_rows([row], path, COLUMNS, "a bench row")


@dataclass(frozen=True)
class BenchResult:
    """One benchmark run: the step, the probe's bandwidth and the fraction of the speed of light, each a
    median with its interval over interleaved rounds; kernels, bytes and the method's provenance."""

    cfg: ModelConfig
    engine: str
    dtype: str  # the float data type, then "+SCHEME" for INT8 weights (f32+int8-experts)
    context: int
    batch: int
    step: profiling.Estimate  # seconds
    bandwidth: profiling.Estimate  # bytes/s, the probe's in the same rounds
    fraction: profiling.Estimate  # of the speed of light, round by round
    kernels: profiling.KernelCount
    bytes_per_token: float
    weights: str  # "random (seed N)" or the checkpoint's path
    provenance: dict
    method: dict  # rounds, elapsed_s, confidence, load_before, load_after
    round_fractions: tuple[float, ...] = ()  # the fraction of the speed of light in each round, in order

    @property
    def step_s(self) -> float:
        return self.step.median

    @property
    def sol_fraction(self) -> float:
        return self.fraction.median

    def row(self) -> dict:
        return {
            **self.provenance,
            "engine": self.engine,
            "model": self.cfg.name,
            "dtype": self.dtype,
            "context": self.context,
            "batch": self.batch,
            "rounds": self.method["rounds"],
            "step_ms": round(self.step.median * 1e3, 4),
            "step_low_ms": round(self.step.low * 1e3, 4),
            "step_high_ms": round(self.step.high * 1e3, 4),
            "tokens_per_s": round(1 / self.step_s, 2),
            "tokens_per_s_total": round(self.batch / self.step_s, 2),
            "kernels_per_step": self.kernels.total,
            "bytes_per_token": int(self.bytes_per_token),
            "bandwidth_GBps": round(self.bandwidth.median / 1e9, 3),
            "bandwidth_low_GBps": round(self.bandwidth.low / 1e9, 3),
            "bandwidth_high_GBps": round(self.bandwidth.high / 1e9, 3),
            "sol_tokens_per_s": round(self.bandwidth.median / self.bytes_per_token, 2),
            "sol_fraction": round(self.fraction.median, 4),
            "sol_fraction_low": round(self.fraction.low, 4),
            "sol_fraction_high": round(self.fraction.high, 4),
            "load_before": round(self.method["load_before"], 2),
            "load_after": round(self.method["load_after"], 2),
            "weights": self.weights,
        }

    def text(self) -> str:
        r = self.row()
        return "\n".join(
            [
                f"{r['model']} / {r['engine']} on {r['device']}, {r['dtype']}, context {r['context']}, "
                f"batch {r['batch']} (measured {r['date']}, JAX {r['jax_version']})",
                f"  step              {r['step_ms']:10.3f} ms  (median of {r['rounds']} interleaved rounds, "
                f"95% interval {r['step_low_ms']:.3f}-{r['step_high_ms']:.3f})",
                f"  tokens/s/user     {r['tokens_per_s']:10.1f}",
                f"  tokens/s total    {r['tokens_per_s_total']:10.1f}",
                f"  kernels per step  {r['kernels_per_step']:10.0f}  (compiled program)",
                f"  bytes per token   {r['bytes_per_token'] / 1e6:10.1f} MB  (modelled, mk.sol '{r['dtype']}')",
                f"  bandwidth         {r['bandwidth_GBps']:10.2f} GB/s  (measured, GEMV probe in the same rounds, "
                f"{r['bandwidth_low_GBps']:.2f}-{r['bandwidth_high_GBps']:.2f})",
                f"  speed of light    {r['sol_tokens_per_s']:10.1f} tok/s  -> {r['sol_fraction']:.1%} reached "
                f"(95% interval {r['sol_fraction_low']:.1%}-{r['sol_fraction_high']:.1%})",
                f"  machine load      {r['load_before']:10.2f} -> {r['load_after']:.2f}  (1-minute average)",
            ]
        )


def decode_call(
    step,
    params: dict,
    cfg: ModelConfig,
    context: int,
    batch: int,
    dtype: str,
    knockout=frozenset(),
    program: bool = False,
    cache_multiple: int = 1,
) -> Callable[[], jax.Array]:
    """A no-argument call that runs one decode step of ``batch`` users at position ``context - 1``
    of a zero cache of ``context`` positions (slots rounded up to ``cache_multiple``, in the engine's own
    layout when its step has ``adopt_cache``), threading the (donated) cache from call to call.

    ``program=True`` runs the step as :func:`step_program`, kept as ``call.program``: the program
    ``compiled_kernels(call.program, *call.args())`` counts (compiled once, shared with the calls),
    and whose instruction names a profiler trace of the call shows.
    """
    from .reference import init_cache

    prepare, adopt = getattr(step, "prepare", None), getattr(step, "adopt_cache", None)
    if prepare is not None:  # the engine's own layout, made once outside the timed (and jitted) step
        params = prepare(params, cfg)
    prog = step_program(step, cfg, knockout) if program else None
    if program:

        def step(p, _cfg, cache, t, i, _knockout):
            return prog(p, cache, t, i)

    tokens = jnp.zeros((batch,), jnp.int32)
    pos = jnp.asarray(context - 1, jnp.int32)
    cache = init_cache(cfg, batch, context, DTYPES[dtype], multiple=cache_multiple)
    state = {"cache": adopt(cache) if adopt is not None else cache}

    def call():
        logits, state["cache"] = step(params, cfg, state["cache"], tokens, pos, knockout)
        return logits

    call.args = lambda: (params, state["cache"], tokens, pos)  # for compiling the same step
    call.program = prog
    return call


def op_by_op(call: Callable[[], jax.Array]) -> Callable[[], jax.Array]:
    """``call`` with every primitive dispatched as its own program (``jax.disable_jit``), as an eager
    framework runs it: to time beside the compiled step, interleaved."""

    def eager():
        with jax.disable_jit():
            return jax.block_until_ready(call())

    return eager


def step_program(step, cfg: ModelConfig, knockout=frozenset()):
    """The decode step as one jitted program with the cache donated, as an engine runs it."""
    return jax.jit(lambda p, c, t, i: step(p, cfg, c, t, i, knockout), donate_argnums=(1,))


def run_bench(
    cfg: ModelConfig,
    context: int,
    batch: int = 1,
    dtype: str = "f32",
    engine: str = "reference",
    params: dict | None = None,
    weights: str | None = None,
    precision: float = 0.02,
    budget_s: float = 30.0,
    probe_bytes: int = profiling.DEFAULT_PROBE_BYTES,
    seed: int = 0,
    engine_options: dict | None = None,
    quantize: str | None = None,
) -> BenchResult:
    """Benchmark ``engine``'s decode step for ``cfg`` at ``context`` positions and ``batch`` users: the
    step and the bandwidth probe interleaved until the fraction of the speed of light is known to
    +-``precision`` (its 95% interval's half-width) or ``budget_s`` is spent.

    ``params`` default to random weights (seeded: timing does not depend on the values).
    ``engine_options`` go to the engine's ``make_step`` (the megakernel's ``chips=8, placement="split"``):
    over C chips the speed of light is C times one chip's probed bandwidth, and the row's engine names
    the options (``megakernel[chips=8,placement=split]``). ``quantize`` (an mk.quant scheme) quantizes the
    float ``params`` before the engine sees them; quantized ``params`` are used as they are (``quantize`` None
    or their own scheme: ``mk.quant.quantized_as``). The result's ``dtype`` is then ``DTYPE+SCHEME``.
    """
    from .generate import cache_multiple, get_step
    from .quant import quantized_as, scheme_of
    from .weights import random_params

    positive_int("context", context)
    positive_int("batch", batch)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    options = dict(engine_options or {})
    step = get_step(engine, cfg, **options)
    chips, multiple = options.get("chips", 1), cache_multiple(engine)
    label = f"{engine}[{','.join(f'{k}={v}' for k, v in options.items())}]" if options else engine
    if params is None:
        params, weights = random_params(cfg, seed, DTYPES[dtype]), f"random (seed {seed})"
    params = quantized_as(params, cfg, quantize)
    scheme = scheme_of(params, cfg)
    label_dtype = dtype if scheme == "none" else f"{dtype}+{scheme}"
    call = decode_call(step, params, cfg, context, batch, dtype, program=True, cache_multiple=multiple)
    kernels = profiling.compiled_kernels(call.program, *call.args())
    probe, nbytes = profiling.gemv_probe(probe_bytes, dtype=DTYPES[dtype])
    per_token = bytes_per_token(cfg, context, batch, label_dtype).total

    def fractions(times):  # round by round: the step against the probe's bandwidth in the same round
        return [
            profiling.sol_fraction(ts, per_token, chips * nbytes / tp) for ts, tp in zip(times["step"], times["probe"])
        ]

    def precise(times):
        return profiling.Estimate.of(fractions(times), 0.95).halfwidth <= precision

    cmp = profiling.interleaved({"step": call, "probe": probe}, "step", budget_s=budget_s, precise=precise)
    rounds = fractions(cmp.raw)
    return BenchResult(
        cfg,
        label,
        label_dtype,
        context,
        batch,
        cmp.times["step"],
        profiling.Estimate.of([nbytes / t for t in cmp.raw["probe"]], cmp.confidence),
        profiling.Estimate.of(rounds, cmp.confidence),
        kernels,
        per_token,
        weights or "given",
        provenance(),
        cmp.provenance(),
        tuple(rounds),
    )
