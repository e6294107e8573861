"""``python -m mk measure-gpu``: one decode step of the reference (the plain-JAX general stack) and of
transformers' Gemma 4, timed interleaved on the same device, with their kernels per step, beside the speed of
light; rows (mk.measure.harness's columns, then this driver's own) go to ``data/measured/gpu.csv``.

Made for a GPU machine (an H200 with JAX, torch and transformers, no network): the full-size
gemma4-26b-a4b in bf16 at a 1K context, one user. Everything also runs on the CPU with a tiny preset
(the tests), and the rows say which device they came from.

- **Weights**: random (seed 0), built on the device one tensor at a time, already in the layout each
  engine runs on: for the reference, ``mk.weights.random_params``' values (the same keys and
  distributions; a few bf16 roundings differ) in ``mk.reference.prepare``'s layout, each tensor drawn
  in one jitted program that casts as it draws, so no float32 copy of a tensor is kept and no host
  copy of the model is made; for transformers, ``Gemma4ForCausalLM`` built on the device in the data
  type, its weights redrawn in place with the same distributions (torch's generator, so not the same
  numbers). Both models are held together only when both fit in the device's free memory (with a
  margin); otherwise each is measured alone, transformers first (torch hands its memory back; JAX
  keeps its pool).
- **The steps**: the reference's compiled step (``mk.measure.steps.step_program``, the cache donated) and
  transformers' forward of one token with a static cache of ``context`` positions, both at position
  ``context - 1`` of a zero cache (decode time does not depend on what the cache holds; mk.measure.steps
  does the same). transformers' static cache counts the positions it has seen; each step first sets the
  counters back to ``context - 1`` (a foreach copy on the device: its kernels are taken off the
  count, its few microseconds stay in the time), so every step decodes the same position: with a
  context no longer than the sliding window (26B-A4B at 1K: a window of 1024) a repeated step gives
  the logits of a step after a real prefill (tests/test_measure_gpu.py). Both return the logits; the
  argmax that picks the token is left out of both.
- **Timing**: ``mk.measure.harness.time_engines`` (mk.measure.loop's one loop): one round runs every engine
  once in a shuffled order, so both see the same machine, until each one's median step is known to +-1%;
  medians with 95% intervals. A torch step ends with
  ``torch.cuda.synchronize``; a JAX step with ``block_until_ready``.
- **Kernels per step**: the reference's in a profiler trace of its running program
  (``mk.profiling.trace_kernels``: on a GPU, the device's kernel events), else in its compiled
  program (``count_kernels``, always in ``kernels_compiled``); transformers' with ``torch.profiler``
  (on a GPU its CUDA device events, less the position reset's; on the CPU the leaf ``aten`` ops).
  torch is profiled first: two profilers in one process may not both get the device's events.
- **Speed of light**: the bytes ``mk.sol`` counts per step over the chip's memory bandwidth from
  ``data/chips.csv`` where the device is a known chip (``h200``), else over the bandwidth of a GEMV probe
  timed in the same rounds (float32: the fastest way this device streams memory), round by round
  (mk.measure.harness).
- **Budget**: ``budget_s`` bounds the run from start to rows, weight init included. transformers is
  built, counted and timed alone first (a tenth of the budget at most); then the reference's weights
  are built and its step compiled in a background thread, waited for until only the timing's share
  (a fifth) is left; then both are timed interleaved. A compile not done by then is abandoned (a
  full-size step switches over 128 experts in each of 30 layers: XLA:CPU took about 7 minutes to
  compile it on 2 cores) and transformers' alone-timing gives the rows: nothing is timed beside a
  running compile, which takes the CPU that torch launches its kernels from. ``unfinished()`` then
  says the compile thread still runs: the command line leaves with ``os._exit`` rather than wait.
"""

from __future__ import annotations

import gc
import inspect
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import pandas as pd

from ..config import ModelConfig, to_hf_dict
from ..files import append_csv_rows
from ..params import count_params
from ..paths import GPU_CSV
from ..profiling import count_kernels, device_name, trace_kernels
from ..progress import Log
from ..reference import decode_step, init_cache
from ..sol import bytes_per_token, kv_bytes_per_user
from ..units import positive_int
from ..weights import EMBED_STD, NORM_STD, device_params
from .harness import (
    MIN_TIMING_S,
    MeasuredSpeedOfLight,
    TimedStep,
    array_dtype,
    columns,
    probed_speed_of_light,
    provenance,
    spec_speed_of_light,
    time_engines,
)
from .steps import step_program, traced_digest

ENGINES = ("reference", "transformers")
DEVICES = ("gpu", "cpu")
COLUMNS = columns("engine_options", "kernels_per_step", "kernels_counted_by", "kernels_compiled", "compile_s")
PROBE_BYTES = 64 * 2**20  # the GEMV probe where the device is no known chip: past a CPU's caches, quick to run
TRACE_CALLS = 3  # steps in each profiler trace
MEMORY_MARGIN = 1.05  # both models held together only when 1.05 x their bytes + MEMORY_SLACK fit
MEMORY_SLACK = 4 * 2**30
TIMING_SHARE = 0.2  # of the budget kept for the timing rounds (at least MIN_TIMING_S)

_unfinished: list[threading.Thread] = []


def unfinished() -> bool:
    """Whether an abandoned compile is still running in a background thread (leave with ``os._exit``)."""
    return any(t.is_alive() for t in _unfinished)


# Checks ---------------------------------------------------------------------------------------------
def jax_device(device: str):
    """The first JAX device of ``device`` ("gpu" or "cpu"); a clear error where there is none."""
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    try:
        return jax.devices(device)[0]
    except RuntimeError as e:
        raise ValueError(
            f"--device {device}: JAX finds no {device.upper()} here ({e}); run on a GPU machine with JAX's CUDA "
            "plugin, or pass --device cpu"
        ) from None


def transformers_modules():
    """(torch, transformers, Gemma4ForCausalLM, Gemma4TextConfig, StaticCache); a clear error where
    transformers is missing or has no Gemma 4."""
    try:
        import torch
        import transformers
    except ImportError as e:
        raise ValueError(f"the transformers engine needs torch and transformers ({e}); or pass --engines reference")
    try:
        from transformers import Gemma4ForCausalLM, Gemma4TextConfig, StaticCache
    except ImportError:
        raise ValueError(
            f"transformers {transformers.__version__} has no Gemma 4 (transformers.models.gemma4): it needs a "
            "release with Gemma4ForCausalLM; or pass --engines reference"
        ) from None
    return torch, transformers, Gemma4ForCausalLM, Gemma4TextConfig, StaticCache


def torch_device(device: str) -> str:
    """torch's name for ``device``; a clear error where torch sees no CUDA device."""
    import torch

    if device == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise ValueError(
            f"--device gpu: torch {torch.__version__} sees no CUDA device (torch.version.cuda = {torch.version.cuda})"
        )
    return "cuda:0"


def device_bytes(cfg: ModelConfig, context: int, batch: int, dtype: str) -> int:
    """What one engine holds on the device: the weights and the KV cache (each engine has its own)."""
    item = array_dtype(dtype).itemsize
    kv = sum(kv_bytes_per_user(cfg, context, item).values()) * batch
    return int(count_params(cfg) * item + kv)


def free_bytes(device: str) -> int | None:
    """Free memory on ``device``: torch's view of the GPU, the host's available memory for the CPU."""
    if device == "gpu":
        try:
            import torch

            return int(torch.cuda.mem_get_info()[0])
        except Exception:  # no torch: ask JAX
            stats = jax_device("gpu").memory_stats() or {}
            limit = stats.get("bytes_limit")
            return None if limit is None else int(limit - stats.get("bytes_in_use", 0))
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


# Weights --------------------------------------------------------------------------------------------
def init_torch_weights(model, seed: int = 0) -> None:
    """Redraw a transformers Gemma 4's weights in place with mk's distributions (as tests/conftest.py
    does, on the model's own device): matrices N(0, 1/fan_in), the embedding N(0, EMBED_STD^2/hidden),
    norm weights and scales 1 + N(0, NORM_STD^2); derived buffers (RoPE frequencies, the embedding
    scale) are kept."""
    import torch

    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(seed)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith("inv_freq") or name.endswith("embed_scale"):
                continue
            if name.endswith("embed_tokens.weight"):
                t.normal_(0.0, EMBED_STD * t.shape[1] ** -0.5, generator=gen)
            elif t.ndim >= 2:
                t.normal_(0.0, t.shape[-1] ** -0.5, generator=gen)
            else:
                t.normal_(1.0, NORM_STD, generator=gen)


# Engines --------------------------------------------------------------------------------------------
class _Background:
    """``fn()`` in a daemon thread; ``result(deadline)`` waits for it until ``deadline`` (perf_counter)."""

    def __init__(self, fn: Callable[[], Any]):
        self.box: dict[str, Any] = {}

        def target():
            try:
                self.box["value"] = fn()
            except BaseException as e:  # handed to the waiting thread
                self.box["error"] = e

        self.thread = threading.Thread(target=target, name="mk-compile", daemon=True)
        self.thread.start()

    def result(self, deadline: float):
        self.thread.join(max(0.0, deadline - time.perf_counter()))
        if self.thread.is_alive():
            _unfinished.append(self.thread)
            raise TimeoutError
        if "error" in self.box:
            raise self.box["error"]
        return self.box["value"]


def start_reference(cfg: ModelConfig, context: int, batch: int, dtype: str, dev, seed: int, log) -> Callable:
    """Build the reference's weights and cache on ``dev`` and start compiling its step in the
    background; returns ``finish(deadline) -> TimedStep`` (raises TimeoutError if the compile is not done
    by ``deadline``)."""
    t = time.perf_counter()
    params = device_params(cfg, seed, array_dtype(dtype), dev, log)
    with jax.default_device(dev):
        cache = init_cache(cfg, batch, context, array_dtype(dtype))
        tokens = jnp.zeros((batch,), jnp.int32)
        pos = jnp.asarray(context - 1, jnp.int32)
    jax.block_until_ready((params, cache))
    log(f"reference: weights and cache on {dev} in {time.perf_counter() - t:.1f} s; compiling the step")
    prog = step_program(decode_step, cfg)

    def compile_step():
        t = time.perf_counter()
        compiled = prog.lower(params, cache, tokens, pos).compile()
        return compiled, time.perf_counter() - t

    job = _Background(compile_step)

    def finish(deadline: float) -> TimedStep:
        compiled, compile_s = job.result(deadline)
        log(f"reference: compiled in {compile_s:.1f} s")
        state = {"cache": cache, "params": params}

        def call():
            logits, state["cache"] = compiled(state["params"], state["cache"], tokens, pos)
            return logits

        def close():
            state.clear()

        call.program_digest = lambda: traced_digest(prog, state["params"], state["cache"], tokens, pos)  # its row's
        count = count_kernels(compiled.as_text())
        try:
            traced = trace_kernels(call, TRACE_CALLS, count.names)
        except Exception as e:  # a profiler that cannot start here: the compiled count stands
            log(f"reference: no profiler trace ({type(e).__name__}: {e})")
            traced = None
        by = "profiler trace" if traced else "compiled program"
        log(f"reference: {count.total:.0f} kernels in the compiled program, {traced} in a profiler trace")
        return TimedStep(
            "reference",
            call,
            columns=dict(
                engine_options="jit, cache donated",
                kernels_per_step=round(traced if traced else count.total, 2),
                kernels_counted_by=by,
                kernels_compiled=count.total,
                compile_s=round(compile_s, 1),
            ),
            close=close,
        )

    return finish


def build_transformers(cfg: ModelConfig, dtype: str = "bf16", device: str = "gpu", seed: int = 0):
    """transformers' Gemma4ForCausalLM for ``cfg`` (``mk.config.to_hf_dict``), built on ``device`` in
    ``dtype`` (no float32 or host copy) with mk's random weight distributions, in eval mode."""
    torch, _, Gemma4ForCausalLM, Gemma4TextConfig, _ = transformers_modules()
    tdev = torch_device(device)
    previous = torch.get_default_dtype()
    torch.set_default_dtype({"bf16": torch.bfloat16, "f32": torch.float32}[dtype])
    try:
        with torch.device(tdev):
            model = Gemma4ForCausalLM(Gemma4TextConfig(**to_hf_dict(cfg)))
    finally:
        torch.set_default_dtype(previous)
    init_torch_weights(model, seed)
    return model.eval()


def transformers_step(model, context: int, batch: int, token: int = 0):
    """``(step, reset)`` for ``model``: ``step()`` decodes ``token`` for each of ``batch`` users at
    position ``context - 1`` of a static cache of ``context`` positions, waits for the device and
    returns the logits ``[batch, 1, V]``; ``reset()`` is the part of a step that sets the cache's
    position counters back to ``context - 1`` first (transformers' static cache counts the positions
    it has seen), so that every step decodes the same position. ``step.cache`` is the cache."""
    torch, *_, StaticCache = transformers_modules()
    tdev = next(model.parameters()).device
    cuda = tdev.type == "cuda"
    cache = StaticCache(config=model.config, max_cache_len=context)
    ids = torch.full((batch, 1), token, dtype=torch.long, device=tdev)
    position_ids = torch.full((batch, 1), context - 1, dtype=torch.long, device=tdev)
    position = torch.tensor(context - 1, dtype=torch.long, device=tdev)
    # transformers renamed past_key_values to cache (the old name still works, with a warning)
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def set_back():
        counters = []
        for layer in cache.layers:
            if hasattr(layer, "cumulative_length_int"):  # a sliding layer also keeps the count as an int
                layer.cumulative_length_int = context - 1
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                counters.append(layer.cumulative_length)
        if counters and all(c.device == position.device for c in counters):
            torch._foreach_copy_(counters, [position] * len(counters))  # one fused copy on a GPU
        else:  # before the first step the counters are still on the host
            for c in counters:
                c.fill_(context - 1)

    def step():
        with torch.no_grad():
            set_back()
            logits = model(
                input_ids=ids, position_ids=position_ids, use_cache=True, logits_to_keep=1, **{cache_kw: cache}
            ).logits
        if cuda:
            torch.cuda.synchronize(tdev)
        return logits

    def reset():
        with torch.no_grad():
            set_back()
        if cuda:
            torch.cuda.synchronize(tdev)

    step.cache = cache
    return step, reset


def start_transformers(
    cfg: ModelConfig, context: int, batch: int, dtype: str, device: str, seed: int, log
) -> TimedStep:
    """transformers' step for ``cfg`` on ``device`` (``build_transformers``, ``transformers_step``),
    its kernels counted."""
    torch = transformers_modules()[0]
    t = time.perf_counter()
    model = build_transformers(cfg, dtype, device, seed)
    step, reset = transformers_step(model, context, batch)
    step()  # lays out the cache on the device
    cuda = next(model.parameters()).device.type == "cuda"
    options = (
        f"attn={model.config._attn_implementation}, experts={getattr(model.config, '_experts_implementation', '')}"
    )
    log(
        f"transformers: model and static cache on {torch_device(device)} in {time.perf_counter() - t:.1f} s ({options})"
    )
    del model  # held by the step alone, so that close() frees it
    kernels, by = None, ""
    try:
        step_k = _torch_kernels(torch, step, cuda)
        reset_k = _torch_kernels(torch, reset, cuda) if step_k is not None else None
        if step_k is not None:
            kernels = step_k - (reset_k or 0)
            by = "torch.profiler (CUDA device events)" if cuda else "torch.profiler (leaf aten ops, CPU)"
    except Exception as e:  # a profiler that cannot start here: no count rather than a wrong one
        log(f"transformers: no torch.profiler count ({type(e).__name__}: {e})")
    log(f"transformers: {kernels} kernels per step ({by or 'not counted'})")
    held = {"step": step}

    def call():
        held["step"]()

    def close():
        held.clear()
        if cuda:  # the GPU's memory back for the next engine (on a CPU, the host's: freed as its references go)
            gc.collect()
            torch.cuda.empty_cache()

    return TimedStep(
        "transformers",
        call,
        columns=dict(
            engine_options=options,
            kernels_per_step=None if kernels is None else round(kernels, 2),
            kernels_counted_by=by,
            kernels_compiled=None,
            compile_s=None,
        ),
        close=close,
    )


def _torch_kernels(torch, fn: Callable[[], None], cuda: bool) -> float | None:
    """Device events (CUDA) or leaf aten ops (CPU) per call of ``fn``, from torch.profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(TRACE_CALLS):
            fn()
    events = prof.events()
    if cuda:
        n = sum(e.device_type == DeviceType.CUDA for e in events)
    else:
        n = sum(
            e.name.startswith("aten::") and not any(c.name.startswith("aten::") for c in e.cpu_children) for e in events
        )
    return n / TRACE_CALLS if n else None


# The speed of light ---------------------------------------------------------------------------------
def speed_of_light_for(
    cfg: ModelConfig, context: int, batch: int, dtype: str, dev, chip: str | None
) -> MeasuredSpeedOfLight:
    """The chip's speed of light (``chip``, or the chip the device is) from ``mk.sol``, or, for a device
    that is no known chip, the same bytes over a GEMV probe (f32: the fastest way this device streams
    memory) timed in the same rounds."""
    per_step = bytes_per_token(cfg, context, batch, dtype).total
    return spec_speed_of_light(per_step, dev, 1, chip) or probed_speed_of_light(per_step, PROBE_BYTES, dev, "f32")


# The run ----------------------------------------------------------------------------------------------
def _check(cfg, context, batch, dtype, engines, device, budget_s):
    positive_int("context", context)
    positive_int("batch", batch)
    array_dtype(dtype)
    if not engines or any(e not in ENGINES for e in engines) or len(set(engines)) != len(engines):
        raise ValueError(f"engines must be some of {ENGINES}, each once, got {engines!r}")
    if not budget_s > 0:
        raise ValueError(f"budget_s must be positive, got {budget_s!r}")
    if device == "gpu":
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # leave torch its share of the GPU
    dev = jax_device(device)
    if "transformers" in engines:
        transformers_modules()
        torch_device(device)
    return dev


def run(
    cfg: ModelConfig,
    context: int = 1024,
    batch: int = 1,
    budget_s: float = 300.0,
    device: str = "gpu",
    engines=ENGINES,
    dtype: str = "bf16",
    out: Path | str | None = GPU_CSV,
    seed: int = 0,
    chip: str | None = None,
    quiet: bool = False,
) -> pd.DataFrame:
    """Measure ``engines`` on ``device`` for ``cfg`` at ``context`` positions and ``batch`` users within
    ``budget_s`` seconds: interleaved in one run when both fit in memory together, else one after the
    other. Returns one row per engine measured and appends them to ``out`` (None: no file)."""
    engines = tuple(engines)
    log = Log(quiet)
    dev = _check(cfg, context, batch, dtype, engines, device, budget_s)
    deadline = log.t0 + budget_s
    timing_s = max(MIN_TIMING_S, TIMING_SHARE * budget_s)
    sol = speed_of_light_for(cfg, context, batch, dtype, dev, chip)
    weights = f"random (seed {seed})"
    log(
        f"{cfg.name}, {dtype}, context {context}, batch {batch} on {device_name(dev)}; {', '.join(engines)}; "
        f"budget {budget_s:.0f} s; speed of light: {sol.source}"
    )
    one = device_bytes(cfg, context, batch, dtype)
    free = free_bytes(device)
    together = len(engines) == 1 or free is None or len(engines) * one * MEMORY_MARGIN + MEMORY_SLACK <= free
    log(
        f"each model holds {one / 1e9:.1f} GB; {'unknown' if free is None else f'{free / 1e9:.1f} GB'} free: "
        + ("measured together" if together else "measured one after the other (both do not fit)")
    )
    tables, tf, ref, alone = [], None, None, None
    run = dict(model=cfg.name, dtype=dtype, context=context, batch=batch, weights=weights)

    def timed(ready, seconds):
        _, rows = time_engines(ready, sol, {**provenance(dev), **run}, max(seconds, 1e-3), log=log)
        return pd.DataFrame(rows, columns=list(COLUMNS))

    if "transformers" in engines:
        tf = start_transformers(cfg, context, batch, dtype, device, seed, log)
        if "reference" in engines:  # transformers alone first: its rows if the reference's compile runs out of time
            alone = timed([tf], timing_s / 2 if together else timing_s)
            if not together:
                tables.append(alone)
                tf.close()
                tf = None
    if "reference" in engines:
        finish = start_reference(cfg, context, batch, dtype, dev, seed, log)
        try:
            ref = finish(deadline - timing_s)
        except TimeoutError:
            log(
                f"reference: XLA still compiling after {log.elapsed():.0f} s of the {budget_s:.0f} s budget: not "
                "measured (a larger --budget-s gives it longer); nothing is timed beside the running compile"
            )
    ready = [e for e in (ref, tf) if e is not None]
    if ref is None and "reference" in engines:
        if tf is not None:
            tables.append(alone)
    elif ready:
        tables.append(timed(ready, deadline - time.perf_counter()))
    for e in ready:
        e.close()
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=list(COLUMNS))
    if out is not None and len(table):
        append_rows(table.to_dict("records"), out)
        log(f"appended {len(table)} rows to {out}")
    return table


def measure_reference(
    cfg: ModelConfig, context: int = 1024, batch: int = 1, budget_s: float = 300.0, device: str = "gpu", **kw
) -> pd.DataFrame:
    """The reference's step alone (beside the speed of light): one row, not written to a file."""
    return run(cfg, context, batch, budget_s, device, engines=("reference",), out=None, **kw)


def measure_transformers(
    cfg: ModelConfig, context: int = 1024, batch: int = 1, budget_s: float = 300.0, device: str = "gpu", **kw
) -> pd.DataFrame:
    """transformers' step alone (beside the speed of light): one row, not written to a file."""
    return run(cfg, context, batch, budget_s, device, engines=("transformers",), out=None, **kw)


def append_rows(rows: list[dict], path: Path | str = GPU_CSV) -> Path:
    """Append ``rows`` to the CSV at ``path`` atomically (mk.files.append_csv_rows)."""
    return append_csv_rows(rows, Path(path), COLUMNS, "a measure-gpu row")


def _missing(v) -> bool:
    return v is None or (isinstance(v, float) and v != v)


def text(table: pd.DataFrame) -> str:
    """The rows as a few readable lines."""
    if not len(table):
        return "no engine was measured"
    r0 = table.iloc[0]
    lines = [
        f"{r0['model']}, {r0['dtype']}, context {r0['context']}, batch {r0['batch']} on {r0['device']} "
        f"(measured {r0['date']}; speed of light: {r0['sol_source']}, {r0['sol_tokens_per_s']:.1f} tok/s)"
    ]
    for _, r in table.iterrows():
        k = "-" if _missing(r["kernels_per_step"]) else f"{r['kernels_per_step']:.0f}"
        lines.append(
            f"  {r['engine']:<13} {r['step_ms']:9.3f} ms ({r['step_low_ms']:.3f}-{r['step_high_ms']:.3f}, "
            f"{r['rounds']} rounds)  {r['tokens_per_s']:8.1f} tok/s  {k:>6} kernels  "
            f"{r['fraction_of_sol']:.1%} of the speed of light"
        )
    return "\n".join(lines)
