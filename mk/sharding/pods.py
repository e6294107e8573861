"""The step past one host: what a slice of several hosts holds on each chip, in one record (:func:`pod_setup`): the
setup the timing model charges for it and the kernel runs.

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
  times (every group of D chips computes all heads; the copies' output projections hold zeros, so each head's
  partial sum counts once in the all-reduce: mk.sharding.repeated_copy).
  Not split further because a head is the smallest piece the kernel's attention computes;
- MLA's down-projections (q_a, kv_a), the shared expert, dense layers' MLPs, the vocabulary: split over all C chips
  (the down-projections in whole-lane blocks of rows, chips past the last block holding zeros; the rest in whole rows
  of 8 on the intermediate: no chip idles, and their bytes are the same at any split);
- the router, norms and scales: on every chip.

One host (or a slice with no documented shape) keeps the setup as given: today's model, any chip reaching any over
one link.
"""

from __future__ import annotations

from ..chips import Chip, slice_shape
from ..format_trees import FORMAT_SCHEMES
from ..kernel_setup import KernelSetup, Placement
from ..units import LANE, ceil_div
from .placement import heads_split


def host_chips(chip: Chip) -> int | None:
    """Chips a host of ``chip``'s slice drives (data/slices.csv), or None where its shape is not documented."""
    shape = slice_shape(chip)
    return None if shape is None else shape.chips_per_host


def past_one_host(chip: Chip) -> bool:
    """Whether ``chip`` is a documented slice of more than one host."""
    shape = slice_shape(chip)
    return shape is not None and shape.hosts > 1


def cuts_groups(cfg, setup: KernelSetup, dtype: str) -> bool:
    """Whether ``setup`` cuts each routed expert of ``cfg`` into even slices that split the groups of ``dtype``'s
    4-bit codes (int4, mxfp4: a scale per 32 inputs), which the kernel does not stream (mk.format_trees.format_cuts):
    gpt-oss-120b's 2,880-wide experts split over 8 chips leave 360 rows a chip."""
    fmt = FORMAT_SCHEMES.get(dtype)
    if fmt is None or not fmt.nibbles or cfg is None or not cfg.is_moe or not setup.sharded:
        return False
    over = {Placement.SPLIT: setup.chips, Placement.HOSTS: setup.host_chips}.get(setup.placement, 1)
    return over > 1 and ceil_div(cfg.expert_intermediate, over) % fmt.block[0] != 0


def expert_group(cfg, chips: int, host: int) -> int:
    """Chips each routed expert is split over under placement ``hosts``: a host's chips, fewer where the expert's
    intermediate would leave a chip less than a lane tile (128) of it, and always a divisor of the chips and of
    the experts' groups."""
    g = host
    while g > 1 and (cfg.expert_intermediate // g < LANE or chips % g or cfg.num_experts % (chips // g)):
        g //= 2
    return max(g, 1)


def pod_setup(setup: KernelSetup, chip: Chip, cfg=None, dtype: str = "bf16") -> KernelSetup:
    """``setup`` over ``chip``'s chips as the timing model charges it and the kernel runs it (``mk compile``,
    ``generate --multi-host``): past one host, with the slice's torus, heads
    that do not divide the chips repeated over groups of chips (``repeat_heads``; its name says so) and, for a model
    with routed experts whose setup splits them (``split``), placement ``hosts`` over groups of :func:`expert_group`
    chips; one host, or a slice without a documented shape, as given. On any slice, routed experts in a 4-bit format
    ``dtype`` whose even split would cut its groups (:func:`cuts_groups`) are cut in whole groups, each chip's slice
    rounded up to a multiple of the group and the experts zero-padded (gpt-oss-120b over 8 chips: 384 rows a chip, the
    last 192 of chip 7's zeros: 6.7% more expert bytes, where placing them whole would make one chip the straggler)."""
    setup = _on_slice(setup.on(chip.chips), chip, cfg)
    return setup.but(expert_rows=FORMAT_SCHEMES[dtype].block[0]) if cuts_groups(cfg, setup, dtype) else setup


def _on_slice(setup: KernelSetup, chip: Chip, cfg) -> KernelSetup:
    if not past_one_host(chip) or setup.torus:
        return setup
    changes = dict(torus=slice_shape(chip).torus)
    if cfg is None or not heads_split(cfg, chip.chips):
        changes.update(repeat_heads=True)
    if cfg is not None and cfg.is_moe and setup.placement == Placement.SPLIT:
        g = expert_group(cfg, chip.chips, host_chips(chip))
        if cfg.num_experts % (chip.chips // g) == 0:
            changes.update(placement=Placement.HOSTS, host_chips=g)
    return setup.but(**changes)
