"""``python -m mk bench``: an engine's compiled decode step at a context and batch timed against this device's
own measured speed of light, its kernels counted, one row appended to ``data/measured/bench.csv``; and which
data type this device streams a step of fastest (``dtype_table``, relative: no second bandwidth).

The step and a bandwidth probe (a GEMV streaming an array once) run interleaved, round after round
(mk.measure.harness.time_engines), so both see the same load; each round gives a fraction of the speed of
light (the probe's bandwidth over the bytes per step, against the step), and the run reports the median of
those with its 95% interval, the step's and the bandwidth's, and the machine's load: rounds go on until the
fraction is known to +-``precision`` of itself or the time budget runs out. The fraction is that median of
round-by-round fractions, never the ratio of the speed of light's median step to the step's median (on a loaded
machine the two differ; the pairs cancel a slow round).

The bandwidth is the run's, measured in the same rounds as the step: another process streaming memory (a second
notebook, another job) takes its share of it, so a probe timed in other rounds is another number. Choosing a data
type (``dtype_table``) therefore reports only ratios between data types timed in the same rounds. The step is timed as
mk.measure.steps.decode_call times it (the last position of a zero cache).

INT8 weights (``quantize``, mk.quant): the engine gets the quantized tree, and the row's ``dtype`` says so,
``f32+int8-experts``: the float data type, then the scheme (a row without ``+`` is a float run, as every
older row). Its bytes per token are mk.sol's for that policy (INT8 codes and their scales): the speed of
light of the quantized model. The reference dequantizes the tree once at load time and so reads float
weights every step: its fraction of that speed of light shows what it leaves on the table.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from .. import profiling
from ..config import ModelConfig
from ..files import append_csv_rows
from ..generate import cache_multiple, get_step
from ..kernel_setup import KernelSetup
from ..paths import BENCH_CSV
from ..quant import quantized_as, scheme_of
from ..sol import bytes_per_token
from ..units import positive_int
from ..weights import random_params
from .harness import PROBE, TimedStep, array_dtype, columns, probed_speed_of_light, provenance, time_engines
from .loop import interleaved
from .steps import decode_call

COLUMNS = columns("kernels_per_step")
PRECISION = 0.02  # the bench's default: its fraction of the speed of light known to +-2% of itself


def append_row(row: dict, path: Path = BENCH_CSV) -> Path:
    """Append ``row`` to the CSV at ``path`` atomically (mk.files.append_csv_rows): a crash leaves the old
    file or the new."""
    return append_csv_rows([row], path, COLUMNS, "a bench row")


@dataclass(frozen=True, eq=False)
class BenchWeights:
    """The weights a bench times: ``params`` (``source`` says where they came from: a checkpoint's folder), else
    random ones drawn from ``seed`` (timing does not depend on the values); ``quantize`` (an mk.quant scheme) quantizes
    float weights before the engine sees them, and quantized ones are used as they are (``quantize`` None or their own
    scheme: ``mk.quant.quantized_as``)."""

    params: dict | None = None
    source: str = "given"
    seed: int = 0
    quantize: str | None = None

    def arrays(self, cfg: ModelConfig, dtype: str) -> tuple[dict, str]:
        """The weights' arrays for ``cfg`` in ``dtype`` (random ones where none are given), and where they came from."""
        if self.params is None:
            params, source = random_params(cfg, self.seed, array_dtype(dtype)), f"random (seed {self.seed})"
        else:
            params, source = self.params, self.source
        return quantized_as(params, cfg, self.quantize), source


RANDOM_WEIGHTS = BenchWeights()


@dataclass(frozen=True)
class BenchResult:
    """One benchmark run: the step, the probe's bandwidth and the fraction of the speed of light, each a
    median with its interval over interleaved rounds; kernels, bytes, the method and the CSV row."""

    cfg: ModelConfig
    engine: str
    dtype: str  # the float data type, then "+SCHEME" for INT8 weights (f32+int8-experts)
    context: int
    batch: int
    step: profiling.Estimate  # seconds
    bandwidth: profiling.Estimate  # bytes/s, one device's probe in the same rounds
    fraction: profiling.Estimate  # of the speed of light: the median of the round-by-round fractions
    kernels: profiling.KernelCount
    bytes_per_token: float
    method: dict  # rounds, elapsed_s, confidence, load_before, load_after
    record: dict  # the CSV row (mk.measure.harness's columns, then COLUMNS' own)
    round_fractions: tuple[float, ...] = ()  # the fraction of the speed of light in each round, in order
    sol_step: profiling.Estimate | None = None  # seconds: the bytes over the bandwidth's median (and interval)

    @property
    def step_s(self) -> float:
        return self.step.median

    @property
    def fraction_of_sol(self) -> float:
        return self.fraction.median

    def row(self) -> dict:
        return dict(self.record)

    def text(self) -> str:
        """The run in words; its step, bandwidth and fraction are the result's own estimates (the CSV row rounds
        them, and rounding twice could move a printed digit away from what a notebook prints of the same run)."""
        r, step, frac = self.record, self.step, self.fraction
        bw = [self.bytes_per_token / t for t in (self.sol_step.median, self.sol_step.high, self.sol_step.low)]
        return "\n".join(
            [
                f"{r['model']} / {r['engine']} on {r['device']}, {r['dtype']}, context {r['context']}, "
                f"batch {r['batch']} (measured {r['date']}, JAX {r['jax_version']}, commit {r['commit']})",
                f"  step              {step.median * 1e3:10.3f} ms  (median of {r['rounds']} interleaved rounds, "
                f"95% interval {step.low * 1e3:.3f}-{step.high * 1e3:.3f})",
                f"  tokens/s/user     {1 / step.median:10.1f}",
                f"  tokens/s total    {self.batch / step.median:10.1f}",
                f"  kernels per step  {r['kernels_per_step']:10.0f}  (compiled program)",
                f"  bytes per token   {r['bytes_per_token'] / 1e6:10.1f} MB  (modelled, mk.sol '{r['dtype']}')",
                f"  bandwidth         {bw[0] / 1e9:10.2f} GB/s  ({r['sol_source']}, "
                f"{bw[1] / 1e9:.2f}-{bw[2] / 1e9:.2f})",
                f"  speed of light    {1 / self.sol_step.median:10.1f} tok/s  -> {frac.median:.1%} reached "
                f"(the median of the rounds' fractions, 95% interval {frac.low:.1%}-{frac.high:.1%})",
                f"  machine load      {r['load_before']:10.2f} -> {r['load_after']:.2f}  (1-minute average)",
            ]
        )


def run_bench(
    cfg: ModelConfig,
    context: int,
    batch: int = 1,
    dtype: str = "f32",
    engine: str = "reference",
    weights: BenchWeights = RANDOM_WEIGHTS,
    precision: float = PRECISION,
    budget_s: float = 30.0,
    probe_bytes: int = profiling.DEFAULT_PROBE_BYTES,
    engine_options: dict | None = None,
) -> BenchResult:
    """Benchmark ``engine``'s decode step for ``cfg`` at ``context`` positions and ``batch`` users: the
    step and the bandwidth probe interleaved until the fraction of the speed of light is known to
    +-``precision`` of itself (its 95% interval's half-width; 0: to the budget) or ``budget_s`` is spent.

    ``weights`` (:class:`BenchWeights`): the weights timed, random ones by default. ``engine_options`` go to the
    engine's ``make_step`` (the megakernel's ``setup=KernelSetup(8, "split")``):
    over C chips the speed of light is C times one chip's probed bandwidth, and the row's engine names the
    options (``megakernel[chips=8,placement=split]``, then the setup's name where it has one). With quantized weights
    the result's ``dtype`` is ``DTYPE+SCHEME``.
    """
    positive_int("context", context)
    positive_int("batch", batch)
    array_dtype(dtype)
    options = dict(engine_options or {})
    step = get_step(engine, cfg, **options)
    chips, multiple = options["setup"].chips if "setup" in options else 1, cache_multiple(engine)
    label = f"{engine}[{','.join(_option_words(options))}]" if options else engine
    params, source = weights.arrays(cfg, dtype)
    scheme = scheme_of(params, cfg)
    label_dtype = dtype if scheme == "none" else f"{dtype}+{scheme}"
    call = decode_call(step, params, cfg, context, batch, dtype, program=True, cache_multiple=multiple)
    kernels = profiling.compiled_kernels(call.program, *call.args())
    per_token = bytes_per_token(cfg, context, batch, label_dtype).total
    sol = probed_speed_of_light(per_token, probe_bytes, dtype=dtype, chips=chips)
    run = {
        **provenance(chips=chips),
        "model": cfg.name,
        "dtype": label_dtype,
        "context": context,
        "batch": batch,
        "weights": source,
    }
    columns = {"kernels_per_step": kernels.total}
    cmp, (row,) = time_engines(
        [TimedStep(label, call, columns=columns)], sol, run, budget_s, precision, watch_fractions=True
    )
    rounds = sol.fractions(cmp.raw, label)
    bw = profiling.Estimate.of(sol.bandwidths(cmp.raw), cmp.confidence)  # the chips' bandwidth, bytes/s
    sol_step = profiling.Estimate(per_token / bw.median, per_token / bw.high, per_token / bw.low, bw.n)
    return BenchResult(
        cfg,
        label,
        label_dtype,
        context,
        batch,
        cmp.times[label],
        profiling.Estimate.of([sol.probe_bytes / t for t in cmp.raw[PROBE]], cmp.confidence),
        profiling.Estimate.of(rounds, cmp.confidence),
        kernels,
        per_token,
        cmp.provenance(),
        row,
        tuple(rounds),
        sol_step,
    )


def _option_words(options: dict) -> list[str]:
    """``k=v`` for each engine option; a kernel setup by its chips, placement and (unless the default) name."""
    words = []
    for k, v in options.items():
        if isinstance(v, KernelSetup):
            words += [f"chips={v.chips}", f"placement={v.placement}"]
            words += [] if v.name == KernelSetup().name else [f"setup={v.name}"]
        else:
            words.append(f"{k}={v}")
    return words


def dtype_table(
    nbytes: int,
    dtypes: dict,
    step_bytes: dict[str, float],
    budget_s: float = 20.0,
    precision: float = 0.02,
) -> pd.DataFrame:
    """Which data type this device streams a decode step of fastest: each type's GEMV probe (the bench's kernel,
    mk.profiling.gemv_probe, an array of about ``nbytes``) timed interleaved in one run, paired round by round.
    Relative only: a bandwidth in GB/s is the bench's, measured in the step's own rounds (the module's docstring
    says why a probe timed in other rounds is another number).

    ``step_bytes``: each type's bytes per step (mk.sol). Per round, a type's *bound* is its step's bytes over its
    probe's bandwidth in that round. The type whose bound is lowest (median of its per-round ratio to the first
    type's) is ``chosen``; each row gives its GEMV bandwidth and its bound over the chosen type's in the same round
    (medians of the per-round ratios with 95% intervals), and ``resolved`` whether its bound's interval lies above
    the chosen one's (excludes 1). Rounds go on until every ratio to the first type is known to +-``precision`` of
    itself, ``budget_s`` or 50 rounds; one type alone is not timed (its ratios are 1 by definition)."""
    names = list(dtypes)
    if not names or not set(names) <= set(step_bytes):
        raise ValueError(f"give at least one data type, and the step's bytes for each of {names}")
    if len(names) == 1:  # nothing to compare, nothing timed: its ratios are 1
        ones = dict(gemv_bandwidth_vs_chosen=1.0, gemv_low=1.0, gemv_high=1.0)
        ones |= dict(step_bound_vs_chosen=1.0, bound_low=1.0, bound_high=1.0)
        n = names[0]
        return pd.DataFrame(
            [dict(dtype=n, step_bytes_MB=step_bytes[n] / 1e6, **ones, chosen=True, resolved=True, rounds=0)]
        )
    calls, sizes = {}, {}
    for name, dtype in dtypes.items():
        calls[name], sizes[name] = profiling.gemv_probe(nbytes, dtype=dtype)

    def bounds(times):  # each type's step bound in each round, seconds
        return {n: [step_bytes[n] * t / sizes[n] for t in times[n]] for n in names}

    def over(a: list[float], b: list[float]) -> list[float]:
        return [x / y for x, y in zip(a, b)]

    def watch(times):
        b = bounds(times)
        return {n: over(b[n], b[names[0]]) for n in names[1:]}

    cmp = interleaved(calls, names[0], precision=precision, budget_s=budget_s, max_rounds=50, watch=watch)
    raw, rounds, confidence = cmp.raw, cmp.rounds, cmp.confidence
    b = bounds(raw)
    chosen = min(names, key=lambda n: statistics.median(over(b[n], b[names[0]])))
    out = []
    for n in names:
        # bandwidth over the chosen's in each round: (size_n / t_n) / (size_c / t_c)
        speed = profiling.Estimate.of(
            [sizes[n] / t * u / sizes[chosen] for t, u in zip(raw[n], raw[chosen])], confidence
        )
        bound = profiling.Estimate.of(over(b[n], b[chosen]), confidence)
        out.append(
            dict(
                dtype=n,
                step_bytes_MB=step_bytes[n] / 1e6,
                gemv_bandwidth_vs_chosen=speed.median,
                gemv_low=speed.low,
                gemv_high=speed.high,
                step_bound_vs_chosen=bound.median,
                bound_low=bound.low,
                bound_high=bound.high,
                chosen=n == chosen,
                resolved=n == chosen or bound.low > 1,
                rounds=rounds,
            )
        )
    return pd.DataFrame(out)
