"""The step past one host: what a slice of several hosts holds on each chip, and the setup the timing model charges
for it (:func:`pod_setup`) and the kernel runs (:func:`run_setup`: the same, but for heads repeated over groups of
chips, which it replicates).

:func:`pod_setup` takes a setup over a slice whose documented shape (data/slices.csv) spans more than one host and
gives it the slice's torus (its all-reduce then goes dimension by dimension: mk.sharding.links.torus_all_reduce) and,
where it splits the routed experts, the placement a deployment over hosts would use, ``hosts``:

- routed experts: the C chips form G = C / h groups of a host's h chips (8 on v5e); each group holds E / G whole
  experts, each split over its h chips (Kimi K2's 2048-wide intermediate: 256 rows a chip on a v5e host, where
  splitting it over all 256 chips leaves 8). A step waits for the busiest group: its distinct routed experts (exact
  under uniform routing, mk.routing.busiest_chip_distribution over G groups, at any batch) each cost its chips 1 / h
  of an expert. Split over a host rather than all chips because a slice of an expert narrower than a lane tile pads
  to one (or streams tiny DMAs), and spread whole over hosts because a token's k experts then fall on k hosts or
  fewer, each reading whole-lane slices;
- attention: heads split over all C chips where they divide them (as on one host); where they do not (Kimi K2's 64
  heads on 256 chips), over the most chips D dividing C that take whole heads, each head's chips repeated C / D
  times (every group of D chips computes all heads; the copies' partial sums are counted once in the all-reduce).
  Not split further because a head is the smallest piece the kernel's attention computes. MLA's down-projections
  (q_a, kv_a) stay on every chip, as on one host;
- the shared expert, dense layers' MLPs, the vocabulary: split over all C chips (whole rows of 8 on the
  intermediate; no chip idles, and their bytes are the same at any split);
- the router, norms and scales: on every chip.

One host (or a slice with no documented shape) keeps the setup as given: today's model, any chip reaching any over
one link.
"""

from __future__ import annotations

from ..chips import Chip, slice_shape
from ..kernel_setup import KernelSetup, Placement
from ..units import LANE
from .placement import heads_split


def host_chips(chip: Chip) -> int | None:
    """Chips a host of ``chip``'s slice drives (data/slices.csv), or None where its shape is not documented."""
    shape = slice_shape(chip)
    return None if shape is None else shape.chips_per_host


def past_one_host(chip: Chip) -> bool:
    """Whether ``chip`` is a documented slice of more than one host."""
    shape = slice_shape(chip)
    return shape is not None and shape.hosts > 1


def run_setup(setup: KernelSetup, chip: Chip, cfg=None) -> KernelSetup:
    """``setup`` as the kernel runs it over all of ``chip``'s chips (``mk compile``, ``generate --multi-host``): what
    :func:`pod_setup` charges (past one host: the all-reduce and greedy pick round the slice's torus, a split MoE's
    experts whole over hosts and split within each), but heads that do not divide the chips replicated, as on one
    host (their repeats over groups of chips are timed, not run)."""
    return pod_setup(setup, chip, cfg, repeat_heads=False)


def expert_group(cfg, chips: int, host: int) -> int:
    """Chips each routed expert is split over under placement ``hosts``: a host's chips, fewer where the expert's
    intermediate would leave a chip less than a lane tile (128) of it, and always a divisor of the chips and of
    the experts' groups."""
    g = host
    while g > 1 and (cfg.expert_intermediate // g < LANE or chips % g or cfg.num_experts % (chips // g)):
        g //= 2
    return max(g, 1)


def pod_setup(setup: KernelSetup, chip: Chip, cfg=None, repeat_heads: bool = True) -> KernelSetup:
    """``setup`` over ``chip``'s chips as the timing model charges it: past one host, with the slice's torus, heads
    that do not divide the chips repeated over groups of chips (``repeat_heads``; its name says so) and, for a model
    with routed experts whose setup splits them (``split``), placement ``hosts`` over groups of :func:`expert_group`
    chips; one host, or a slice without a documented shape, as given."""
    setup = setup.on(chip.chips)
    if not past_one_host(chip) or setup.torus:
        return setup
    changes = dict(torus=slice_shape(chip).torus)
    if repeat_heads and (cfg is None or not heads_split(cfg, chip.chips)):
        changes.update(repeat_heads=True)
    if cfg is not None and cfg.is_moe and setup.placement == Placement.SPLIT:
        g = expert_group(cfg, chip.chips, host_chips(chip))
        if cfg.num_experts % (chip.chips // g) == 0:
            changes.update(placement=Placement.HOSTS, host_chips=g)
    return setup.but(**changes)
