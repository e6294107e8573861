"""One chip's work as the timing model charges it: the plan it times, each weight tile's bytes under a data type,
each op's compute time at the chip's FLOP/s, the link's latency per round."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache

from ..chips import Chip, get_chip
from ..config import get_config
from ..dtypes import get_dtype
from ..format_trees import FORMAT_SCHEMES
from ..kernel_setup import SETUPS
from ..params import EXPERTS, HEAD, SCHEMES
from ..plan import Attend, HeadTile, Load, MatmulTile, Op, StepPlan, build_plan
from ..sharding.placement import allocated_positions
from ..sharding.pods import pod_setup
from .constants import chip_constant, matching_rows


def load_bytes(plan: StepPlan, dtype: str | None = None, attr: str = "nbytes") -> Callable[[Load], float]:
    """The bytes a weight tile of ``plan`` moves (``attr``: ``nbytes`` with the layout's padding, ``payload_bytes``
    without): the plan's own, or under the policy ``dtype`` (mk.dtypes: per-tensor FP8, which no kernel streams) the
    plan's bytes scaled by the component's bytes per element over the plan's."""
    if dtype is None or kernel_streams(dtype):  # the plan streams the codes and their scales itself
        return lambda ld: getattr(ld, attr)
    pol, own = get_dtype(dtype), plan.weight_itemsize
    per = {EXPERTS: pol.expert / own, HEAD: pol.head / own}
    return lambda ld: getattr(ld, attr) * per.get(ld.component, pol.matrix / own)


def kernel_streams(dtype: str) -> bool:
    """Whether the kernel's plan streams ``dtype``'s weights as they are: BF16, F32, the INT8 schemes and the formats
    big models ship in (fp8-block, int4, mxfp4: their codes and block scales, each tile planned in its own bytes).
    Per-tensor FP8 is modelled by its bytes only (:func:`load_bytes`), and so has no schedule."""
    get_dtype(dtype)
    return dtype in ("bf16", "f32") or plan_quantize(dtype) != "none"


def plan_quantize(dtype: str) -> str:
    """The scheme the plan for ``dtype`` streams: an mk.quant INT8 scheme, or a shipped format (mk.format_trees);
    ``none`` for BF16, F32 and per-tensor FP8."""
    return dtype if dtype in SCHEMES or dtype in FORMAT_SCHEMES else "none"


def compute_seconds(plan: StepPlan, chip: Chip) -> Callable[[Op], float]:
    """An op's compute time on one chip of ``chip``: FLOPs at its bf16 rate, a matrix op's rows padded to
    what the matrix unit takes at once (``matmul_rows``: the users for a weight tile, the query heads
    sharing a KV head for attention). Vector work (norms, softmax, GeLU) is counted at the same rate,
    unpadded: at decode it is a few thousand FLOPs an op."""
    rows = chip_constant("matmul_rows", chip).value
    peak = chip.bf16_flops / chip.chips

    def seconds(op: Op) -> float:
        if isinstance(op, (MatmulTile, HeadTile)):
            m = plan.batch
        elif isinstance(op, Attend):
            m = op.query_rows
        else:
            return op.flops / peak
        return op.flops * max(m, rows) / m / peak

    return seconds


def link_latency(chip: Chip) -> float:
    """Seconds per round of a cross-chip op on ``chip`` (0 on one chip); refuses a slice whose link is
    not in the data: a chip with no interconnect bandwidth (a PCIe-only GPU), or one whose link has no cited
    latency (for GPUs, data/timing.csv names the NVLink chips; AMD's Infinity Fabric has none)."""
    if chip.chips == 1:
        return 0.0
    if math.isnan(chip.ici_bandwidth):
        raise ValueError(
            f"{chip.name}: data/chips.csv has no interconnect bandwidth for {chip.base} (ici_bandwidth_Bps); add it "
            "(with its source) to model a slice of it"
        )
    if not matching_rows("ici_hop_latency_s", chip.kind, chip.base):
        raise ValueError(
            f"{chip.name}: data/timing.csv has no link latency for {chip.base} (an ici_hop_latency_s row for "
            f"{chip.kind} chips or naming {chip.base}; for GPUs: NVLink's or Infinity Fabric's), so a slice of it is "
            f"not modelled; add one with its source, or model one {chip.base}"
        )
    return chip_constant("ici_hop_latency_s", chip).value


# the sweeps and the pacing chip's variants time the same plan many ways: a notebook's sweeps ask for up to ~200
# plans (a full-size plan holds ~6 MB), asking again for some of them after 32 others
@lru_cache(maxsize=128)
def step_plan(cfg, chip, context, batch, dtype, setup, knockout=frozenset()) -> StepPlan:
    """The plan the model times for ``setup`` (mk.kernel_setup.KernelSetup) over ``chip``'s chips: chip 0's, in the
    plan's data type for ``dtype`` (mk.plan.build_plan); past one host, the setup mk.sharding.pods.pod_setup gives
    (the slice's torus; whole experts over hosts, split within each; a 4-bit format's split experts cut in whole
    groups)."""
    arrays = get_dtype(dtype).arrays
    setup = pod_setup(setup, chip, cfg, dtype=dtype)
    return build_plan(
        cfg,
        batch,
        allocated_positions(cfg, context, setup),
        context,
        weight_dtype=arrays,
        kv_dtype=arrays,
        knockout=knockout,
        setup=setup,
        quantize=plan_quantize(dtype),
    )


def check_speculation(speculate: int, acceptance: float | None) -> float:
    """The mean tokens a round emits per user: ``acceptance``, which with ``speculate`` = K drafted tokens (the
    setup's ``draft_tokens``) must be in 1 (no draft accepted: the target's own token) .. K + 1 (every draft
    accepted), and is 1 without drafts."""
    if not speculate:
        if acceptance not in (None, 1, 1.0):
            raise ValueError(
                f"acceptance={acceptance} without drafts: give a setup that verifies K drafted tokens a round "
                "(KernelSetup.draft_tokens, --speculate K)"
            )
        return 1.0
    if acceptance is None:
        raise ValueError(
            f"speculate={speculate} needs an acceptance: the mean tokens a round emits per user, 1 (no draft "
            f"accepted) to {speculate + 1} (all accepted)"
        )
    if not 1 <= acceptance <= speculate + 1:
        raise ValueError(
            f"acceptance={acceptance} with {speculate} drafted tokens: a round emits 1 (no draft accepted) to "
            f"{speculate + 1} (all accepted) tokens per user"
        )
    return float(acceptance)


def named_plan(model, chip, context: int, batch: int, setup, dtype: str = "bf16", knockout=()) -> StepPlan:
    """:func:`step_plan` from names: ``model`` a name mk.config resolves or a config, ``chip`` a name or a Chip,
    ``setup`` a KernelSetup or its command-line name (mk.kernel_setup.SETUPS)."""
    setup = SETUPS[setup] if isinstance(setup, str) else setup
    cfg = get_config(model)
    chip = get_chip(chip)
    return step_plan(cfg, chip, context, batch, dtype, setup, frozenset(knockout))
