"""XLA's own TPU cost model, component by component: a second model, independent of mk's, to hold mk's
timing model (mk.plan.timeline) against.

libtpu's compiler estimates the run time of a program it compiles (``compiled.cost_analysis()``:
``optimal_seconds``, ``flops``, ``bytes accessed``), on a machine without a TPU too (ahead of time, for
a device of a topology described by mk.tpu). The estimate exists only for straight-line programs: on the
whole decode step (loops, conditionals) it is negative, i.e. none. So one decode step is cut here into
straight-line programs, one per component of mk.params, for ONE chip holding the whole model, full-size
shapes in bf16 (weights, activations and the KV cache):

- ``sliding_attention`` / ``full_attention`` (one layer of that kind): from the normed input, the q/k/v
  projections (a full layer with K=V has none for V), the q/k/v norms and RoPE, the new K/V written into
  the cache (donated, so in place, as the decode step does), attention over the layer's
  ``cfg.cache_positions(kind, context)`` cached positions, the o projection;
- ``shared_mlp`` (one layer): gate/up/down of the shared MLP (a dense model's only MLP);
- ``router`` (one layer, MoE): weightless norm and scale, the router projection, softmax, top-k, the
  renormalised and scaled weights;
- ``experts`` (one layer, MoE): given the routes, the reference's decode experts on a TPU
  (mk.blocks.experts_gathered on the stacked layout): each (user, slot) pair's expert weights taken by a
  dynamic slice of the stacked arrays, its gate/up/down, and the weighted sum in slot order. Not a
  gather: XLA's model charges a gather of an ``[E, ...]`` array with many times the whole array (26B-A4B:
  6.2 GB for 95 MB of experts) and for one user gives no estimate (negative), while B*k slices are
  charged their own bytes. Users that share an expert read it once each here (mk.sol counts distinct
  experts): at batch 1 the two agree;
- ``norms`` (one layer): the layer's residual wiring, as mk.plan attributes it: the input norm, the
  attention residual (``x + post_attn_norm(attn)``) and the FFN inputs (``pre_ffn_norm``, for MoE
  ``pre_ffn_norm_2``), the FFN residual (``post_ffn_norm_1/2``, ``post_ffn_norm``, ``layer_scalar``);
  and ``norms`` once per step: the final norm;
- ``head`` (once per step): the tied embedding ``[vocab, hidden]`` times the normed hidden state, the
  logit softcap, the argmax (the greedy token).

The math is the reference's own (mk.blocks' ``qkv``, ``attend_one``, ``mlp``, ``route``, ``head``, ``rms_norm``,
``matmul_t`` and mk.reference's ``write_slots``) on the decode layout of :func:`mk.reference.prepare`
(matrices ``[out, in]``). The q/k norm vectors are read by the attention programs (mk.plan's
``QKVNormRope`` is attention's too), though mk.params counts them under ``norms``. The embedding lookup of
the input token is left out (mk.sol does not count it either), as are the collectives (one chip).

Each program is compiled once for one device of the topology (``mk.tpu.topology(chip).devices[0]``);
inputs are ``jax.ShapeDtypeStruct``s, so no full-size array is ever allocated. :func:`xla_costs` gives one
row per program, :func:`per_step` the whole step's components (per-layer rows times the layers of that
kind). Separate programs cannot fuse across components, and XLA's model charges every fused op a fixed
time but no launch overhead: it is XLA's estimate, not a measurement.

Memory-space assignment is off by default (compile option ``xla_msa_enable=False``, column ``msa``).
XLA's estimate is a sum over the program's instructions, not a schedule: with it on, the compiler
prefetches weights and caches HBM -> VMEM (``copy-start``) and the model charges each prefetch in series
on top of the fused op that then reads it from VMEM, though the hardware overlaps them; and a sliced
prefetch (``slice-start``) has no estimate at all (-1 s, so the program's total goes negative).
Measured here (libtpu 0.0.42.1, 26B-A4B, v5e): one sliding layer's attention, 78 MB of weights and KV,
is 402 us and 296 MB accessed with it on, 106 us and 78 MB off; the q and k projections alone, with it
on, have no estimate. Off, every fused op reads its operands from HBM: the sum of their times is the
cost of the bytes and FLOPs as XLA's model sees them. ``msa=True`` gives the default program's figures.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Callable

import jax
import jax.numpy as jnp
import pandas as pd
from jax.sharding import SingleDeviceSharding

from .. import blocks, reference as R
from ..chips import get_chip
from ..config import FULL, GEMMA4, SLIDING, ModelConfig, get_config
from ..params import (
    EXPERTS,
    HEAD,
    NORMS,
    ROUTER,
    SHARED_MLP,
    WEIGHT_COMPONENTS,
    attention_component,
    layer_param_specs,
)
from ..progress import tqdm
from ..sol import bytes_per_token
from ..timing import GivenCosts, predict
from ..tpu import TOPOLOGIES, topology
from ..units import positive_int
from .harness import versions

KIND = "modelled (XLA TPU cost model)"
# libtpu's compile option switching memory-space assignment (HBM -> VMEM prefetches) on or off
MSA_OPTION = "xla_msa_enable"
# How often a program runs in one step: once per layer of its kind, once per layer, once per step.
PER_LAYER = "every layer"
PER_STEP = "once per step"


@dataclass(frozen=True)
class Program:
    """One straight-line piece of a decode step: ``fn(*args)`` with ``args`` (pytrees of
    ``jax.ShapeDtypeStruct``, no device) and the arguments it updates in place (``donate_argnums``).
    ``sol_weight_bytes`` / ``sol_kv_bytes``: what mk.sol counts for one run of it (one layer's share of
    the component; the KV cache its attention reads)."""

    name: str
    component: str
    layer_kind: str  # sliding / full (one layer of that kind), every layer, once per step
    fn: Callable = field(repr=False)
    args: tuple = field(repr=False)
    donate_argnums: tuple[int, ...] = ()
    sol_weight_bytes: float = 0.0
    sol_kv_bytes: float = 0.0


def _check(cfg: ModelConfig, context: int, batch: int) -> None:
    positive_int("context", context)
    positive_int("batch", batch)
    if cfg.family != GEMMA4:  # the programs below wire Gemma 4's layer (its norms, router and shared MLP)
        raise ValueError(f"XLA's cost programs are built for Gemma 4 models; {cfg.name} is a {cfg.family} model")


def layer_counts(cfg: ModelConfig) -> dict[str, int]:
    """How many times a program of each ``layer_kind`` runs in one decode step."""
    return {
        str(SLIDING): len(cfg.sliding_layers),
        str(FULL): len(cfg.full_layers),
        PER_LAYER: cfg.num_layers,
        PER_STEP: 1,
    }


@dataclass(frozen=True)
class _StepShapes:
    """What the programs of one step are built from: the model, its users and positions, mk.sol's bytes of each
    component, and how often each kind of program runs (bf16, full-size, no device)."""

    cfg: ModelConfig
    batch: int
    context: int

    @cached_property
    def sol(self) -> dict[str, float]:
        return bytes_per_token(self.cfg, self.context, self.batch, "bf16").by_component

    @cached_property
    def counts(self) -> dict[str, int]:
        return layer_counts(self.cfg)

    def sds(self, shape, dtype=None):
        return jax.ShapeDtypeStruct(tuple(shape), jnp.bfloat16 if dtype is None else dtype)

    @property
    def stream(self):
        """The residual stream of the users, ``[B, 1, hidden]``."""
        return self.sds((self.batch, 1, self.cfg.hidden_size))

    @property
    def flat(self):
        return self.sds((self.batch, self.cfg.hidden_size))

    def layer(self, i: int, component: str, names=None) -> dict:
        """Layer i's tensors of ``component`` (or those ``names``), by short name, in the decode layout."""
        specs = [
            s
            for s in layer_param_specs(self.cfg, i)
            if (s.component == component if names is None else s.path.rsplit(".", 1)[1] in names)
        ]
        tree = {s.path: self.sds(s.shape) for s in specs}
        prepared = jax.eval_shape(partial(R.prepare, cfg=self.cfg), tree)
        return {k.rsplit(".", 1)[1]: v for k, v in prepared.items() if k != R.PREPARED}


def _attention_programs(s: _StepShapes) -> dict[str, Program]:
    """One layer of each attention kind the model has: q/k/v with norms and RoPE, the new K/V written into the
    donated cache, attention over the layer's cached positions, the o projection."""
    cfg, progs = s.cfg, {}
    pos = s.sds((s.batch,), jnp.int32)
    for t in (SLIDING, FULL):
        layers = cfg.sliding_layers if t == SLIDING else cfg.full_layers
        if not layers:
            continue
        comp = attention_component(t)
        p = s.layer(layers[0], comp, names=("q", "k", "v", "o", "q_norm", "k_norm"))
        positions = cfg.cache_positions(t, s.context)
        cache = s.sds((s.batch, cfg.kv_heads(t), positions, cfg.head_dim(t)))
        kv_name = "kv_sliding" if t == SLIDING else "kv_full"

        def attention(p, xn, k_cache, v_cache, pos, t=t, S=positions):
            q, k, v = blocks.qkv(p, cfg, t, xn, pos[:, None], frozenset(), blocks.matmul_t)
            slot = pos % S  # a sliding layer's ring (S = window once the context fills it); a full layer's pos
            k_cache = R.write_slots(k_cache, k.transpose(0, 2, 1, 3).astype(k_cache.dtype), slot)
            v_cache = R.write_slots(v_cache, v.transpose(0, 2, 1, 3).astype(v_cache.dtype), slot)
            mask = jnp.arange(S)[None, :] <= pos[:, None]
            attn = blocks.matmul_t(blocks.attend_one(q, k_cache, v_cache, mask, cfg.score_scale(t)), p["o"])
            return attn, k_cache, v_cache

        runs = s.counts[str(t)]
        progs[comp] = Program(
            comp,
            comp,
            str(t),
            attention,
            (p, s.stream, cache, cache, pos),
            donate_argnums=(2, 3),
            sol_weight_bytes=s.sol[comp] / runs,
            sol_kv_bytes=s.sol[kv_name] / runs,
        )
    return progs


def _ffn_programs(s: _StepShapes) -> dict[str, Program]:
    """One layer's shared MLP (a dense model's only MLP) and, for a MoE, its router and routed experts."""
    cfg, L = s.cfg, s.cfg.num_layers

    def shared_mlp(p, h):
        return blocks.mlp(h, p["mlp_gate"], p["mlp_up"], p["mlp_down"], blocks.matmul_t)

    mlp = s.layer(0, SHARED_MLP)
    progs = {
        SHARED_MLP: Program(
            SHARED_MLP, SHARED_MLP, PER_LAYER, shared_mlp, (mlp, s.stream), sol_weight_bytes=s.sol[SHARED_MLP] / L
        )
    }
    if not cfg.is_moe:
        return progs

    def route(p, x):
        return blocks.route(p, cfg, x, frozenset(), blocks.matmul_t)

    def routed_experts(p, h, w, ids):
        return blocks.experts_gathered(p, cfg, h, w, ids, blocks.matmul_t)

    router = s.layer(0, ROUTER)
    progs[ROUTER] = Program(ROUTER, ROUTER, PER_LAYER, route, (router, s.flat), sol_weight_bytes=s.sol[ROUTER] / L)
    # the reference's program on a TPU: experts stacked, every expert matrix [intermediate, hidden] (gate and up
    # [out, in], down [in, out]; mk.reference.prepare), each (user, slot)'s a dynamic slice read in place
    stacked = s.sds((cfg.num_experts, cfg.expert_intermediate, cfg.hidden_size))
    experts = {"expert_gate": stacked, "expert_up": stacked, "expert_down": stacked}
    routes = (s.sds((s.batch, cfg.top_k)), s.sds((s.batch, cfg.top_k), jnp.int32))
    progs[EXPERTS] = Program(
        EXPERTS, EXPERTS, PER_LAYER, routed_experts, (experts, s.flat, *routes), sol_weight_bytes=s.sol[EXPERTS] / L
    )
    return progs


def _norm_programs(s: _StepShapes) -> dict[str, Program]:
    """One layer's residual wiring (component ``norms``) and the final norm, once per step."""
    cfg, eps, x = s.cfg, s.cfg.rms_eps, s.stream
    norm_names = ["input_norm", "post_attn_norm", "pre_ffn_norm", "post_ffn_norm", "layer_scalar"]
    if cfg.is_moe:
        norm_names += ["pre_ffn_norm_2", "post_ffn_norm_1", "post_ffn_norm_2"]

    def layer_norms(p, x, attn, mlp, moe):
        """What mk.plan's Norm(input_norm), AttentionResidual and FfnResidual compute (mk.reference's
        _layer and _ffn wiring without the blocks between them): the blocks' inputs and the new stream."""
        xn = blocks.rms_norm(x, p["input_norm"], eps)
        x = x + blocks.rms_norm(attn, p["post_attn_norm"], eps)
        h = blocks.rms_norm(x, p["pre_ffn_norm"], eps)
        if cfg.is_moe:
            h2 = blocks.rms_norm(x, p["pre_ffn_norm_2"], eps)
            ffn = blocks.rms_norm(mlp, p["post_ffn_norm_1"], eps) + blocks.rms_norm(moe, p["post_ffn_norm_2"], eps)
        else:
            h2, ffn = None, mlp
        x = (x + blocks.rms_norm(ffn, p["post_ffn_norm"], eps)) * p["layer_scalar"].astype(x.dtype)
        return xn, h, h2, x

    def final_norm(w, x):
        return blocks.rms_norm(x, w, eps)

    final_bytes = cfg.hidden_size * 2  # final_norm in bf16
    norms = s.layer(0, NORMS, names=norm_names)
    args = (norms, x, x, x, x if cfg.is_moe else None)
    layer_bytes = (s.sol[NORMS] - final_bytes) / cfg.num_layers
    return {
        NORMS: Program(NORMS, NORMS, PER_LAYER, layer_norms, args, sol_weight_bytes=layer_bytes),
        "final_norm": Program(
            "final_norm", NORMS, PER_STEP, final_norm, (s.sds((cfg.hidden_size,)), s.flat), sol_weight_bytes=final_bytes
        ),
    }


def _head_program(s: _StepShapes) -> Program:
    """The logits of the whole vocabulary, the softcap, the argmax (the greedy token)."""

    def head(embed, h):
        # the final norm is its own program: mk.reference's _head with norms switched off
        logits = blocks.head({"embed": embed, "final_norm": None}, s.cfg, h, frozenset({NORMS}))
        return jnp.argmax(logits, axis=-1)

    embed = s.sds((s.cfg.vocab_size, s.cfg.hidden_size))
    return Program(HEAD, HEAD, PER_STEP, head, (embed, s.flat), sol_weight_bytes=s.sol[HEAD])


def component_programs(cfg: ModelConfig, context: int = 1024, batch: int = 1) -> dict[str, Program]:
    """The straight-line programs of one decode step of ``cfg`` for one chip (bf16, full-size shapes), by
    name: ``sliding_attention``, ``full_attention`` (those the model has), ``shared_mlp``, ``router`` and
    ``experts`` (MoE), ``norms`` (one layer's), ``final_norm`` (component ``norms``, once per step), ``head``.
    ``context``: positions in the cache (a sliding layer attends over ``min(context, window)`` of them)."""
    _check(cfg, context, batch)
    s = _StepShapes(cfg, batch, context)
    return {**_attention_programs(s), **_ffn_programs(s), **_norm_programs(s), HEAD: _head_program(s)}


def _on_device(args, device):
    sharding = SingleDeviceSharding(device)
    return jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding), args)


def compile_cost(program: Program, device, msa: bool = False) -> tuple[dict, float]:
    """XLA's cost analysis of ``program`` compiled for ``device`` (a TPU topology's), with memory-space
    assignment on or off (``msa``; see the module's docstring), and the seconds the lowering and
    compilation took."""
    t0 = time.perf_counter()
    compiled = (
        jax.jit(program.fn, donate_argnums=program.donate_argnums)
        .lower(*_on_device(program.args, device))
        .compile({MSA_OPTION: bool(msa)})
    )
    seconds = time.perf_counter() - t0
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):  # older JAX: one dict per program
        cost = cost[0] if cost else {}
    return dict(cost or {}), seconds


def _tpu_device(chip: str):
    if chip not in TOPOLOGIES:
        raise ValueError(
            f"XLA's TPU cost model needs a TPU chip; {chip!r} is not one mk can compile for "
            f"(known: {', '.join(TOPOLOGIES)})"
        )
    return topology(chip).devices[0]


def xla_costs(
    cfg: ModelConfig, chip: str, context: int = 1024, batch: int = 1, msa: bool = False, progress: bool = True
) -> pd.DataFrame:
    """XLA's TPU cost model of each program of :func:`component_programs`, compiled for one device of
    ``chip`` (a TPU topology of mk.tpu: ``tpu-v5e-8``, ``tpu-v6e-8``, ...), memory-space assignment off
    unless ``msa`` (see the module's docstring). One row per program: component, layer_kind, optimal_s
    (XLA's estimate; NaN where it gives none, i.e. a negative value), flops, bytes_accessed (as XLA counts
    them: every instruction's operands and results, so reads of the same bytes more than once too), what
    mk.sol counts for it (sol_weight_bytes, sol_kv_bytes), compile_s, and the model, chip, device,
    context, batch, msa, versions and kind."""
    _check(cfg, context, batch)
    device = _tpu_device(chip)
    ver = versions()
    rows = []
    programs = component_programs(cfg, context, batch)
    for prog in tqdm(programs.values(), desc=f"XLA cost model: {cfg.name} on {chip}", disable=not progress):
        cost, seconds = compile_cost(prog, device, msa)
        est = float(cost.get("optimal_seconds", math.nan))
        rows.append(
            dict(
                model=cfg.name,
                program=prog.name,
                component=prog.component,
                layer_kind=prog.layer_kind,
                optimal_s=est if est >= 0 else math.nan,
                flops=float(cost.get("flops", math.nan)),
                bytes_accessed=float(cost.get("bytes accessed", math.nan)),
                sol_weight_bytes=prog.sol_weight_bytes,
                sol_kv_bytes=prog.sol_kv_bytes,
                compile_s=seconds,
                chip=chip,
                device=str(getattr(device, "device_kind", device)),
                context=context,
                batch=batch,
                msa=bool(msa),
                jax_version=ver["jax_version"],
                libtpu_version=ver["libtpu_version"],
                kind=KIND,
            )
        )
    return pd.DataFrame(rows)


def per_step(df: pd.DataFrame, cfg: ModelConfig) -> pd.DataFrame:
    """The whole step's components from :func:`xla_costs`' rows: each row times how often its program runs
    in one step (``layers``: the layers of its kind, every layer, or once), summed by component, in
    mk.params' order. Sums of separate programs: no fusion across them."""
    if set(df["model"]) != {cfg.name}:
        raise ValueError(f"the table is for {sorted(set(df['model']))}, not {cfg.name!r}")
    counts = layer_counts(cfg)
    bad = sorted(set(df["layer_kind"]) - set(counts))
    if bad:
        raise ValueError(f"unknown layer_kind(s) {bad}; known: {', '.join(counts)}")
    d = df.copy()
    d["runs"] = d["layer_kind"].map(counts)
    scaled = ["optimal_s", "flops", "bytes_accessed", "sol_weight_bytes", "sol_kv_bytes", "compile_s"]
    for c in scaled[:-1]:
        d[c] = d[c] * d["runs"]
    keys = ["model", "chip", "context", "batch", "msa", "jax_version", "libtpu_version", "kind"]
    out = d.groupby(["component", *keys], sort=False, dropna=False).agg(
        runs=("runs", "sum"), **{c: (c, lambda s: s.sum(min_count=len(s))) for c in scaled}
    )
    out = out.reset_index()
    order = {c: i for i, c in enumerate(WEIGHT_COMPONENTS)}
    out = out.sort_values("component", key=lambda s: s.map(order)).reset_index(drop=True)
    out["share"] = out["optimal_s"] / out["optimal_s"].sum()
    return out[["component", "runs", *scaled, "share", *keys]]


def against_timing_model(model: str, chip: str, context: int = 1024, batch: int = 1) -> pd.DataFrame:
    """Per component of one step on ONE chip of ``chip``'s kind holding the whole model: XLA's TPU cost model
    on straight-line programs (:func:`xla_costs`, compiled ahead of time by libtpu) beside the timing
    model's general-stack work for the same component (its kernels' bytes and matrix time, no per-kernel
    cost: XLA's model charges none) and the speed of light's bytes time, with the error model / XLA - 1."""
    cfg, one = get_config(model), get_chip(get_chip(chip).base)
    xla = per_step(xla_costs(cfg, chip, context, batch, progress=False), cfg).set_index("component")
    work = predict(cfg, one, context, batch, "general", costs=GivenCosts(kernel_s=0.0)).components
    bc = bytes_per_token(cfg, context, batch).by_component
    kv = {"sliding_attention": "kv_sliding", "full_attention": "kv_full"}
    rows = []
    for component, xla_s in xla["optimal_s"].items():
        nbytes = bc.get(component, 0.0) + bc.get(kv.get(component, ""), 0.0)
        modelled = work.get(component, 0.0)
        rows.append(
            dict(
                model=model,
                chip=one.name,
                component=component,
                xla_ms=xla_s * 1e3,
                modelled_ms=modelled * 1e3,
                sol_ms=nbytes / one.hbm_bandwidth * 1e3,
                error=modelled / xla_s - 1,
            )
        )
    return pd.DataFrame(rows).assign(kind="modelled (mk.timing) vs modelled (XLA TPU cost model)")
