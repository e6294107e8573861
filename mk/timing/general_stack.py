"""The general stack's decode step: the same work as the megakernel's plan split into many kernels (one per weight
matrix, a grouped GEMM per kind of routed-expert op, one per vector op), each reading its bytes or doing its matrix
work, whichever is longer, with nothing in flight across kernels, plus a fixed cost per kernel: fitted at run time,
once for GPUs and once for TPUs, to the published number data/timing.csv names (not a test of the model)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ..chips import Chip, get_chip
from ..config import get_config
from ..kernel_setup import ONE_CHIP, Collective, KernelSetup
from ..plan import HeadTile, MatmulTile, Op, StepPlan
from ..published import published, published_table
from ..sol import speed_of_light
from .bandwidth import read_rate
from .constants import constant
from .work import compute_seconds, link_latency, load_bytes, step_plan


@dataclass(frozen=True)
class GeneralKernel:
    """One kernel of the general stack: the plan's ops it runs, what it reads, its matrix time, its link time."""

    name: str
    layer: int
    component: str
    ops: int
    nbytes: float
    compute_s: float
    ici_s: float

    def seconds(self, bandwidth: float) -> float:
        return max(self.nbytes / bandwidth, self.compute_s) + self.ici_s


def _kernel_key(op: Op, plan: StepPlan) -> tuple:
    """Which kernel of a general stack runs ``op``: one per weight matrix (its tiles together), one per
    kind of routed-expert op in a layer (a grouped GEMM over the routed experts, however many), the head's
    tiles together, and each other kind of op once per layer and role (a norm per weight vector, the
    GeGLU of all of an MLP's chunks, each all-reduce)."""
    loads = plan.loads
    if isinstance(op, HeadTile):
        return ("head",)
    if op.expert is not None:
        what = loads[op.load].tensor if isinstance(op, MatmulTile) else op.kind
        return ("experts", op.layer, what)
    if isinstance(op, MatmulTile):
        return ("matmul", op.layer, loads[op.load].tensor)
    return ("op", op.layer, op.kind, op.component, getattr(op, "vector", ""), getattr(op, "seq", 0))


def plan_kernels(plan: StepPlan, chip: Chip, dtype: str) -> list[GeneralKernel]:
    """The general stack's kernels for one chip's plan, in order, with their expected bytes (routed experts
    weighted by the probability that they are fetched; weights and cache as stored, without the kernel's layout
    padding)."""
    loads = plan.loads
    nbytes = load_bytes(plan, dtype, "payload_bytes")
    compute = compute_seconds(plan, chip)
    latency = link_latency(chip)
    groups: dict[tuple, list[Op]] = {}
    for op in plan.ops:
        groups.setdefault(_kernel_key(op, plan), []).append(op)
    out = []
    for key, ops in groups.items():
        first = ops[0]
        weights = sum(
            nbytes(loads[op.load]) * plan.fetch_probability(loads[op.load]) for op in ops if op.load is not None
        )
        # the cache as XLA stores it (a head dim under 128 lanes unpadded), as the weights are
        streamed = sum(plan.kv_payload(op) if op.kind == "Attend" else op.kv_bytes + op.serial_bytes for op in ops)
        ici = sum(op.sent_bytes / chip.ici_bandwidth + op.rounds * latency for op in ops if op.sent_bytes)
        name = key[2] if key[0] in ("matmul", "experts") else first.kind
        out.append(
            GeneralKernel(
                str(name),
                first.layer,
                first.component,
                len(ops),
                weights + streamed,
                sum(compute(op) for op in ops),
                ici,
            )
        )
    return out


REFERENCE_KERNELS = dict(model="gemma4-26b-a4b", context=1024, batch=1, dtype="bf16")  # what the count scales from


@lru_cache(maxsize=None)
def _reference_kernel_count() -> int:
    cfg, r = get_config(REFERENCE_KERNELS["model"]), REFERENCE_KERNELS
    plan = step_plan(cfg, get_chip("h100"), r["context"], r["batch"], r["dtype"], ONE_CHIP)
    return len(plan_kernels(plan, get_chip("h100"), r["dtype"]))


def kernels_per_plan_kernel() -> float:
    """The general stack's kernels for each kernel of the plan's split: the published count for vLLM on
    gemma4-26b-a4b over the plan's count for the same step (data/timing.csv ``general_kernels``)."""
    return published(constant("general_kernels", "all").fit_to) / _reference_kernel_count()


# Fitting the general stack's per-kernel cost --------------------------------------------------------
def _published_step(key: str) -> tuple[float, dict]:
    """The step time a published row implies (its own, or from a fraction of the speed of light or tokens/s),
    and the configuration it timed."""
    row = published_table().set_index("key").loc[key]
    cfg = dict(
        model=row["model"], chip=row["chip"], context=int(row["context"]), batch=int(row["batch"]), dtype=row["dtype"]
    )
    value = float(row["value"])
    if row["quantity"] == "step_time":
        return value, cfg
    if row["quantity"] == "fraction_of_sol":
        sol = speed_of_light(get_config(cfg["model"]), cfg["chip"], cfg["context"], cfg["batch"], cfg["dtype"])
        return sol.step_s / value, cfg
    if row["quantity"] == "tokens_per_s":
        return 1.0 / value, cfg
    raise ValueError(f"published {key!r} is a {row['quantity']}, not a step time a kernel cost can be fitted to")


@lru_cache(maxsize=None)
def kernel_cost(kind: str) -> float:
    """The general stack's fixed cost per kernel on ``kind`` (tpu or gpu) chips, fitted at run time to the
    published number data/timing.csv names (not a test of the model): (published step - the model's kernel
    work for that step) / the general stack's kernels."""
    c = constant("kernel_s", kind)
    target, at = _published_step(c.fit_to)
    chip = get_chip(at["chip"])
    work = general_step(get_config(at["model"]), chip, at["context"], at["batch"], at["dtype"])
    alone = sum(work.seconds(chip, 0.0).values())
    cost = (target - alone) / work.kernels_per_step
    if cost < 0:
        raise ValueError(
            f"fitting the per-kernel cost to {c.fit_to}: the model's kernel work alone ({alone * 1e3:.3f} ms) "
            f"exceeds the published step ({target * 1e3:.3f} ms)"
        )
    return cost


GENERAL_STACK = KernelSetup(name="general stack: tensor-parallel kernels", collective=Collective(overlap=False))


@dataclass(frozen=True)
class GeneralStep:
    """A general stack's decode step on one chip of a slice: the plan's work as kernels (:func:`plan_kernels`),
    counted ``scale`` times over (:func:`kernels_per_plan_kernel`)."""

    kernels: tuple[GeneralKernel, ...]
    scale: float

    @property
    def kernels_per_step(self) -> float:
        return self.scale * len(self.kernels)

    def seconds(self, chip: Chip, kernel_s: float, bandwidth: float | None = None) -> dict[str, float]:
        """Seconds by component: each kernel's bytes (at ``bandwidth``, default mk.timing.bandwidth.read_rate's) or
        matrix work, whichever is longer, plus ``kernel_s`` for each of the general stack's kernels it stands for."""
        out: dict[str, float] = {}
        bw = read_rate(chip).per_chip if bandwidth is None else bandwidth
        for k in self.kernels:
            out[k.component] = out.get(k.component, 0.0) + k.seconds(bw) + self.scale * kernel_s
        return out


def general_step(cfg, chip: Chip, context: int, batch: int, dtype: str, knockout=frozenset()) -> GeneralStep:
    """The general stack's step: the plan's work split tensor-parallel over the slice's chips, nothing in flight
    across kernels."""
    return general_step_of(step_plan(cfg, chip, context, batch, dtype, GENERAL_STACK, frozenset(knockout)), chip, dtype)


def general_step_of(plan: StepPlan, chip: Chip, dtype: str) -> GeneralStep:
    """The general stack's step for ``plan`` (its setup :data:`GENERAL_STACK`'s) on ``chip``."""
    return GeneralStep(tuple(plan_kernels(plan, chip, dtype)), kernels_per_plan_kernel())
