"""Bytes read per decoded token, by component, and the speed of light they imply on a chip.

Speed of light = memory bandwidth / bytes read per step. One step decodes one token for each of
B users: the weights are read once for all of them (the experts that at least one user routes
to), the KV cache once per user.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .chips import Chip, get_chip
from .config import FULL, SLIDING, Gemma4Config
from .params import EXPERTS, param_specs

KV_SLIDING = "kv_sliding"
KV_FULL = "kv_full"
COMPONENT_ORDER = ("sliding_attention", "full_attention", "shared_mlp", EXPERTS, "router", "norms", "head",
                   KV_SLIDING, KV_FULL)


@dataclass(frozen=True)
class DtypePolicy:
    """Bytes per element for each kind of tensor."""

    name: str
    matrix: float   # attention, shared MLP, router and head matrices
    expert: float   # expert matrices
    vector: float   # norms and scales
    kv: float       # the KV cache
    description: str


DTYPES: dict[str, DtypePolicy] = {p.name: p for p in (
    DtypePolicy("bf16", 2, 2, 2, 2, "all weights and the KV cache in BF16"),
    DtypePolicy("fp8", 1, 1, 2, 2, "FP8 matrices (head included), BF16 norms and KV cache"),
    DtypePolicy("int8-experts", 2, 1, 2, 2, "INT8 expert matrices, everything else BF16"),
    DtypePolicy("f32", 4, 4, 4, 4, "all weights and the KV cache in F32"),
)}


def get_dtype(name: str) -> DtypePolicy:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(DTYPES)}") from None


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def expected_distinct_experts(num_experts: int, top_k: int, batch: int) -> float:
    """Expected number of distinct experts that ``batch`` users touch in one layer, each routing to
    ``top_k`` of ``num_experts`` uniformly: E * (1 - (1 - k/E)^B)."""
    if num_experts == 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** batch)


@dataclass(frozen=True)
class ByteCount:
    model: str
    context: int
    batch: int
    dtype: str
    by_component: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.by_component.values())

    @property
    def weights(self) -> float:
        return sum(v for k, v in self.by_component.items() if not k.startswith("kv_"))

    @property
    def kv(self) -> float:
        return self.by_component[KV_SLIDING] + self.by_component[KV_FULL]


def kv_bytes_per_user(cfg: Gemma4Config, context: int, kv_bytes: float = 2) -> dict[str, float]:
    """KV cache read by one user's decode step at ``context`` positions, by layer type."""
    out = {KV_SLIDING: 0.0, KV_FULL: 0.0}
    for t in cfg.layer_types:
        per_pos = 2 * cfg.kv_heads(t) * cfg.head_dim(t) * kv_bytes  # K and V
        out[KV_SLIDING if t == SLIDING else KV_FULL] += cfg.cache_positions(t, context) * per_pos
    return out


def bytes_per_token(cfg: Gemma4Config, context: int, batch: int = 1, dtype: str = "bf16") -> ByteCount:
    """Bytes one decode step reads from memory, by component.

    ``context`` is the number of positions in the cache (the prompt plus tokens so far). The head
    is the tied embedding, read once; the embedding lookup reads B rows and is not counted.
    """
    _positive_int("context", context)
    _positive_int("batch", batch)
    pol = get_dtype(dtype)
    comp = {c: 0.0 for c in COMPONENT_ORDER}
    experts_read = expected_distinct_experts(cfg.num_experts, cfg.top_k, batch)
    for s in param_specs(cfg):
        if s.component == EXPERTS:
            comp[EXPERTS] += s.size / cfg.num_experts * experts_read * pol.expert
        else:
            comp[s.component] += s.size * (pol.matrix if s.matrix else pol.vector)
    for k, v in kv_bytes_per_user(cfg, context, pol.kv).items():
        comp[k] = v * batch
    return ByteCount(cfg.name, context, batch, dtype, comp)


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
            "model": self.model, "chip": self.chip, "context": self.context, "batch": self.batch,
            "dtype": self.dtype, "bytes_per_token": self.bytes_per_token, "bandwidth_Bps": self.bandwidth,
            "step_ms": self.step_s * 1e3, "tokens_per_s": self.tokens_per_s,
            "tokens_per_s_total": self.tokens_per_s_total, "bytes_by_component": dict(self.bytes_by_component),
            "kind": "modelled (speed of light: bandwidth / bytes read per step)",
        }


def speed_of_light(cfg: Gemma4Config, chip: Chip | str, context: int, batch: int = 1,
                   dtype: str = "bf16") -> SpeedOfLight:
    """The fastest a decode step can go on ``chip``: all its bytes read at full memory bandwidth."""
    chip = get_chip(chip) if isinstance(chip, str) else chip
    bc = bytes_per_token(cfg, context, batch, dtype)
    return SpeedOfLight(cfg.name, chip.name, context, batch, dtype, bc.total, chip.hbm_bandwidth,
                        bc.by_component)
