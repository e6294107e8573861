"""INT8 schemes as names and paths, without JAX: which matrices a scheme stores as INT8 codes, where their
scales live, and what a scale costs in bytes. The numerics (quantizing, dequantizing) are mk.quant's."""

from __future__ import annotations

from .config import ModelConfig
from .params import EMBED, EXPERTS, HEAD, param_specs

SCHEMES = ("none", "int8-experts", "int8")
SCALE_SUFFIX = "_qscale"
SCALE_BYTES = 4  # an INT8 matrix's scale (per output channel, or per input channel of a down projection): float32
# Down projections are scaled per input channel (their rows): split over chips by that axis, as the intermediate of
# a split expert or shared MLP is, each chip reads only its own rows' scales, 4 bytes a row of codes. Per output
# channel every chip would read all H scales of an expert for its few rows (4 / 88 = 4.5% of a split 26B-A4B
# expert's codes, at best).
INPUT_SCALED = ("mlp_down", "expert_down")


def scales_inputs(path: str) -> bool:
    """Whether matrix ``path`` ([..., in, out]; a parameter path or a stacked tensor name) has one scale per input
    channel (a down projection) rather than per output channel."""
    return path.removesuffix(SCALE_SUFFIX).rsplit(".", 1)[-1] in INPUT_SCALED


def scale_count(spec) -> float:
    """Scales of a quantized matrix (mk.params.ParamSpec): one per input or output channel, per expert."""
    return spec.size / spec.shape[-1 if scales_inputs(spec.path) else -2]


def tile_rows_scaled(cfg: ModelConfig, path: str) -> bool:
    """Whether a tile of matrix ``path`` in the kernel's layout has one scale per row: it is stored with its outputs on
    rows (ModelConfig.outputs_on_rows) and scaled per output channel, or as it is and scaled per input channel."""
    return cfg.outputs_on_rows(path) != scales_inputs(path)


def check_scheme(scheme: str) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization {scheme!r}; known: {', '.join(SCHEMES)}")
    return scheme


def scale_path(path: str) -> str:
    """Where a quantized matrix's scales live in the parameter tree."""
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
