"""The KV cache's slots, one rule for the reference, the plan and the kernel: a full layer holds a slot per position,
a sliding layer a ring of its window (longer with speculation), position p living in slot p mod slots."""

from __future__ import annotations

from .config import SLIDING, ModelConfig
from .units import round_up


def ring_slots(cfg: ModelConfig, draft_tokens: int = 0) -> int:
    """A sliding layer's ring before rounding: the window, and with speculation ``draft_tokens`` slots for the drafts
    a verification step writes ahead plus one for the position behind the window that Gemma 4's assistant reads
    (mk.assistant), so neither overwrites a position still read."""
    return cfg.sliding_window + (draft_tokens + 1 if draft_tokens else 0)


def cache_len(cfg: ModelConfig, layer_type: str, max_len: int, multiple: int = 1, draft_tokens: int = 0) -> int:
    """Slots of a layer's KV cache: a ring of :func:`ring_slots` for sliding layers, ``max_len`` for full, each
    rounded up to a multiple of ``multiple``."""
    return round_up(ring_slots(cfg, draft_tokens) if layer_type == SLIDING else max_len, multiple)
