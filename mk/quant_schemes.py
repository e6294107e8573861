"""INT8 schemes as names and paths, without JAX: which matrices a scheme stores as INT8 codes, where their
scales live, and what a scale costs in bytes. The numerics (quantizing, dequantizing) are mk.quant's."""

from __future__ import annotations

from .config import ModelConfig
from .params import EMBED, EXPERTS, HEAD, param_specs

SCHEMES = ("none", "int8-experts", "int8")
SCALE_SUFFIX = "_qscale"
SCALE_BYTES = 4  # an INT8 matrix's scale per output channel: float32


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization {scheme!r}; known: {', '.join(SCHEMES)}")
    return scheme


def scale_path(path: str) -> str:
    """Where a quantized matrix's per-output-channel scales live in the parameter tree."""
    return path + SCALE_SUFFIX


def quantized_paths(cfg: ModelConfig, scheme: str) -> tuple[str, ...]:
    """The matrices ``scheme`` stores as INT8, in mk.params order."""
    return quantized_in(param_specs(cfg), scheme)


def quantized_in(specs, scheme: str) -> tuple[str, ...]:
    """The paths of the matrices among ``specs`` (mk.params.ParamSpec) that ``scheme`` stores as INT8: every
    matrix but the head and embedding for ``int8``, the experts' for ``int8-experts``."""
    check_scheme(scheme)
    if scheme == "none":
        return ()
    return tuple(
        s.path
        for s in specs
        if s.matrix and s.component not in (HEAD, EMBED) and (scheme == "int8" or s.component == EXPERTS)
    )
