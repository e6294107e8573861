"""The decode step compiled ahead of time for a TPU slice, one host or several (``python -m mk compile``): the plan's
bytes a chip holds (weights, KV cache, the users block) set against what libtpu's compiler lays out for each device,
the plan's VMEM against the compiler's own figure, the Mosaic calls each chip's program makes, and the compile time.

A slice past one host compiles as one program over all its chips (JAX's multi-controller model: every host runs the
same program and its own chips' share of it); libtpu's topology description (mk.tpu.topology) gives every chip with
the host (``process_index``) it sits on, so nothing here needs the hosts themselves. Nothing runs on a TPU.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import jax

from ..chips import get_chip, slice_shape
from ..kernel_setup import ONE_CHIP
from ..tpu import libtpu_version, topology
from ..units import MIB
from .aot import aot_target, compile_plan, refused_vmem_bytes
from .refs import input_shapes

# A Mosaic kernel in the compiled program (XLA's own custom calls, its layout plumbing, are not counted)
MOSAIC_CALL = 'custom_call_target="tpu_custom_call"'


@dataclass(frozen=True)
class SliceCompile:
    """One compile of a step plan for a slice; bytes are per chip (per device of the compiled program)."""

    model: str
    chip: str  # the slice as mk.chips names it
    topology: str  # as libtpu names it
    chips: int
    hosts: int  # the processes (hosts) libtpu's topology spreads the chips over: one JAX process each
    documented_hosts: float | None  # the hosts data/slices.csv gives the slice (None: not documented there)
    batch: int
    context: int
    setup: str
    plan_weight_bytes: int  # the packed weights, the norm vectors and RoPE's frequencies a chip holds
    plan_cache_bytes: int  # its KV cache (donated: written in place)
    plan_users_bytes: int  # the users block (each user's token and position)
    compiler_argument_bytes: int  # libtpu's memory analysis: the arguments of one device's program
    compiler_output_bytes: int
    compiler_alias_bytes: int  # outputs that alias (are written into) arguments: the cache
    compiler_temp_bytes: int
    hbm_bytes: float  # one chip's HBM (data/chips.csv)
    plan_vmem_bytes: int
    vmem_limit_bytes: int  # the limit the compiler was given (mk.plan.vmem.vmem_limit)
    compiler_vmem_bytes: float | None  # the scoped VMEM libtpu states (None: not asked for)
    mosaic_calls: int  # per chip: every chip runs the same program
    compile_s: float
    libtpu: str

    @property
    def plan_bytes(self) -> int:
        """The plan's bytes a chip holds: the kernel's arguments (weights, cache, users block)."""
        return self.plan_weight_bytes + self.plan_cache_bytes + self.plan_users_bytes

    def to_dict(self) -> dict:
        return dict(dataclasses.asdict(self), plan_bytes=self.plan_bytes)


def plan_bytes(plan) -> dict[str, int]:
    """A chip's bytes of ``plan``'s kernel arguments, in its own data types: weights, cache, users block."""
    shapes = input_shapes(plan)

    def size(tree) -> int:
        return sum(s.size * s.dtype.itemsize for s in jax.tree.leaves(tree))

    weights = size((shapes.vectors, shapes.inv_freq, shapes.weights))
    return dict(weights=weights, cache=size(shapes.cache), users=size(shapes.users))


def check_fits(plan, chip: str) -> None:
    """Raise a one-line ValueError when a chip of ``chip`` cannot hold ``plan``'s weights and cache in its HBM."""
    c, b = get_chip(chip), plan_bytes(plan)
    need, have = sum(b.values()), get_chip(chip).hbm_bytes / c.chips
    if need > have:
        raise ValueError(
            f"{plan.model.name} does not fit {c.name}: a chip of it would hold {need / 1e9:.2f} GB "
            f"(weights {b['weights'] / 1e9:.2f}, KV cache {b['cache'] / 1e9:.2f}) in {have / 1e9:.2f} GB of HBM; "
            "take a larger slice (python -m mk sol --chip auto names the smallest), a shorter --context, a smaller "
            "--batch or INT8 weights (--dtype int8)"
        )


def compile_on_slice(plan, chip: str, vmem: bool = True) -> SliceCompile:
    """``plan`` (chip 0's plan of a setup over all of ``chip``'s chips, mk.plan.build_plan) compiled ahead of time
    for ``chip`` (mk.megakernel.aot.aot_target: a slice name or a libtpu topology); refused first, in one line, when
    a chip's HBM cannot hold it. ``vmem``: compile a second time under half the plan's VMEM for the compiler's own
    figure."""
    name, topo = aot_target(chip)
    c = get_chip(name)
    if plan.chips != c.chips:
        raise ValueError(f"the plan is split over {plan.chips} chips, {chip} has {c.chips}: plan it for {name}")
    check_fits(plan, name)
    t0 = time.perf_counter()
    compiled = compile_plan(plan, chip)
    seconds = time.perf_counter() - t0
    m = compiled.memory_analysis()
    b = plan_bytes(plan)
    return SliceCompile(
        model=plan.model.name,
        chip=name,
        topology=topo,
        chips=c.chips,
        hosts=len({d.process_index for d in topology(topo).devices}),
        documented_hosts=getattr(slice_shape(get_chip(name)), "hosts", None),
        batch=plan.batch,
        context=plan.max_len,
        setup=(plan.setup or ONE_CHIP).name,
        plan_weight_bytes=b["weights"],
        plan_cache_bytes=b["cache"],
        plan_users_bytes=b["users"],
        compiler_argument_bytes=m.argument_size_in_bytes,
        compiler_output_bytes=m.output_size_in_bytes,
        compiler_alias_bytes=m.alias_size_in_bytes,
        compiler_temp_bytes=m.temp_size_in_bytes,
        hbm_bytes=c.hbm_bytes / c.chips,
        plan_vmem_bytes=plan.vmem_bytes,
        vmem_limit_bytes=plan.vmem_limit(name),
        compiler_vmem_bytes=refused_vmem_bytes(plan, chip) if vmem else None,
        mosaic_calls=compiled.as_text().count(MOSAIC_CALL),
        compile_s=seconds,
        libtpu=libtpu_version(),
    )


def text(s: SliceCompile) -> str:
    """What ``python -m mk compile`` prints of ``s``."""
    gb = 1e9
    documented = "" if s.documented_hosts is None else f"; {s.documented_hosts:g} hosts in data/slices.csv"
    vmem = "not asked for" if s.compiler_vmem_bytes is None else f"{s.compiler_vmem_bytes / MIB:9.1f} MiB"
    return "\n".join(
        [
            f"{s.model} on {s.chip} ({s.topology}: {s.chips} chips, {s.hosts} process{'es' * (s.hosts > 1)} in "
            f"libtpu's topology{documented}), batch {s.batch}, context {s.context}: compiled ahead of time by libtpu "
            f"{s.libtpu} (nothing ran on a TPU)",
            f"  setup            {s.setup}",
            "  per chip            plan (modelled)   compiler (memory analysis)",
            f"  weights          {s.plan_weight_bytes / gb:12.4f} GB",
            f"  KV cache         {s.plan_cache_bytes / gb:12.4f} GB",
            f"  users block      {s.plan_users_bytes / gb:12.4f} GB",
            f"  arguments        {s.plan_bytes / gb:12.4f} GB   {s.compiler_argument_bytes / gb:12.4f} GB "
            f"(of {s.hbm_bytes / gb:.2f} GB HBM)",
            f"  outputs          {(s.plan_cache_bytes + s.plan_users_bytes) / gb:12.4f} GB   "
            f"{s.compiler_output_bytes / gb:12.4f} GB ({s.compiler_alias_bytes / gb:.4f} GB of it the cache, in place)",
            f"  VMEM             {s.plan_vmem_bytes / MIB:9.1f} MiB   {vmem} "
            f"(the limit it was given: {s.vmem_limit_bytes / MIB:.1f} MiB)",
            f"  Mosaic calls     {s.mosaic_calls:12d} per chip",
            f"  compile          {s.compile_s:12.1f} s",
        ]
    )
