"""The in-kernel all-reduce's topology, pure Python: which peer each chip sends to, and the bytes it moves (its
switches: mk.kernel_setup.Collective). The kernel's code for it is mk.megakernel.collective.

Two algorithms over C chips, both with direct remote DMAs (a TPU slice's ICI routes any chip to any):

- all to all (default): every chip sends its whole partial sum [rows, width] to every other chip, then
  each sums the C partials in chip order: one round, (C - 1) x payload sent per chip;
- reduce-scatter then all-gather: the payload's lanes are cut in C chunks; chip j sums chunk j of every
  chip's partial and sends the sum back to all: two rounds, 2 (C - 1) / C x payload sent per chip.

Every chip sums in the same (chip) order, so all chips hold bit-identical activations after it.

Both charge the slice as if any chip reached any other over one link: what the kernel does on one host (8 chips),
and what today's numbers for 8 chips hold. Past one host the timing model charges the torus instead
(:func:`torus_all_reduce`): a reduce-scatter along each torus dimension in turn, then the all-gathers back (the
kernel's own exchanges past one host, mk.megakernel.collective: a dimension's group of chips send directly to one
another, which the links carry as the ring's hops), each chip using its two links of that dimension (both directions
of the ring) where the dimension wraps around, one way along a line where it does not (data/slices.csv records which
do). A dimension of n chips costs ``ring_hops`` rounds each way, each paying the link latency, and its busiest link
carries that many shards in sequence (jax-ml scaling-book sharding.md: a bidirectional ring moves ``V / W_bidi`` in
``n / 2`` hops; without wraparound ``(n - 1) V / n`` at one link's one-way bandwidth). :func:`flat_ring_all_reduce`
is the same over one ring through all chips, what the torus is set against.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..kernel_setup import Collective
from ..units import LANE, ceil_div, round_up


def peers(chip: int, chips: int) -> list[int]:
    """The chips ``chip`` sends to, in order: the next one round the ring first (every chip's d-th send
    goes to a different chip, so no chip receives two at once)."""
    return [(chip + d) % chips for d in range(1, chips)]


def chunk_width(width: int, chips: int) -> int:
    """Lanes of one reduce-scatter chunk: ``width`` cut in ``chips`` equal whole-lane chunks (padded)."""
    return round_up(ceil_div(width, chips), LANE)


def sent_bytes(collective: Collective, rows: int, width: int, chips: int, itemsize: int | None = None) -> int:
    """Bytes one chip sends for one all-reduce of a [rows, width] partial sum."""
    if chips == 1:
        return 0
    itemsize = itemsize or collective.payload_itemsize()
    if collective.reduce_scatter:
        return 2 * (chips - 1) * rows * chunk_width(width, chips) * itemsize
    return (chips - 1) * rows * width * itemsize


@dataclass(frozen=True)
class Exchange:
    """One collective as one chip sees it: ``rounds`` of remote DMAs it waits for in turn (each a hop paying the
    link latency), the bytes it sends over all its links, and ``link_bytes``: the bytes its busiest link carries
    one way, in sequence, so that the time on the link is ``link_bytes / bandwidth`` (one way per link) plus
    ``rounds`` x the latency."""

    rounds: int
    sent_bytes: int
    link_bytes: int

    def seconds(self, bandwidth: float, latency_s: float) -> float:
        return self.link_bytes / bandwidth + self.rounds * latency_s


def ring_hops(n: int, wraparound: bool) -> int:
    """Hops of a ring reduce-scatter (or all-gather) over ``n`` chips: n // 2 with each chip's shard going both
    ways round a ring that wraps around, n - 1 along a line (the end chips' shards cross every link)."""
    if n <= 1:
        return 0
    return n // 2 if wraparound else n - 1


def one_link_all_reduce(collective: Collective, rows: int, width: int, chips: int, itemsize: int | None = None):
    """Today's all-reduce (all to all, or reduce-scatter + all-gather) as an :class:`Exchange`: every byte over
    one link, ``collective.rounds`` rounds."""
    sent = sent_bytes(collective, rows, width, chips, itemsize)
    return Exchange(collective.rounds if chips > 1 else 0, sent, sent)


def torus_all_reduce(rows: int, width: int, itemsize: int, torus) -> Exchange:
    """An all-reduce of a [rows, width] partial sum over a torus (``torus``: each dimension's (chips, wraps
    around), mk.chips.SliceShape.torus), one dimension at a time: reduce-scatter along the first (each chip keeps
    whole-lane chunks of width / n, :func:`chunk_width`), then along the next over those chunks, and so on; then
    all-gather back in reverse. A dimension of n chips sends (n - 1) shards a chip each way and waits
    :func:`ring_hops` rounds, its busiest link carrying that many shards."""
    rounds = sent = link = 0
    w = width
    for n, wraps in torus:
        if n <= 1:
            continue
        w = chunk_width(w, n)
        shard, hops = rows * w * itemsize, ring_hops(n, wraps)
        rounds, sent, link = rounds + 2 * hops, sent + 2 * (n - 1) * shard, link + 2 * hops * shard
    return Exchange(rounds, sent, link)


def flat_ring_all_reduce(rows: int, width: int, itemsize: int, chips: int, wraparound: bool = True) -> Exchange:
    """The same all-reduce over one ring through all ``chips`` (both directions where the ring closes): what
    :func:`torus_all_reduce` is set against."""
    return torus_all_reduce(rows, width, itemsize, ((chips, wraparound),))


def torus_best(block_bytes: int, torus) -> Exchange:
    """The greedy pick's best over a torus (mk.megakernel.collective): each chip's ``block_bytes`` (its best value
    and index) to every chip of its group along a dimension, which keeps the group's best, then along the next."""
    rounds = sent = link = 0
    for n, wraps in torus:
        if n <= 1:
            continue
        hops = ring_hops(n, wraps)
        rounds, sent, link = rounds + hops, sent + (n - 1) * block_bytes, link + hops * block_bytes
    return Exchange(rounds, sent, link)
