"""The straggler expert: the busiest chip of an MoE layer whose experts are placed whole over chips.

E experts over C chips, whole: chip c holds experts c*E/C .. (c+1)*E/C - 1. B users each route to k
distinct experts; a chip loads each distinct expert routed to it once per layer, and the busiest chip
sets the layer's time. Split placement (every expert's intermediate cut over all C chips) has no
straggler: each chip loads 1/C of every distinct routed expert.

Under uniform routing the distribution of the busiest chip is exact here: the union of the users' picks
has the size distribution of ``mk.routing.distinct_experts_distribution`` and, given its size n, is a
uniformly random n-set of experts, so the chips' shares of it are multivariate hypergeometric. Skewed
routing is sampled (:func:`sample_busiest`), and the model's own router is measured on token streams
(:func:`measured_busiest`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..chips import get_chip, slice_of
from ..config import ModelConfig, get_config
from ..generate import generate
from ..kernel_setup import FIXES, WRITE_UP_KERNEL, Placement
from ..progress import tqdm
from ..reference import routed_experts
from ..routing import busiest_chip_distribution, check_placement, distinct_experts_distribution
from ..timing import MODELLED, pace, predict, step_plan
from ..units import ms_entry, positive_int
from .allreduce import fix_steps
from .sweeps import placement_table

EXACT = "modelled (exact under uniform routing: mk.analysis.straggler)"
SAMPLED = "modelled (sampled routing: mk.analysis.straggler)"
MEASURED = "measured (the model's router on generated token streams)"
SAMPLE_CHUNK = 4096  # rounds drawn at once: bounds the [rounds, users, experts] noise array


@dataclass(frozen=True)
class Straggler:
    """The busiest chip's distinct experts per layer (``distribution``: count -> probability) and the mean
    per chip (distinct experts / C, what every chip loads under split placement), in experts per layer.
    ``samples`` is None when exact, else the number of (layer, step) draws behind the numbers."""

    experts: int
    chips: int
    top_k: int
    batch: int
    distribution: dict[int, float]
    expected_max: float
    mean: float
    routing: str
    kind: str
    samples: int | None = None

    @property
    def std(self) -> float:
        """Standard deviation of the busiest chip's count."""
        return math.sqrt(sum(p * (m - self.expected_max) ** 2 for m, p in self.distribution.items()))

    @property
    def standard_error(self) -> float:
        """Of ``expected_max``, for independent draws (0 when exact)."""
        return 0.0 if self.samples is None else self.std / math.sqrt(self.samples)

    def to_dict(self) -> dict:
        return {
            "experts": self.experts,
            "chips": self.chips,
            "top_k": self.top_k,
            "batch": self.batch,
            "expected_max": self.expected_max,
            "mean": self.mean,
            "distribution": {str(m): p for m, p in self.distribution.items()},
            "routing": self.routing,
            "samples": self.samples,
            "kind": self.kind,
        }


def busiest_chip(experts: int, chips: int, top_k: int, batch: int = 1) -> Straggler:
    """:func:`busiest_chip_distribution` with its expectation and the mean per chip."""
    dist = busiest_chip_distribution(experts, chips, top_k, batch)
    distinct = distinct_experts_distribution(experts, top_k, batch)
    return Straggler(
        experts,
        chips,
        top_k,
        batch,
        dist,
        expected_max=sum(m * p for m, p in dist.items()),
        mean=sum(n * p for n, p in distinct.items()) / chips,
        routing="uniform",
        kind=EXACT,
    )


# Sampled and measured routing --------------------------------------------------------------------
def busiest_counts(ids: np.ndarray, experts: int, chips: int) -> tuple[np.ndarray, np.ndarray]:
    """For routes ``ids [draws, users, k]`` (expert ids): each draw's busiest chip count and its distinct
    experts, both ``[draws]``."""
    draws = ids.shape[0]
    touched = np.zeros((draws, experts), bool)
    touched[np.arange(draws)[:, None], ids.reshape(draws, -1)] = True
    per_chip = touched.reshape(draws, chips, experts // chips).sum(axis=-1)
    return per_chip.max(axis=-1), touched.sum(axis=-1)


def _straggler(maxima, distinct, experts, chips, top_k, batch, routing, kind) -> Straggler:
    values, counts = np.unique(maxima, return_counts=True)
    return Straggler(
        experts,
        chips,
        top_k,
        batch,
        {int(v): int(c) / len(maxima) for v, c in zip(values, counts)},
        expected_max=float(np.mean(maxima)),
        mean=float(np.mean(distinct)) / chips,
        routing=routing,
        kind=kind,
        samples=len(maxima),
    )


def zipf_weights(experts: int, exponent: float, seed: int = 0, spread_over: int | None = None) -> np.ndarray:
    """Skewed routing: the expert of popularity rank r (from 1) is picked with weight r^-exponent (0:
    uniform). The ranks go to experts in a random order by ``seed``, or, with ``spread_over=C``,
    round-robin over C chips (the hottest expert on chip 0, the next on chip 1, ...), as a placement
    that knows the popularity would put them. Returns probabilities summing to 1, indexed by expert."""
    positive_int("experts", experts)
    if exponent < 0:
        raise ValueError(f"exponent must be >= 0, got {exponent}")
    by_rank = np.arange(1, experts + 1, dtype=float) ** -float(exponent)
    if spread_over is None:
        order = np.random.default_rng(seed).permutation(experts)
    else:
        check_placement(experts, spread_over, 1)
        rank = np.arange(experts)
        order = rank % spread_over * (experts // spread_over) + rank // spread_over
    w = np.empty(experts)
    w[order] = by_rank
    return w / w.sum()


def sample_busiest(
    experts: int,
    chips: int,
    top_k: int,
    batch: int,
    rounds: int,
    seed: int,
    weights=None,
    routing: str | None = None,
) -> Straggler:
    """Monte Carlo of the busiest chip over ``rounds`` layers: each user draws k distinct experts, with
    probability proportional to ``weights`` (length E; default uniform) one after another without
    replacement. Drawn as the top k of log(weight) plus Gumbel noise, which has that distribution."""
    check_placement(experts, chips, top_k, batch)
    positive_int("rounds", rounds)
    if weights is None:
        log_w = np.zeros(experts)
    else:
        w = np.asarray(weights, float)
        if w.shape != (experts,) or np.any(w < 0) or np.count_nonzero(w) < top_k:
            raise ValueError(f"weights must be {experts} non-negative numbers, at least top_k={top_k} of them > 0")
        with np.errstate(divide="ignore"):
            log_w = np.log(w)
    rng = np.random.default_rng(seed)
    maxima, distinct = [], []
    for start in range(0, rounds, SAMPLE_CHUNK):
        n = min(SAMPLE_CHUNK, rounds - start)
        keys = log_w + rng.gumbel(size=(n, batch, experts))
        ids = np.argpartition(-keys, top_k - 1, axis=-1)[..., :top_k]
        m, d = busiest_counts(ids, experts, chips)
        maxima.append(m)
        distinct.append(d)
    label = routing or ("uniform" if weights is None else "weighted")
    return _straggler(np.concatenate(maxima), np.concatenate(distinct), experts, chips, top_k, batch, label, SAMPLED)


def measured_busiest(
    params: dict,
    cfg: ModelConfig,
    chips: int,
    batch: int = 1,
    streams: int = 16,
    prompt_len: int = 8,
    new_tokens: int = 24,
    seed: int = 0,
) -> Straggler:
    """The busiest chip under the model's own router: ``streams * batch`` users with random prompts of
    ``prompt_len`` tokens (by ``seed``) run ``new_tokens`` greedy decode steps each (mk.generate, the
    reference engine); the routes each step took (at the position of the token it read, in every layer:
    mk.reference.routed_experts) are grouped ``batch`` users at a time. One draw per (layer, step, group):
    the draws of one stream are not independent."""
    check_placement(cfg.num_experts, chips, cfg.top_k, batch)
    for name, value in (("streams", streams), ("prompt_len", prompt_len), ("new_tokens", new_tokens)):
        positive_int(name, value)
    users = streams * batch
    prompts = np.random.default_rng(seed).integers(0, cfg.vocab_size, (users, prompt_len), dtype=np.int32)
    # The first new token comes from the prefill; each decode step reads one new token and picks the next.
    read = generate(params, cfg, prompts, new_tokens + 1)[:, :-1]
    ids = routed_experts(params, cfg, np.concatenate([prompts, read], axis=1))[:, :, prompt_len:]  # [L, users, S, k]
    layers, _, steps, k = ids.shape
    ids = ids.reshape(layers, streams, batch, steps, k).transpose(0, 1, 3, 2, 4).reshape(-1, batch, k)
    maxima, distinct = busiest_counts(ids, cfg.num_experts, chips)
    routing = f"{cfg.name} router"
    return _straggler(maxima, distinct, cfg.num_experts, chips, cfg.top_k, batch, routing, MEASURED)


def summary_table(results) -> pd.DataFrame:
    """One row per result: its inputs, expected busiest chip (with its standard error) and mean per chip."""
    return pd.DataFrame(
        [
            {k: v for k, v in s.to_dict().items() if k != "distribution"} | {"standard_error": s.standard_error}
            for s in results
        ]
    )


def distribution_table(results) -> pd.DataFrame:
    """One row per (result, busiest chip count) with its probability."""
    return pd.DataFrame(
        [
            dict(
                routing=s.routing,
                experts=s.experts,
                chips=s.chips,
                top_k=s.top_k,
                batch=s.batch,
                busiest=m,
                probability=p,
                kind=s.kind,
            )
            for s in results
            for m, p in s.distribution.items()
        ]
    )


# Reading a published number against the model ----------------------------------------------------
def skew_sweep(
    experts: int,
    chips: int,
    top_k: int,
    batch: int,
    exponents,
    rounds: int,
    placements: int = 8,
    seed: int = 0,
) -> pd.DataFrame:
    """Sampled expected busiest chip against the Zipf exponent of :func:`zipf_weights`, for the hottest
    experts spread round-robin over the chips and for ``placements`` random placements (one row each)."""
    rows = []
    for s in exponents:
        cases = [("spread", None, zipf_weights(experts, s, spread_over=chips))]
        cases += [("random", p, zipf_weights(experts, s, seed=seed + p)) for p in range(placements)]
        for n, (placement, placement_seed, w) in enumerate(cases):
            r = sample_busiest(experts, chips, top_k, batch, rounds, seed + 1000 * n, w, f"zipf {s:g}, {placement}")
            rows.append(
                dict(
                    exponent=s,
                    placement=placement,
                    placement_seed=placement_seed,
                    expected_max=r.expected_max,
                    standard_error=r.standard_error,
                    mean=r.mean,
                    kind=SAMPLED,
                )
            )
    return pd.DataFrame(rows)


def crossing(x, y, target: float) -> float | None:
    """The first x at which the piecewise-linear curve through (x, y) reaches ``target``; None if it never does."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    for i in range(len(x)):
        if y[i] == target:
            return float(x[i])
        if i + 1 < len(x) and (y[i] - target) * (y[i + 1] - target) < 0:
            return float(x[i] + (target - y[i]) * (x[i + 1] - x[i]) / (y[i + 1] - y[i]))
    return None


def draws_to_distinguish(s: Straggler, value: float, z: float = 2.0) -> float:
    """Independent layer draws whose average of the busiest chip tells ``s.expected_max`` from ``value``
    at ``z`` standard errors (at fewer, ``value`` is within the noise of ``s``; infinite when they are equal)."""
    gap = abs(s.expected_max - value)
    return math.inf if gap == 0 else math.ceil((z * s.std / gap) ** 2)


def straggler_cost(model, chip, context: int = 1024, batch: int = 1, dtype: str = "bf16", **kw) -> dict:
    """What the straggler of a whole-expert placement costs on the slice ``chip``: the modelled step paced
    by the busiest chip (its exact distribution of experts per layer) against the same plan paced by an
    average chip (one chip's own share of the distinct experts), and the step with split experts; seconds,
    with the experts per layer behind each and the share of padding in the weight bytes each placement moves
    (``ffn_layout``: "lanes" pads a chip's slice of an intermediate to whole 128-lane tiles). ``kw``: ``setup``
    (default the write-up's kernel, whose story the straggler is; its placement is set each way) and the assumed
    costs (mk.timing.predict). ``whole_op_costs`` (the whole and the average chip's steps: one plan) and
    ``split_op_costs`` say where each step's per-op costs came from (mk.timing.predict's ``op_costs``: the compiler's
    schedule where data/schedule keeps the plan's, else assumed)."""
    cfg, chip = get_config(model), get_chip(chip)
    if not cfg.is_moe:
        raise ValueError(f"{cfg.name} is a dense model: it has no experts to place")
    if chip.chips == 1:
        raise ValueError(f"{chip.name} is one chip: name a slice (e.g. {chip.name}-8) to place experts over")
    setup = kw.pop("setup", WRITE_UP_KERNEL)
    whole_setup, split_setup = setup.but(placement=Placement.WHOLE), setup.but(placement=Placement.SPLIT)
    # the whole and the split step as mk.timing.predict gives them (their pacing: the chip that sets the pace)
    whole = predict(cfg, chip, context, batch, "megakernel", dtype, setup=whole_setup, **kw)
    split_p = predict(cfg, chip, context, batch, "megakernel", dtype, setup=split_setup, **kw)
    busiest, split = whole.pacing, split_p.pacing
    plan = step_plan(cfg, chip, context, batch, dtype, whole_setup, frozenset())  # predict's plan (cached)
    average = pace(plan, chip, dtype, distribution=plan.distinct_experts, **kw)
    return dict(
        model=cfg.name,
        chip=chip.name,
        chips=chip.chips,
        context=context,
        batch=batch,
        dtype=dtype,
        busiest_experts=busiest.experts_per_layer,
        average_experts=average.experts_per_layer,
        whole_step_s=busiest.step_s,
        average_chip_step_s=average.step_s,
        straggler_s=busiest.step_s - average.step_s,
        split_step_s=split.step_s,
        split_saves_s=busiest.step_s - split.step_s,
        # the weight bytes the DMAs move beyond those that hold weights (the layout's padding), each placement
        whole_padding=busiest.weight_bytes / busiest.weight_payload_bytes - 1,
        split_padding=split.weight_bytes / split.weight_payload_bytes - 1,
        ffn_layout=setup.ffn_layout,
        setup=setup.name,
        whole_op_costs=whole.op_costs,
        split_op_costs=split_p.op_costs,
        kind=MODELLED,
    )


def straggler_table(model, chip: str, chip_counts, batches, context: int = 1024, dtype: str = "bf16", **kw):
    """:func:`straggler_cost` over slices of ``chip`` (a base chip: ``tpu-v5e``) of each of ``chip_counts`` chips
    and each batch, one row each, times in ms, with where each row's steps took their per-op costs from
    (``whole_op_costs``: the whole and the average chip's; ``split_op_costs``)."""
    base = get_chip(chip).base
    cases = [(c, b) for c in chip_counts for b in batches]
    rows = []
    for c, b in tqdm(cases, desc="straggler", leave=False, disable=not kw.pop("progress", False)):
        r = straggler_cost(model, slice_of(base, c), context, b, dtype, **kw)
        rows.append(dict(ms_entry(k, v) for k, v in r.items() if k != "kind"))
    return pd.DataFrame(rows).assign(kind=MODELLED)


def whole_against_split(model, chip="tpu-v5e-8", context: int = 1024, batch: int = 1):
    """Whole against split experts at one configuration, as each notebook compares them, one row each with both
    setups by name and the step each gives (ms): :func:`straggler_cost` (notebook 04: the write-up's kernel, (d),
    its placement set each way), ``mk.analysis.sweeps.placement_table`` (notebook 06: the same two setups; the two
    rows agree by construction) and ``mk.analysis.allreduce.fix_steps`` for the first fix (notebook 05: (a) before
    the fixes against (b) = (a) + split experts, the all-reduce not overlapped and its payload f32), so a reader sees
    why the last differs, and where each step's per-op costs came from (``whole_op_costs``, ``split_op_costs``:
    mk.timing.predict's). Weights in bf16, as in the placement table and the fixes."""
    cfg, slice_ = get_config(model), get_chip(chip)
    cost = straggler_cost(cfg, slice_, context, batch, "bf16")
    placed = placement_table(cfg, [batch], context, slice_.name).set_index("role")
    a, b = FIXES[0], FIXES[1]
    fixes = fix_steps(cfg, slice_, context, batch, (a, b)).set_index("fix")

    def switches(setup) -> dict:
        c = setup.collective
        return dict(overlap=c.overlap, payload="bf16" if c.bf16_payload else "f32", ffn_layout=setup.ffn_layout)

    write_up = WRITE_UP_KERNEL.but(placement=Placement.WHOLE)
    rows = [
        dict(notebook="04", computed_by="mk.analysis.straggler.straggler_cost", whole_setup=write_up.name,
             split_setup=cost["setup"], **switches(WRITE_UP_KERNEL), whole_ms=cost["whole_step_s"] * 1e3,
             split_ms=cost["split_step_s"] * 1e3, whole_op_costs=cost["whole_op_costs"],
             split_op_costs=cost["split_op_costs"]),
        dict(notebook="06", computed_by="mk.analysis.sweeps.placement_table", whole_setup=placed.setup["whole"],
             split_setup=placed.setup["megakernel"], **switches(WRITE_UP_KERNEL),
             whole_ms=placed.step_ms["whole"], split_ms=placed.step_ms["megakernel"],
             whole_op_costs=placed.op_costs["whole"], split_op_costs=placed.op_costs["megakernel"]),
        dict(notebook="05", computed_by="mk.analysis.allreduce.fix_steps", whole_setup=a.name, split_setup=b.name,
             **switches(a), whole_ms=fixes.step_ms[a.name], split_ms=fixes.step_ms[b.name],
             whole_op_costs=fixes.op_costs[a.name], split_op_costs=fixes.op_costs[b.name]),
    ]  # fmt: skip
    t = pd.DataFrame(rows)
    return t.assign(
        split_saves_ms=t.whole_ms - t.split_ms,
        whole_over_split=t.whole_ms / t.split_ms,
        model=cfg.name,
        chip=slice_.name,
        context=context,
        batch=batch,
        kind=MODELLED,
    )
