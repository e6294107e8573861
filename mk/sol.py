"""Bytes read per decoded token, by component, and the speed of light they imply on a chip.

Speed of light = memory bandwidth / bytes read per step. One step decodes one token for each of
B users: the weights are read once for all of them (the experts that at least one user routes
to), the KV cache once per user.

The data types' bytes per element are mk.dtypes's policies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from .chips import Chip, get_chip, slice_of, slice_shapes
from .config import SLIDING, ModelConfig, get_config
from .dtypes import get_dtype
from .params import (
    EMBED,
    EXPERTS,
    FULL_ATTENTION,
    HEAD,
    KNOCKOUTS,
    ROUTER,
    SCALE_BYTES,
    SHARED_MLP,
    SLIDING_ATTENTION,
    param_specs,
    quantized_in,
    scale_count,
)
from .published import published_table
from .routing import expected_distinct_experts
from .units import positive_int

KV_SLIDING = "kv_sliding"
KV_FULL = "kv_full"
COMPONENT_ORDER = (
    "sliding_attention",
    "full_attention",
    "shared_mlp",
    EXPERTS,
    "router",
    "norms",
    "head",
    KV_SLIDING,
    KV_FULL,
)


@dataclass(frozen=True)
class ByteCount:
    model: str
    context: int
    batch: int
    dtype: str
    by_component: dict[str, float] = field(default_factory=dict)
    all_weights: float = 0.0  # every weight held in memory (all experts, the embedding; INT8 with its scales)

    @property
    def total(self) -> float:
        return sum(self.by_component.values())

    @property
    def weights(self) -> float:
        return sum(v for k, v in self.by_component.items() if not k.startswith("kv_"))

    @property
    def kv(self) -> float:
        return self.by_component[KV_SLIDING] + self.by_component[KV_FULL]

    @property
    def by_knockout(self) -> dict[str, float]:
        """Bytes by what a knock-out switches off (mk.params.KNOCKOUTS): an attention type's with its own KV cache,
        the rest by component; only those with bytes."""
        own_kv = {FULL_ATTENTION: KV_FULL, SLIDING_ATTENTION: KV_SLIDING}
        got = {c: self.by_component.get(c, 0.0) + self.by_component.get(own_kv.get(c, ""), 0.0) for c in KNOCKOUTS}
        return {c: b for c, b in got.items() if b > 0}


ModelLike = ModelConfig | str | Path  # a config, or what mk.config.get_config reads into one (once a call)


def kv_bytes_per_user(model: ModelLike, context: int, kv_bytes: float = 2) -> dict[str, float]:
    """KV cache read by one user's decode step at ``context`` positions, by layer type (MLA's compressed
    latent and RoPE key for a DeepSeek-style layer, K and V otherwise)."""
    cfg = get_config(model)
    out = {KV_SLIDING: 0.0, KV_FULL: 0.0}
    for t in cfg.layer_types:
        elements = cfg.cache_positions(t, context) * cfg.cache_elements(t)
        out[KV_SLIDING if t == SLIDING else KV_FULL] += elements * kv_bytes
    return out


def bytes_per_token(model: ModelLike, context: int, batch: int = 1, dtype: str = "bf16") -> ByteCount:
    """Bytes one decode step reads from memory, by component.

    ``model``: a ModelConfig or anything mk.config.get_config takes (a preset, a ``config.json``, read once).
    ``context`` is the number of positions in the cache (the prompt plus tokens so far). The head is the tied
    embedding or the untied output matrix, read once; the embedding lookup reads B rows and is not counted. Under
    an INT8 policy each quantized matrix (``mk.params.quantized_in``) also reads ``SCALE_BYTES`` per scale
    (mk.params.scale_count; an expert's per distinct expert read), added to its component.
    """
    positive_int("context", context)
    positive_int("batch", batch)
    cfg = get_config(model)
    pol = get_dtype(dtype)
    if pol.experts_only and not cfg.is_moe:
        raise ValueError(
            f"dtype {dtype!r} is a format of routed experts ({pol.description.split(';')[0]}); {cfg.name} has none: "
            "use bf16, fp8 or int8"
        )
    comp = {c: 0.0 for c in COMPONENT_ORDER}
    for k, v in kv_bytes_per_user(cfg, context, pol.kv).items():
        comp[k] = v * batch
    specs = param_specs(cfg)
    scaled = frozenset(quantized_in(specs, pol.quant))
    held = 0.0
    for s in specs:
        scales = scale_count(s) * SCALE_BYTES if s.path in scaled else 0.0
        per = {EXPERTS: pol.expert, HEAD: pol.head}.get(s.component, pol.matrix) if s.matrix else pol.vector
        held += s.size * per + scales
        if s.component != EMBED:
            comp[s.component] += s.size * per + scales
    if cfg.is_moe:  # the share of the experts the batch routes to: the same in every MoE layer (top_k of num_experts)
        comp[EXPERTS] *= expected_distinct_experts(cfg.num_experts, cfg.top_k, batch) / cfg.num_experts
    return ByteCount(cfg.name, context, batch, dtype, comp, held)


@dataclass(frozen=True)
class SpeedOfLight:
    model: str
    chip: str
    context: int
    batch: int
    dtype: str
    bytes_per_token: float  # bytes read by one step (which decodes one token per user)
    bandwidth: float
    bytes_by_component: dict[str, float]
    held_bytes: float = 0.0  # what the chips hold: every weight and the users' caches
    hbm_bytes: float = 0.0  # the chip's (or slice's) memory

    @property
    def fits_in_hbm(self) -> bool:
        """Whether the weights and the users' caches fit the slice's HBM (spread evenly over its chips)."""
        return self.held_bytes <= self.hbm_bytes

    @property
    def step_s(self) -> float:
        return self.bytes_per_token / self.bandwidth

    @property
    def tokens_per_s(self) -> float:
        """Per user: one token per step."""
        return 1.0 / self.step_s

    @property
    def tokens_per_s_total(self) -> float:
        return self.batch / self.step_s

    def to_dict(self) -> dict:
        return {
            "model": self.model,
            "chip": self.chip,
            "context": self.context,
            "batch": self.batch,
            "dtype": self.dtype,
            "bytes_per_token": self.bytes_per_token,
            "bandwidth_Bps": self.bandwidth,
            "step_ms": self.step_s * 1e3,
            "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_total": self.tokens_per_s_total,
            "bytes_by_component": dict(self.bytes_by_component),
            "kind": "modelled (speed of light: bandwidth / bytes read per step)",
        }


def speed_of_light(
    model: ModelLike, chip: Chip | str, context: int, batch: int = 1, dtype: str = "bf16"
) -> SpeedOfLight:
    """The fastest a decode step can go on ``chip``: all its bytes read at full memory bandwidth."""
    return _on_chip(bytes_per_token(model, context, batch, dtype), get_chip(chip))


def text(s: SpeedOfLight) -> str:
    """A speed of light as ``python -m mk sol`` prints it: the step, then the bytes of each component."""
    lines = [
        f"{s.model} on {s.chip}, context {s.context}, batch {s.batch}, {s.dtype} (modelled)",
        f"  bytes per step  {s.bytes_per_token / 1e9:10.4f} GB",
        f"  step            {s.step_s * 1e3:10.4f} ms",
        f"  tokens/s/user   {s.tokens_per_s:10.1f}",
        f"  tokens/s total  {s.tokens_per_s_total:10.1f}",
    ]
    return "\n".join(lines + [f"    {k:<18}{v / 1e9:10.4f} GB" for k, v in s.bytes_by_component.items()])


def _on_chip(bc: ByteCount, chip: Chip) -> SpeedOfLight:
    """:func:`speed_of_light` of a step's bytes, counted once, on ``chip``."""
    held = bc.all_weights + bc.kv
    return SpeedOfLight(
        bc.model, chip.name, bc.context, bc.batch, bc.dtype, bc.total, chip.hbm_bandwidth, bc.by_component, held,
        chip.hbm_bytes,
    )  # fmt: skip


# Tables for the notebooks: long DataFrames in bytes, bytes/s and tokens/s, each row with its kind. --------
SOL_KIND = "modelled (mk.sol)"


def sol_table(models, chips, context: int = 1024, batch: int = 1, dtype: str = "bf16") -> pd.DataFrame:
    """The speed of light of each model on each chip, beside the seed's published value where it has one."""
    pub = published_table()
    pub = pub[
        (pub["quantity"] == "speed_of_light")
        & (pub["context"] == context)
        & (pub["batch"] == batch)
        & (pub["dtype"] == dtype)
    ]
    rows = []
    for m in models:
        cfg = get_config(m)
        for c in chips:
            s = speed_of_light(cfg, c, context, batch, dtype)
            hit = pub[(pub["model"] == s.model) & (pub["chip"] == s.chip)]
            published = float(hit["value"].iloc[0]) if len(hit) else math.nan
            rows.append(
                dict(
                    model=s.model,
                    chip=s.chip,
                    bandwidth_Bps=s.bandwidth,
                    bytes_per_token=s.bytes_per_token,
                    tokens_per_s=s.tokens_per_s,
                    published_tokens_per_s=published,
                    diff_pct=100 * (s.tokens_per_s / published - 1),
                    source=hit["source"].iloc[0] if len(hit) else "",
                    kind=SOL_KIND + (f"; published: data/published.csv row {hit['key'].iloc[0]}" if len(hit) else ""),
                )
            )
    return pd.DataFrame(rows)


def published_vs_sol(keys=None) -> pd.DataFrame:
    """The seed's measured tokens/s (``quantity == tokens_per_s`` in data/published.csv, or ``keys``)
    against the speed of light under the same model, chip, context, batch and data type."""
    t = published_table()
    runs = t[t["quantity"] == "tokens_per_s"] if keys is None else t.set_index("key").loc[list(keys)].reset_index()
    fractions = t[t["quantity"] == "fraction_of_sol"]
    rows = []
    for r in runs.itertuples():
        s = speed_of_light(r.model, r.chip, int(r.context), int(r.batch), r.dtype)
        f = fractions[
            (fractions["model"] == r.model)
            & (fractions["chip"] == r.chip)
            & (fractions["dtype"] == r.dtype)
            & (fractions["engine"] == r.engine)
        ]
        rows.append(
            dict(
                key=r.key,
                engine=r.engine,
                model=r.model,
                chip=r.chip,
                dtype=r.dtype,
                published_tokens_per_s=r.value,
                sol_tokens_per_s=s.tokens_per_s,
                fraction_of_sol=r.value / s.tokens_per_s,
                published_fraction=float(f["value"].iloc[0]) if len(f) else math.nan,
                source=r.source,
                kind="published (the seed) vs modelled SoL",
            )
        )
    return pd.DataFrame(rows)


def component_table(models, context: int = 1024, batch: int = 1, dtype: str = "bf16") -> pd.DataFrame:
    """Bytes read per step by component, one row per (model, component). A dense model's MLP is its only
    one: it is called ``mlp`` here (``shared_mlp`` beside the routed experts of an MoE model)."""
    rows = []
    for m in models:
        cfg = get_config(m)
        bc = bytes_per_token(cfg, context, batch, dtype)
        rows += [
            dict(
                model=bc.model,
                component="mlp" if k == SHARED_MLP and not cfg.is_moe else k,
                bytes=v,
                share=v / bc.total,
                kind=SOL_KIND,
            )
            for k, v in bc.by_component.items()
            if cfg.is_moe or k not in (EXPERTS, ROUTER)
        ]
    return pd.DataFrame(rows)


def context_sweep(models, chips, contexts, batch: int = 1, dtype: str = "bf16") -> pd.DataFrame:
    """Speed of light against context length: the full layers' KV grows with the context, the sliding
    layers' stops growing at the window."""
    rows = []
    for m in models:
        cfg = get_config(m)
        for n in contexts:
            bc = bytes_per_token(cfg, n, batch, dtype)
            for c in chips:
                chip = get_chip(c)
                rows.append(
                    dict(
                        model=cfg.name,
                        chip=chip.name,
                        context=n,
                        bytes_per_token=bc.total,
                        kv_sliding_bytes=bc.by_component[KV_SLIDING],
                        kv_full_bytes=bc.by_component[KV_FULL],
                        tokens_per_s=chip.hbm_bandwidth / bc.total,
                        kind=SOL_KIND,
                    )
                )
    return pd.DataFrame(rows)


def batch_sweep(model, chips, batches, context: int = 1024, dtype: str = "bf16") -> pd.DataFrame:
    """Speed of light against batch: more users touch more distinct experts and read more KV."""
    cfg = get_config(model)
    rows = []
    for b in batches:
        bc = bytes_per_token(cfg, context, b, dtype)
        for c in chips:
            chip = get_chip(c)
            step_s = bc.total / chip.hbm_bandwidth
            rows.append(
                dict(
                    model=cfg.name,
                    chip=chip.name,
                    batch=b,
                    expected_experts=expected_distinct_experts(cfg.num_experts, cfg.top_k, b),
                    bytes_per_token=bc.total,
                    tokens_per_s=1 / step_s,
                    tokens_per_s_total=b / step_s,
                    kind=SOL_KIND,
                )
            )
    return pd.DataFrame(rows)


def smallest_slices(model, context: int, batch: int = 1, dtype: str = "bf16") -> pd.DataFrame:
    """For each TPU data/slices.csv documents slice shapes of: the smallest slice whose HBM holds the model's weights
    and its users' caches in ``dtype`` (:attr:`SpeedOfLight.fits_in_hbm`), its torus, hosts and speed of light
    there; where no documented slice holds it, the largest one, marked ``fits`` False."""
    bc = bytes_per_token(model, context, batch, dtype)  # the same bytes on every slice
    rows = []
    for base, shapes in slice_shapes().items():
        for shape in shapes:
            s = _on_chip(bc, get_chip(shape.name))
            if s.fits_in_hbm or shape is shapes[-1]:
                break
        rows.append(
            dict(
                model=s.model, dtype=dtype, context=context, batch=batch, chip=base, slice=shape.name,
                topology=shape.topology, chips=shape.chips, hosts=shape.hosts, bytes_per_token_GB=bc.total / 1e9,
                held_GB=s.held_bytes / 1e9, hbm_GB=s.hbm_bytes / 1e9, fits=s.fits_in_hbm, tokens_per_s=s.tokens_per_s,
                kind=f"{SOL_KIND}; the slice shapes: data/slices.csv", source=shape.source,
            )
        )  # fmt: skip
    return pd.DataFrame(rows)


def auto_chip(model, base_chip: str, dtype: str = "bf16", context: int = 1024, batch: int = 1) -> Chip:
    """The smallest slice of ``base_chip`` (``tpu-v5e``) whose HBM holds ``model``'s weights and its users' caches in
    ``dtype`` (:attr:`SpeedOfLight.fits_in_hbm`): of its documented slice shapes (data/slices.csv) where it has
    any; for a chip without documented shapes (TPU7x, GPUs), the smallest power-of-two count of chips that holds it
    (a count, not a documented shape). Refuses where even the largest documented slice, or 2^16 chips, does not."""
    base = get_chip(base_chip)
    if base.chips != 1:
        raise ValueError(f"auto_chip takes a base chip ({base.base}), not the slice {base.name}")
    bc = bytes_per_token(model, context, batch, dtype)
    shapes = slice_shapes().get(base.name)
    names = [s.name for s in shapes] if shapes else [slice_of(base.name, 2**i).name for i in range(17)]
    for name in names:
        chip = get_chip(name)
        if _on_chip(bc, chip).fits_in_hbm:
            return chip
    raise ValueError(
        f"{bc.model} in {dtype} ({(bc.all_weights + bc.kv) / 1e9:.0f} GB held) fits no "
        + (f"documented {base.name} slice (the largest: {names[-1]})" if shapes else f"slice up to {names[-1]}")
    )


def format_table(models, dtypes, context: int, batch: int = 1) -> pd.DataFrame:
    """Each model in each of ``dtypes`` that applies to it (a format of routed experts skips a model without them):
    the bytes one step reads, the weights and caches held, and each TPU's smallest documented slice that holds them
    (:func:`smallest_slices`: ``<chip> slice``, its hosts and its speed of light; ``none`` where no documented slice
    holds it)."""
    rows = []
    for m in models:
        cfg = get_config(m)
        for d in dtypes:
            if get_dtype(d).experts_only and not cfg.is_moe:
                continue
            slices = smallest_slices(cfg, context, batch, d)
            first = slices.iloc[0]
            row = dict(
                model=cfg.name, dtype=d, bytes_per_token_GB=first.bytes_per_token_GB, held_GB=first.held_GB,
                context=context, batch=batch,
            )  # fmt: skip
            for r in slices.itertuples():
                row[f"{r.chip} slice"] = r.slice if r.fits else f"none (largest {r.slice})"
                row[f"{r.chip} hosts"] = r.hosts if r.fits else math.nan
                row[f"{r.chip} tokens_per_s"] = r.tokens_per_s if r.fits else math.nan
            rows.append(dict(row, kind=f"{SOL_KIND}; the slice shapes: data/slices.csv"))
    return pd.DataFrame(rows)
