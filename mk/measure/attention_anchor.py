"""An anchor for the megakernel's attention on the chip: JAX's own Pallas TPU decode attention (ragged paged
attention, ``jax.experimental.pallas.ops.tpu.ragged_paged_attention``) over the same users' KV cache, every layer, in
one program, interleaved in one run with the megakernel's step with every component but attention knocked out
(``python -m mk tpu-measure --parts anchor``; rows to data/measured/tpu_attention.csv).

The two do not read the same bytes: the anchor reads the cache only, the megakernel's attention its q/k/v/o weights
too, and it writes the new position's k and v. So the comparison is of the cost of one more cached position: each
engine's device time at several contexts, and the slope between the shortest and the longest (seconds per cached byte)
as a read rate, against the chip's measured limit. A model of one attention type (Llama 3, Qwen3) only: the anchor's
cache holds one layer type."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import jax.numpy as jnp

from ..config import ModelConfig
from ..files import append_csv_rows
from ..params import FULL_ATTENTION, KNOCKOUTS, SLIDING_ATTENTION, param_specs
from ..progress import Log
from ..sol import kv_bytes_per_user
from ..timing.scheduled import recorded_revision
from .harness import CHIP_PROVENANCE, chip_provenance
from .loop import back_to_back, interleaved
from .on_chip import Case, CaseEngines, Cell
from .steps import traced_digest

PAGE = 128  # positions a page: the lane width, the anchor's own tuned tables' smallest for decode
KV_PAGES_A_BLOCK, QUERIES_A_BLOCK = 8, 8
CONTEXTS = (1024, 8192, 32768)
STEPS_BACK_TO_BACK = 10
# Qwen3-8B's first 8 layers (heads 128 wide): JAX 0.10.2's kernel asserts a head width that is a multiple of 128
# lanes, so llama-3.2-1b's 64-wide heads do not run in it
CASE = Case("qwen3-8b", 8, cells=tuple(Cell(c, 1) for c in CONTEXTS))
ANCHOR, MEGAKERNEL = "ragged paged attention (JAX's Pallas TPU kernel)", "megakernel, attention only"
COLUMNS = (*CHIP_PROVENANCE, "kernel_revision", "program_digest", "model", "batch", "engine", "context", "kv_bytes",
           "steps_back_to_back", "rounds", "device_step_ms", "device_step_low_ms", "device_step_high_ms", "slope_GBps",
           "slope_low_GBps", "slope_high_GBps", "limit_GBps")  # fmt: skip


def attention_only(cfg: ModelConfig) -> frozenset[str]:
    """Every component of ``cfg`` but its attention, to knock out."""
    present = {s.component for s in param_specs(cfg)}
    return frozenset(c for c in KNOCKOUTS if c in present and c not in (FULL_ATTENTION, SLIDING_ATTENTION))


def paged_inputs(cfg: ModelConfig, context: int, batch: int, key=None):
    """(q [batch, heads, head_dim], one layer's pages [pages, PAGE, 2 x kv heads, head_dim] per layer, kv_lens,
    page_indices, cu_q_lens, num_seqs): ``batch`` users at position ``context`` - 1, each reading ``context`` cached
    positions from pages of its own, random bf16."""
    dims = {cfg.head_dim(t) for t in cfg.layer_types}
    if len(dims) != 1 or len(set(cfg.layer_types)) != 1:
        raise ValueError(f"{cfg.name}: the anchor runs a model of one attention type and head width only")
    hd, kv_heads, per_user = dims.pop(), cfg.kv_heads(cfg.layer_types[0]), math.ceil(context / PAGE)
    k1, k2 = jax.random.split(jax.random.key(0) if key is None else key)
    q = jax.random.normal(k1, (batch, cfg.num_heads, hd), jnp.bfloat16)
    shape = (batch * per_user, PAGE, 2 * kv_heads, hd)
    pages = [jax.random.normal(k, shape, jnp.bfloat16) for k in jax.random.split(k2, cfg.num_layers)]
    lens = jnp.full((batch,), context, jnp.int32)
    indices = jnp.arange(batch * per_user, dtype=jnp.int32).reshape(batch, per_user)
    return q, pages, lens, indices, jnp.arange(batch + 1, dtype=jnp.int32), jnp.array([batch], jnp.int32)


def anchor_step(cfg: ModelConfig):
    """Every layer's ragged paged attention for one decode step, in one program."""
    from jax.experimental.pallas.ops.tpu.ragged_paged_attention import ragged_paged_attention

    @jax.jit
    def step(q, pages, lens, indices, cu_q, seqs):
        # the scale changes no byte or op: 1/sqrt(head width) stands for each family's own
        scale = q.shape[-1] ** -0.5
        outs = [ragged_paged_attention(q, p, lens, indices, cu_q, seqs, sm_scale=scale,
                                       num_kv_pages_per_block=min(KV_PAGES_A_BLOCK, indices.shape[1]),
                                       num_queries_per_block=QUERIES_A_BLOCK) for p in pages]  # fmt: skip
        return jnp.stack(outs)

    return step


def measure(case: Case = CASE, out: Path | str | None = None, limit=None, budget_s: float = 20.0, quiet: bool = False):
    """The anchor and the megakernel's attention at each of ``case``'s contexts (one batch), all interleaved; rows
    appended to ``out``."""
    log, device = Log(quiet), jax.devices()[0]
    cfg, batch = case.config(), case.cells[0].batch
    engines = CaseEngines(case, device, 0, log)
    engines.build("megakernel")
    step, calls, kv, programs = anchor_step(cfg), {}, {}, {}
    for cell in case.cells:
        args = paged_inputs(cfg, cell.context, batch)
        jax.block_until_ready(step(*args))
        calls[(ANCHOR, cell.context)] = back_to_back(lambda a=args: step(*a), STEPS_BACK_TO_BACK)
        mk_call, _ = engines.call("megakernel", cell, attention_only(cfg))
        calls[(MEGAKERNEL, cell.context)] = back_to_back(mk_call, STEPS_BACK_TO_BACK)
        programs[(ANCHOR, cell.context)] = traced_digest(step, *args)
        programs[(MEGAKERNEL, cell.context)] = mk_call.program_digest()
        kv[cell.context] = sum(kv_bytes_per_user(cfg, cell.context).values()) * batch  # bf16: 2 bytes
        log(f"context {cell.context}: both compiled")
    named = {f"{e} at {c}": f for (e, c), f in calls.items()}
    cmp = interleaved(named, next(iter(named)), budget_s=budget_s, min_rounds=5)
    engines.close()
    return _rows(cmp, case, kv, programs, limit, out, log)


def _rows(cmp, case: Case, kv: dict, programs: dict, limit, out, log) -> list[dict]:
    keep = chip_provenance()
    lo, hi, rows = min(kv), max(kv), []
    for engine in (ANCHOR, MEGAKERNEL):
        slope = cmp.rate(f"{engine} at {lo}", f"{engine} at {hi}", kv[hi] - kv[lo], STEPS_BACK_TO_BACK)
        for c in kv:
            t, ms = cmp.times[f"{engine} at {c}"], 1e3 / STEPS_BACK_TO_BACK
            rows.append(dict(
                keep, kernel_revision=recorded_revision(), program_digest=programs[(engine, c)],
                model=case.config().name, batch=case.cells[0].batch,
                engine=engine, context=c, kv_bytes=int(kv[c]), steps_back_to_back=STEPS_BACK_TO_BACK,
                rounds=cmp.rounds, device_step_ms=round(t.median * ms, 4), device_step_low_ms=round(t.low * ms, 4),
                device_step_high_ms=round(t.high * ms, 4), slope_GBps=round(slope.median / 1e9, 2),
                slope_low_GBps=round(slope.low / 1e9, 2), slope_high_GBps=round(slope.high / 1e9, 2),
                limit_GBps=None if limit is None else round(limit.bandwidth / 1e9, 2),
            ))  # fmt: skip
        log(f"{engine}: " + ", ".join(f"{c}: {r['device_step_ms']:.3f} ms" for c, r in zip(kv, rows[-len(kv):]))
            + f"; a cached byte's rate {slope.median / 1e9:.0f} GB/s")  # fmt: skip
    if out is not None:
        append_csv_rows(rows, Path(out), COLUMNS, "an attention-anchor row")
    return rows
