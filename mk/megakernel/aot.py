"""The megakernel compiled ahead of time for a TPU slice on a machine without one (libtpu's own Mosaic
compiler, see mk.tpu): the step, the compiler's VMEM figure, and compile time against layer count."""

from __future__ import annotations

import math
import re
import time
from functools import partial

import jax
import pandas as pd

from ..chips import check_one_device, get_chip, slice_of, slice_shape, slice_shapes
from ..config import ModelConfig, get_config
from ..files import text_digest
from ..kernel_setup import ONE_CHIP, KernelSetup
from ..plan import build_plan
from ..plan.schedule import pattern_period
from ..profiling import Estimate
from ..sharding import torus_order
from ..tpu import TOPOLOGIES, aot_trace, topology
from .kernel import build_call, global_shapes, partition_specs
from .pack import packed_shapes
from .refs import input_shapes


def compile_for_tpu(
    cfg: ModelConfig,
    chip: str,
    batch: int,
    max_len: int,
    *,
    compiler_options: dict | None = None,
    vmem_limit_bytes: int | None = None,
    **plan_options,
):
    """Compile one decode step (users block in, users block out) for ``chip`` ahead of time with
    libtpu's Mosaic compiler (see mk.tpu). The plan's VMEM budget is checked against the chip first and
    given to the compiler as its VMEM limit. ``plan_options``: mk.plan.build_plan's keywords (the arrays in
    ``bfloat16`` unless ``weight_dtype``/``kv_dtype`` say otherwise); with ``setup`` the step is split over the slice's
    chips (``chip`` a slice of ``setup.chips``: ``tpu-v5e-8``), each weight and cache sharded on its split axis.
    Returns (plan, compiled): one chip's plan, the program of every chip."""
    plan = _plan(cfg, batch, max_len, plan_options)
    return plan, compile_plan(plan, chip, compiler_options, vmem_limit_bytes)


def _plan(cfg: ModelConfig, batch: int, max_len: int, plan_options: dict):
    """The plan :func:`compile_for_tpu` compiles: mk.plan.build_plan's, its arrays bfloat16 by default."""
    return build_plan(cfg, batch, max_len, **{"weight_dtype": "bfloat16", "kv_dtype": "bfloat16", **plan_options})


def aot_target(chip: str) -> tuple[str, str]:
    """(the chip or slice as mk.chips names it, the topology libtpu compiles it for) of ``chip``: a chip or slice of
    mk.tpu.TOPOLOGIES (``tpu-v5e``: one chip of a 2x2), a slice whose shape data/slices.csv documents (``tpu-v5e-16``:
    ``v5e:4x4``, two hosts), or a topology as libtpu names it (``v6e:4x4``: ``tpu-v6e-16``)."""
    if ":" in chip:
        gen, _, dims = chip.partition(":")
        try:
            n = math.prod(int(d) for d in dims.split("x"))
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"{chip!r} is no TPU topology: give one as libtpu names it, like v5e:4x4 or v5p:2x2x2")
        return slice_of(f"tpu-{gen}", n).name, chip
    if chip in TOPOLOGIES:
        return chip, TOPOLOGIES[chip]
    shape = slice_shape(get_chip(chip))
    if get_chip(chip).kind != "tpu" or shape is None or shape.chips == 1:
        shapes = [s for v in slice_shapes().values() for s in v if s.chips > 1 and s.name not in TOPOLOGIES]
        known = [*TOPOLOGIES, *(s.name for s in shapes)]
        raise ValueError(
            f"no TPU topology to compile {chip!r} for: give a slice data/slices.csv documents or mk.tpu.TOPOLOGIES "
            f"has ({', '.join(known)}), or a topology as libtpu names it (v6e:4x4)"
        )
    return shape.name, shape.topology_name


def compile_plan(plan, chip: str, compiler_options: dict | None = None, vmem_limit_bytes: int | None = None):
    """The kernel of ``plan`` (one chip's, of a slice where its setup splits the step) compiled ahead of time for
    ``chip`` (:func:`aot_target`: a slice past one host too) in the plan's own data types (bf16 or f32 by its item
    sizes, INT8 codes by its scheme)."""
    return traced_plan(plan, chip, vmem_limit_bytes).lower().compile(compiler_options)


def traced_plan(plan, chip: str, vmem_limit_bytes: int | None = None):
    """What :func:`compile_plan` compiles, traced only (a ``jax.stages.Traced``)."""
    name, topo = aot_target(chip)
    check_one_device(get_chip(name))
    shapes = input_shapes(plan)
    # the kernel as the engine builds it (mk.megakernel.kernel.build_call: the plan's VMEM limit for the chip, each
    # dot's precision from its data type); ``vmem_limit_bytes`` only to probe the compiler's own figure
    fn = partial(build_call, plan, name, interpret=None, vmem_limit_bytes=vmem_limit_bytes)
    if plan.chips > 1 and not plan.setup.loopback:
        return _traced_sharded(plan, topo, shapes, fn)
    fn = fn()
    return aot_trace(
        lambda p, c, u: tuple(fn(p, c, u)[:2]),
        topo,
        packed_shapes(plan.share, plan.weight_dtype, plan.quantize),  # one chip's: the model's or the stand-in's
        shapes.cache,
        shapes.users,
        donate_argnums=(1,),
    )


def program_digest(plan, chip: str) -> str:
    """A digest of the kernel of ``plan`` as traced for ``chip`` (its printed jaxpr, without source locations): two
    trees whose digests agree hand the compiler the same program (mk.measure.compiler_schedule carries a plan's schedule
    over to a new kernel revision on it)."""
    return text_digest(str(traced_plan(plan, chip).jaxpr))


def _traced_sharded(plan, chip: str, shapes, build):
    """The step over the slice's chips, traced from global shapes that carry their sharding."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding

    devices = topology(chip).devices  # every host's chips: one program, each host running its own chips' share
    devices = torus_order(devices) if plan.setup.torus else devices
    if len(devices) != plan.chips:
        raise ValueError(f"{chip} has {len(devices)} chips, the plan is split over {plan.chips}")
    mesh = Mesh(np.array(devices), (plan.setup.axis,))
    fn = build(mesh=mesh)
    spec = jax.tree.map(
        lambda s, p: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=NamedSharding(mesh, p)),
        global_shapes(plan, shapes),
        partition_specs(plan, shapes),
    )
    packed = dict(vectors=spec.vectors, inv_freq=spec.inv_freq, weights=spec.weights)
    step = jax.jit(lambda p, c, u: tuple(fn(p, c, u)[:2]), donate_argnums=(1,))
    return step.trace(packed, spec.cache, spec.users)


def compiler_vmem_bytes(cfg: ModelConfig, chip: str, batch: int, max_len: int, **plan_options) -> tuple[int, float]:
    """(the plan's VMEM bytes, the VMEM libtpu's compiler says the kernel needs: :func:`refused_vmem_bytes`) of the
    plan :func:`compile_for_tpu` builds from the same arguments."""
    plan = _plan(cfg, batch, max_len, plan_options)
    return plan.vmem_bytes, refused_vmem_bytes(plan, chip)


def refused_vmem_bytes(plan, chip: str) -> float:
    """The VMEM libtpu's compiler says ``plan``'s kernel needs: given a limit of half the plan's budget it refuses the
    kernel and states the size of its scoped allocation (to three digits)."""
    try:
        compile_plan(plan, chip, vmem_limit_bytes=plan.vmem_bytes // 2)
    except Exception as e:  # libtpu raises a runtime error naming the allocation
        m = re.search(r"Scoped allocation with size ([\d.]+)([KMG]?)", str(e))
        if m is None:
            raise
        return float(m.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[m.group(2)]
    raise AssertionError("the kernel compiled with half the plan's VMEM: the plan over-counts")


def emitted_code(plan) -> dict:
    """What the kernel of ``plan`` writes code for (mk.plan's ``emitted_ops``: a loop's body once), split at the loop
    over layers: the layers inside it (its repeats times the layer pattern's period; 0 where none formed: it needs
    at least two whole repeats of the pattern between the first, whose DMAs start before the step, and the last,
    which prefetches the head), the ops its body emits once, and the ops emitted outside it (the layers before and
    after it, each with its own code, and the head)."""
    loop = [r for r in plan.loop_table() if r["component"] == "layers"]
    looped = loop[0]["repeats"] * pattern_period(plan.share.layer_types) if loop else 0
    inside = loop[0]["ops_per_repeat"] if loop else 0
    return dict(
        looped_layers=looped,
        emitted_ops=plan.emitted_ops,
        emitted_in_layer_loop=inside,
        emitted_outside=plan.emitted_ops - inside,
        plan_ops=len(plan.ops),
    )


def emitted_code_table(
    cfg: ModelConfig, layer_counts, batch: int = 1, max_len: int = 256, dtype: str = "bfloat16", loops=(False, True)
) -> pd.DataFrame:
    """:func:`emitted_code` of ``cfg`` cut to each layer count, without the loop over layers and with it
    (``loops``: the ``loop_layers`` settings): counted from the step plan, nothing compiled (what
    :func:`compile_times` compiles)."""
    rows = []
    for n in layer_counts:
        for loop in loops:
            plan = build_plan(cfg.truncated(n), batch, max_len, weight_dtype=dtype, kv_dtype=dtype, loop_layers=loop)
            rows.append(dict(layers=n, loop_layers=loop, **emitted_code(plan)))
    return pd.DataFrame(rows)


def layer_loop_onset(
    cfg: ModelConfig, batch: int = 1, max_len: int = 256, dtype: str = "bfloat16"
) -> tuple[int, int | None]:
    """(the period of ``cfg``'s layer pattern, the fewest layers of that pattern repeated at which the loop over layers
    forms, None if it forms at no count up to six periods): counted from the step plan, nothing compiled."""
    period = pattern_period(cfg.layer_types) or cfg.num_layers
    pattern = cfg.replace(layer_types=cfg.layer_types[:period] * 6)
    for n in range(2 * period, 6 * period + 1):
        plan = build_plan(pattern.truncated(n), batch, max_len, weight_dtype=dtype, kv_dtype=dtype, loop_layers=True)
        if emitted_code(plan)["looped_layers"]:
            return period, n
    return period, None


def compile_times(
    cfg: ModelConfig,
    chip: str,
    layer_counts,
    batch: int = 1,
    max_len: int = 256,
    dtype: str = "bfloat16",
    repeats: int = 3,
    confidence: float = 0.95,
    warm_up: bool = True,
) -> pd.DataFrame:
    """Seconds libtpu takes to compile the step of ``cfg`` cut to each layer count, with the layer pattern
    emitted as one loop and with every layer's own code (``loop_layers``): every configuration compiled
    ``repeats`` times, round by round (after one warm-up compile: the first pays for libtpu's start; ``warm_up``
    False where this process has compiled a kernel for a TPU already).
    Rows: layers, loop_layers, what the kernel writes code for (:func:`emitted_code`: the layers inside the loop over
    layers, the ops emitted inside and outside it, their sum ``emitted_ops``), compile_s (median) with its interval
    (mk.profiling.median_interval: with 3 repeats, the whole range)."""
    if warm_up:
        compile_for_tpu(cfg.truncated(min(layer_counts)), chip, batch, max_len, weight_dtype=dtype, kv_dtype=dtype)
    configs = [(n, loop) for n in layer_counts for loop in (False, True)]
    times: dict = {c: [] for c in configs}
    ops: dict = {}
    for _ in range(repeats):
        for n, loop in configs:
            t0 = time.perf_counter()
            plan, _ = compile_for_tpu(
                cfg.truncated(n), chip, batch, max_len, weight_dtype=dtype, kv_dtype=dtype, loop_layers=loop
            )
            times[(n, loop)].append(time.perf_counter() - t0)
            ops[(n, loop)] = emitted_code(plan)
    rows = []
    for (n, loop), ts in times.items():
        e = Estimate.of(ts, confidence)
        rows.append(
            dict(
                layers=n,
                loop_layers=loop,
                **ops[(n, loop)],
                **e.columns("compile"),
                repeats=len(ts),
            )
        )
    return pd.DataFrame(rows)


def compiled_kind(device: str) -> str:
    """What a table of :func:`sharded_compiles` is, for its caption: compiled (not run) on ``device``."""
    return (
        f"compiled ahead of time by libtpu on {device}: compile_s measured there, compiler_hbm_gb read off the "
        "compiled program, plan_* modelled (step plan); nothing ran on a TPU"
    )


def sharded_compiles(
    models,
    chips,
    placements=("whole", "split"),
    batch: int = 1,
    max_len: int = 1024,
    quantize: str = "none",
    setup: KernelSetup = ONE_CHIP,
) -> pd.DataFrame:
    """Each model's whole decode step (every layer, full size, bf16; ``quantize``: the mk.quant scheme's
    matrices INT8; ``setup``: the kernel setup, its chips the slice's and its placement each of ``placements``)
    split over each 8-chip
    slice, compiled ahead of time by libtpu (both expert placements for an MoE model): per chip, the HBM its
    arguments take as the compiler reports it beside the plan's (weights and cache, sharded), the plan's VMEM
    and the limit the compiler accepted it under, and the compile time."""
    rows = []
    for model in models:
        cfg = get_config(model)
        for chip in chips:
            n = get_chip(chip).chips
            for placement in placements if cfg.is_moe else ("split",):
                t0 = time.perf_counter()
                plan, compiled = compile_for_tpu(
                    cfg,
                    chip,
                    batch,
                    max_len,
                    setup=setup.but(chips=n, placement=placement),
                    quantize=quantize,
                )
                seconds = time.perf_counter() - t0
                shapes = input_shapes(plan)
                plan_hbm = sum(s.size * s.dtype.itemsize for s in jax.tree.leaves(shapes))
                need = plan.vmem_bytes
                rows.append(
                    dict(
                        model=cfg.name,
                        chip=chip,
                        placement=placement if cfg.is_moe else "-",
                        quantize=quantize,
                        attention_split=str(setup.attention_split),
                        draft_tokens=setup.draft_tokens,
                        compiler_hbm_gb=compiled.memory_analysis().argument_size_in_bytes / 1e9,
                        plan_hbm_gb=plan_hbm / 1e9,
                        hbm_per_chip_gb=get_chip(chip).hbm_bytes / n / 1e9,
                        plan_vmem_mib=need / 2**20,
                        vmem_limit_mib=plan.vmem_limit(chip) / 2**20,
                        compile_s=seconds,
                        # Mosaic kernels; XLA's own custom calls (its layout plumbing, e.g. ConcatBitcast) aside
                        mosaic_calls=compiled.as_text().count('custom_call_target="tpu_custom_call"'),
                    )
                )
    return pd.DataFrame(rows)
