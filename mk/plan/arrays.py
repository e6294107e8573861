"""The kernel's HBM arrays as a plan lays them out: every weight stacked by layer type and padded (with its INT8 or
format scales), the packed table of vectors, RoPE's frequencies and the KV cache, each a shape and an element type
(numpy's name). Worked out once here from the model's layout; the kernel's refs, the packing and the ahead-of-time
compile read them from the plan (``StepPlan.arrays``) rather than each from the config again."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ModelConfig
from ..format_trees import FORMAT_SCHEMES, FSCALE_SUFFIX, format_paths, fscale_path
from ..params import SCALE_SUFFIX, param_specs, quantized_paths, scale_path
from ..units import round_up
from .layout import (
    EXPERT_BIASES,
    ROWS,
    format_scales_shape,
    freq_width,
    group_width,
    head_groups,
    latent_lanes,
    layout_grid,
    padded_shape,
    scale_rows,
    scale_width,
    stacked,
    stored_shape,
    vector_table_shape,
)

Shape = tuple[int, ...]


@dataclass(frozen=True)
class Array:
    shape: Shape
    dtype: str  # numpy's name: bfloat16, float32, int8, float8_e4m3fn, uint8 ...


@dataclass(frozen=True)
class HbmArrays:
    """One chip's kernel inputs in HBM: ``weights`` (name -> Array: ``embed`` and each stacked matrix, with its
    scales), ``cache`` (``{type}.k|v``, MLA: ``{type}.latent|rope_k``), the ``vectors`` table and ``inv_freq``."""

    vectors: Array  # [rows padded to 8, width] f32: every norm weight and scale, one a row
    inv_freq: Array  # [8, head_dim] f32: RoPE's inverse frequencies, row 0 sliding, row 1 full
    weights: dict[str, Array]
    cache: dict[str, Array]

    @property
    def weight_bytes(self) -> int:
        return sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in self.weights.values())


def matrix_shapes(cfg: ModelConfig) -> dict[str, Shape]:
    """Every matrix of the parameter tree and its (unpadded) shape."""
    return {s.path: s.shape for s in param_specs(cfg) if len(s.shape) >= 2}


def weight_shapes(cfg: ModelConfig, experts: int | None = None, quantize: str = "none") -> dict[str, Shape]:
    """The kernel's HBM weights: ``embed`` and each layer matrix stacked by layer type, padded;
    ``experts``: the routed experts a chip holds (default all). A quantized matrix (``quantize``: the
    mk.quant scheme) also has its scales, ``{name}_qscale`` [layers, rows, N]: one row per expert (one
    for a layer's matrix), padded to whole sublane tiles (mk.plan.layout.scale_rows)."""
    out: dict[str, Shape] = {}
    fmt = FORMAT_SCHEMES.get(quantize)
    quantized = set(format_paths(cfg, quantize) if fmt else quantized_paths(cfg, quantize))
    for path, shape in matrix_shapes(cfg).items():
        name, index = stacked(cfg, path)
        padded = padded_shape(cfg, path, shape)
        if experts is not None and path.rsplit(".", 1)[-1] in EXPERT_BIASES:
            padded = padded_shape(cfg, path, (experts, *shape[1:]))
        elif experts is not None and path.rsplit(".", 1)[-1].startswith("expert_"):
            padded = (experts, *padded[1:])
        out[name] = padded if index is None else (index + 1, *padded)
        if path in quantized and fmt:  # its codes as stored, a scale a block (mk.megakernel.format_tiles)
            grid = layout_grid(cfg, path, fmt)
            out[name], out[fscale_path(name)] = (
                stored_shape(out[name], fmt, grid),
                format_scales_shape(out[name], grid, fmt),
            )
        elif path in quantized:
            rows = scale_rows(padded[0] if len(padded) == 3 else 1)
            out[scale_path(name)] = (index + 1, rows, scale_width(cfg, path, padded))
    return out


def weight_dtypes(cfg: ModelConfig, quantize: str, weight_dtype: str) -> dict[str, str]:
    """The element type of each of the kernel's HBM weights: INT8 codes, their float32 scales, the rest
    ``weight_dtype``; or a shipped format's codes and scales in its types."""
    fmt = FORMAT_SCHEMES.get(quantize)
    names = weight_shapes(cfg, quantize=quantize)
    if fmt:
        codes = {stacked(cfg, p)[0] for p in format_paths(cfg, quantize)}
        scales, coded = np.dtype(fmt.scales).name, np.dtype(fmt.codes).name
        return {n: scales if n.endswith(FSCALE_SUFFIX) else coded if n in codes else weight_dtype for n in names}
    quantized = {stacked(cfg, p)[0] for p in quantized_paths(cfg, quantize)}
    return {n: "float32" if n.endswith(SCALE_SUFFIX) else "int8" if n in quantized else weight_dtype for n in names}


def cache_shapes(cfg: ModelConfig, batch: int, slots, heads=None) -> dict[str, Shape]:
    """The kernel's KV cache: per layer type, K and V stacked over its layers, [layers, B, head groups, slots, group
    lanes]; ``slots(t)`` per layer, ``heads(t)`` KV heads (default ``cfg``'s)."""
    out = {}
    heads = heads or cfg.kv_heads
    if cfg.latent_attention is not None:  # one latent and one RoPE key a position (mk.megakernel.latent)
        _, rope, _, latent = latent_lanes(cfg)
        for t in sorted(set(cfg.layer_types)):
            n = cfg.layer_types.count(t)
            out[f"{t}.latent"], out[f"{t}.rope_k"] = (n, batch, 1, slots(t), latent), (n, batch, 1, slots(t), rope)
        return out
    for t in sorted(set(cfg.layer_types)):  # the heads in groups of 128 lanes (mk.plan.layout.head_groups)
        w = cfg.head_dim(t)
        shape = (cfg.layer_types.count(t), batch, head_groups(heads(t), w), slots(t), group_width(w))
        out[f"{t}.k"] = out[f"{t}.v"] = shape
    return out


def packed_arrays(layout: ModelConfig, weight_dtype: str, quantize: str, experts: int | None = None) -> HbmArrays:
    """The arrays mk.megakernel.pack writes for the model laid out as ``layout`` (no cache): its vectors, frequencies
    and weights (``experts``: the routed experts a chip holds, default all)."""
    n, width = vector_table_shape(layout)
    dtypes = weight_dtypes(layout, quantize, weight_dtype)
    return HbmArrays(
        vectors=Array((round_up(n, ROWS), width), "float32"),
        inv_freq=Array((ROWS, freq_width(layout)), "float32"),
        weights={name: Array(s, dtypes[name]) for name, s in weight_shapes(layout, experts, quantize).items()},
        cache={},
    )
