"""Parameter trees in the formats big models ship in (mk.checkpoint_formats), for the megakernel to stream as they are.

Like mk.quant's INT8 trees, a quantized matrix ``path`` ([..., in, out], as in mk.params) keeps its codes in
``params[path]`` and its scales in ``params[path + FSCALE_SUFFIX]``, both in the format's own dtypes and in mk's
orientation (the input axis second to last):

- ``fp8-block`` (DeepSeek-V3): float8 e4m3 codes ``[..., in, out]``, a float32 scale per 128 x 128 block
  ``[..., ceil(in/128), ceil(out/128)]``; every matrix but the embedding, the head and the router, which
  DeepSeek-V3 ships in BF16 (mk.sol's ``fp8-block`` counts its router's few bytes as FP8).
- ``mxfp4`` (gpt-oss): two FP4 codes a byte along the input ``[..., in/2, out]`` (uint8, the low nibble first) and
  an E8M0 exponent per 32 inputs ``[..., in/32, out]`` (uint8); the routed experts only.
- ``int4`` (Kimi K2 Thinking, compressed-tensors' pack-quantized): ``q + 8`` two a byte along the input (its int32
  words as little-endian bytes) and a BF16 scale per 32 inputs; the routed experts only.

The numbers are mk.checkpoint_formats' encoders and decoders, run on each matrix transposed to checkpoints' [out, in]:
:func:`dequantize` gives the weights a checkpoint in the format loads as (mk.checkpoint_formats.DecodedCheckpoint),
rounded to the compute dtype, and the megakernel widens each tile in VMEM the same way (mk.megakernel.format_tiles).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax.numpy as jnp
import ml_dtypes
import numpy as np

from . import checkpoint_formats as F
from .config import ModelConfig
from .dtypes import SCALE_BLOCK
from .params import SCALE_SUFFIX, param_specs, quantized_in

FSCALE_SUFFIX = "_fscale"


@dataclass(frozen=True)
class Format:
    """How a scheme stores a matrix: codes and scales dtypes, the block a scale covers along (input, output), and
    whether two codes share a byte (along the input)."""

    name: str
    codes: object
    scales: object
    block: tuple[int, int]
    nibbles: bool
    experts_only: bool
    who: str  # the release that ships it

    @property
    def scale_itemsize(self) -> int:
        return np.dtype(self.scales).itemsize


FP8_BLOCK, MXFP4, INT4 = "fp8-block", "mxfp4", "int4"  # mk.sol's --dtype names for the same bytes
FORMAT_SCHEMES = {
    f.name: f
    for f in (
        Format(FP8_BLOCK, ml_dtypes.float8_e4m3fn, np.float32, (SCALE_BLOCK, SCALE_BLOCK), False, False, "DeepSeek-V3"),
        Format(MXFP4, np.uint8, np.uint8, (F.MX_BLOCK, 1), True, True, "gpt-oss"),
        Format(INT4, np.uint8, ml_dtypes.bfloat16, (32, 1), True, True, "Kimi K2 Thinking"),
    )
}


def get_format(scheme: str) -> Format:
    if scheme not in FORMAT_SCHEMES:
        raise ValueError(f"unknown format {scheme!r}; known: {', '.join(FORMAT_SCHEMES)}")
    return FORMAT_SCHEMES[scheme]


def fscale_path(path: str) -> str:
    return path + FSCALE_SUFFIX


def format_paths(cfg: ModelConfig, scheme: str) -> tuple[str, ...]:
    """The matrices ``scheme`` stores in its format, in mk.params order; a format that cannot hold the model is
    refused by name, with the fix."""
    fmt = get_format(scheme)
    if fmt.experts_only and not cfg.is_moe:
        raise ValueError(f"{scheme} is a format of routed experts ({fmt.who}'s); {cfg.name} has none: use fp8-block")
    if fmt.experts_only:
        g = fmt.block[0]
        for what, n in (("hidden size", cfg.hidden_size), ("expert width", cfg.expert_intermediate)):
            if n % g:
                raise ValueError(
                    f"{scheme} groups {g} inputs of each expert matrix; {cfg.name}'s {what} {n} is not a multiple of "
                    f"{g}: use fp8-block or int8-experts"
                )
    paths = quantized_in(param_specs(cfg), "int8-experts" if fmt.experts_only else "int8")
    return tuple(p for p in paths if p.rsplit(".", 1)[-1] != "router_proj")  # the router ships in BF16


def _t(a):
    return np.swapaxes(a, -1, -2)


def encode_matrix(w, scheme: str) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales) of ``w [..., in, out]`` in ``scheme``'s tree layout (the module's docstring)."""
    fmt, w = get_format(scheme), np.asarray(w, np.float32)
    lead = w.shape[:-2]
    mats = w.reshape(-1, *w.shape[-2:])
    if scheme == MXFP4:  # a matrix at a time: the rounding compares each value with all 16 codes (16x its bytes)
        pairs = [F.encode_mxfp4(m.T) for m in mats]  # [out, G, 16], [out, G]
        blocks, scales = np.stack([b for b, _ in pairs]), np.stack([s for _, s in pairs])
        return _t(blocks.reshape(*lead, w.shape[-1], -1)), _t(scales.reshape(*lead, *scales.shape[1:]))
    codes, scales = [], []
    for m in mats:
        if scheme == FP8_BLOCK:
            q, s = F.encode_fp8_block(m.T, fmt.block[::-1])
        else:
            words, s, _ = F.encode_int4_packed(m.T, fmt.block[0])
            q, s = np.ascontiguousarray(words, "<i4").view(np.uint8), s.astype(fmt.scales)
        codes.append(q.T)
        scales.append(s.T)
    return np.stack(codes).reshape(*lead, *codes[0].shape), np.stack(scales).reshape(*lead, *scales[0].shape)


def decode_matrix(codes, scales, scheme: str) -> np.ndarray:
    """The float32 ``[..., in, out]`` a matrix's (codes, scales) stand for: mk.checkpoint_formats' decoders."""
    codes, scales = np.asarray(codes), np.asarray(scales)
    if scheme == FP8_BLOCK:
        return _t(F.decode_fp8_block(_t(codes), _t(scales), matrix_block(codes, scales, scheme)[::-1]))
    if scheme == MXFP4:
        blocks = _t(codes).reshape(*codes.shape[:-2], codes.shape[-1], -1, F.MX_BLOCK // 2)
        return _t(F.decode_mxfp4(blocks, _t(scales)))
    out = []
    for q, s in zip(codes.reshape(-1, *codes.shape[-2:]), scales.reshape(-1, *scales.shape[-2:])):
        words = np.ascontiguousarray(q.T).view("<i4")
        out.append(F.decode_int4_packed(words, s.T, (q.shape[1], 2 * q.shape[0])).T)
    return np.stack(out).reshape(*codes.shape[:-2], 2 * codes.shape[-2], codes.shape[-1])


def quantize(params: dict, cfg: ModelConfig, scheme: str) -> dict:
    """``params`` (a float tree) with the matrices of ``scheme`` as its codes plus scales (a new dict)."""
    if format_of(params) is not None or any(k.endswith(SCALE_SUFFIX) for k in params):
        raise ValueError("the tree is quantized already (a format's or INT8): quantize a BF16 or F32 parameter tree")
    out = dict(params)
    for path in format_paths(cfg, scheme):
        codes, scales = encode_matrix(params[path], scheme)
        out[path], out[fscale_path(path)] = jnp.asarray(codes), jnp.asarray(scales)
    return out


def random_codes(params: dict, cfg: ModelConfig, scheme: str, seed: int = 0) -> dict:
    """``params`` (a float tree) with the matrices of ``scheme`` as random codes and scales of the shapes and dtypes
    :func:`quantize` gives (a new dict): each matrix's codes drawn at random (FP8: normal values rounded to e4m3; the
    4-bit formats: every code equally likely) under one scale, so its weights have the float matrix's RMS. For timing a
    model whose encoding on the host takes minutes (gpt-oss-20b's experts); the weights the kernel then multiplies by
    are :func:`dequantize`'s of this tree, as for any format tree."""
    fmt, rng, out = get_format(scheme), np.random.default_rng(seed), dict(params)
    for path in format_paths(cfg, scheme):
        w = np.asarray(params[path], np.float32)
        *lead, n_in, n_out = w.shape
        rms = float(np.sqrt(np.mean(np.square(w)))) or 1.0
        scales_shape = (*lead, math.ceil(n_in / fmt.block[0]), math.ceil(n_out / fmt.block[1]))
        if fmt.nibbles:
            codes = rng.integers(0, 256, (*lead, n_in // 2, n_out), dtype=np.uint8)
            values = F.FP4_VALUES if scheme == MXFP4 else np.arange(16) - 8  # every code equally likely
            scale = rms / float(np.sqrt(np.mean(np.square(values))))
            scales = np.full(scales_shape, 127 + round(math.log2(scale)) if scheme == MXFP4 else scale)
        else:
            codes = rng.standard_normal(w.shape, np.float32).astype(fmt.codes)
            scales = np.full(scales_shape, rms)
        out[path], out[fscale_path(path)] = jnp.asarray(codes), jnp.asarray(scales.astype(fmt.scales))
    return out


def format_of(params: dict) -> str | None:
    """The format a tree's matrices are in (None: not one of these), told by its scales' dtype."""
    for k, v in params.items():
        if k.endswith(FSCALE_SUFFIX):
            return scheme_of_scales(v.dtype, params[k.removesuffix(FSCALE_SUFFIX)].dtype)
    return None


def scheme_of_scales(scales_dtype, codes_dtype) -> str:
    for f in FORMAT_SCHEMES.values():
        if np.dtype(f.scales) == np.dtype(scales_dtype) and np.dtype(f.codes) == np.dtype(codes_dtype):
            return f.name
    raise ValueError(f"codes {codes_dtype} with scales {scales_dtype} are none of {', '.join(FORMAT_SCHEMES)}")


def dequantize(params: dict, cfg: ModelConfig, dtype=None) -> dict:
    """The float tree a format tree stands for (each matrix decoded, rounded to ``dtype``, by default the
    embedding's; scales dropped): the weights the reference and the kernel both multiply by."""
    scheme = format_of(params)
    dtype = dtype or params["embed"].dtype
    out = {k: v for k, v in params.items() if not k.endswith(FSCALE_SUFFIX)}
    for path in format_paths(cfg, scheme):
        out[path] = jnp.asarray(decode_matrix(params[path], params[fscale_path(path)], scheme)).astype(dtype)
    return out


def matrix_block(codes, scales, scheme: str) -> tuple[int, int]:
    """The (input, output) elements one scale of a stored matrix covers: the format's block, or along an axis a
    chip's cut split blocks of (:func:`format_cuts`), the finer blocks it left (the scales then count more)."""
    fmt = get_format(scheme)
    sizes = (codes.shape[-2] * (2 if fmt.nibbles else 1), codes.shape[-1])
    return tuple(b if math.ceil(n / b) == k else n // k for n, k, b in zip(sizes, scales.shape[-2:], fmt.block))


def format_cuts(codes, scales, path: str, cut: tuple[int, int, int]):
    """A chip's cut (axis, first, n) of a stored matrix's elements as (its scales, the cut of its codes, the cut of
    its scales): the input axis holds two codes a byte or one scale a block. FP8 blocks may split (a chip's 192
    columns of DeepSeek-V3's q_b, its 144 of an 18,432-wide MLP on 128 chips): the scales come back repeated over the
    finer blocks of ``gcd(block, n)`` elements the cut leaves (every chip's the same: mk.plan.layout.layout_grid),
    each taking its block's scale. A cut that splits a byte or a 4-bit format's group is refused by name."""
    scheme = scheme_of_scales(scales.dtype, codes.dtype)
    fmt, (axis, first, n) = get_format(scheme), cut
    if axis < codes.ndim - 2:  # whole experts
        return scales, cut, cut
    along = axis - (codes.ndim - 2)
    block = matrix_block(codes, scales, scheme)[along]
    if not fmt.nibbles and (first % block or n % block):
        finer = math.gcd(block, first, n)
        xp = np if isinstance(scales, np.ndarray) else jnp
        kept = [slice(None)] * scales.ndim
        kept[axis] = slice(0, math.ceil(codes.shape[axis] / finer))
        scales, block = xp.repeat(scales, block // finer, axis=axis)[tuple(kept)], finer
    unit = 2 if fmt.nibbles and along == 0 else 1
    for step in (unit, block):
        if first % step or n % step:
            what = ("input", "output")[along]
            raise ValueError(
                f"a chip's {n} {what} channels of {path} from {first} split {scheme}'s blocks of {block} along its "
                f"{what}: use a placement or chip count whose slices are whole blocks (mk.sharding.pods.pod_setup "
                "cuts a 4-bit format's experts in whole groups), or int8 weights"
            )
    return scales, (axis, first // unit, n // unit), (axis, first // block, n // block)
