"""The weight formats big models ship in, as their Hugging Face checkpoints store them, decoded to float.

Three layouts, each named in the checkpoint's ``quantization_config``:

- **FP8 blocks** (``quant_method: "fp8"``; DeepSeek-V3's and Kimi K2's base checkpoints, transformers'
  FineGrainedFP8): a matrix ``X.weight [out, in]`` in float8 e4m3 beside ``X.weight_scale_inv``, one float32 per
  ``weight_block_size`` block (128 x 128; edge blocks partial): ``w = q * s``, as transformers dequantizes it.
  The tensors left in BF16 (embedding, norms, the router, the head) keep their names and dtype.
- **INT4 groups** (``quant_method: "compressed-tensors"``, format ``pack-quantized``; Kimi K2 Thinking's routed
  experts): ``X.weight_packed`` int32 ``[out, in / 8]``, eight signed 4-bit values a word stored as ``q + 8``, the
  first in the lowest bits, along the input axis; ``X.weight_scale [out, in / group]`` (BF16); ``X.weight_shape``
  ``[out, in]``: ``w = q * scale`` (symmetric, no zero point), as compressed-tensors' ``pack_to_int32`` packs it.
- **MXFP4** (``quant_method: "mxfp4"``; gpt-oss's experts): ``X_blocks`` uint8 ``[..., rows, G, 16]``, two FP4
  (e2m1) values a byte, the low nibble first, and ``X_scales`` uint8 ``[..., rows, G]``, an E8M0 exponent per 32
  values: ``w = fp4 * 2^(scale - 127)``; the decoded ``[..., rows, 32 G]`` is transposed on its last two axes into
  the float checkpoint's ``X`` (as transformers' ``convert_moe_packed_tensors`` does).

:class:`DecodedCheckpoint` shows a checkpoint in any of them under the names and shapes its float checkpoint would
have (decoding each tensor to float32 when read), so mk.weights loads it as it loads a float one: the reference
then computes with exactly the weights the format stands for. The encoders write the same layouts (the tests'
tiny checkpoints, and anyone converting a tree). How many bytes each format reads a token is mk.sol's.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from functools import lru_cache

import ml_dtypes
import numpy as np

from .paths import RELEASED_FORMATS_CSV

FP8 = "fp8"
INT4 = "compressed-tensors"
MXFP4 = "mxfp4"
FORMATS = (FP8, INT4, MXFP4)  # the quant_method values read here

FP8_MAX = float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max)  # 448
MX_BLOCK = 32  # values an MXFP4 scale covers
INT4_PER_WORD = 8
INT4_ZERO = 8  # a packed INT4 nibble is q + 8


# The arithmetic of each code, written once for numpy and jax.numpy (``xp``): the decoders here and the megakernel's
# widening in VMEM (mk.megakernel.format_tiles) both use it.
def fp4_value(code, xp=np):
    """The FP4 (e2m1) value of 4-bit ``code``: sign bit 3, exponent bits 1-2, mantissa bit 0 (exponent 0:
    subnormal, 0.5 m)."""
    e, m = (code >> 1) & 3, code & 1
    mag = ((e > 0) + 0.5 * m) * (1 << (xp.maximum(e, 1) - 1))
    return xp.where(code & 8, -mag, mag).astype(xp.float32)


def e8m0_value(scale, xp=np):
    """The float32 power of two 2^(s - 127) an E8M0 exponent ``s`` (uint8) stands for."""
    return xp.ldexp(xp.ones(scale.shape, xp.float32), scale.astype(xp.int32) - 127)


def nibbles(packed, axis: int, xp=np):
    """The 4-bit codes of the bytes ``packed``, two a byte along ``axis`` (the low nibble first): that axis doubled."""
    axis %= packed.ndim
    codes = xp.stack([packed & 0x0F, packed >> 4], axis=axis + 1)
    return codes.reshape(*packed.shape[:axis], 2 * packed.shape[axis], *packed.shape[axis + 1 :])


def pack_nibbles(codes: np.ndarray, axis: int) -> np.ndarray:
    """``nibbles``' inverse: 4-bit ``codes`` two a byte along ``axis`` (even length), the first in the low nibble."""
    pairs = np.moveaxis(np.asarray(codes, np.uint8), axis, -1)
    packed = pairs[..., 0::2] | (pairs[..., 1::2] << 4)
    return np.ascontiguousarray(np.moveaxis(packed, -1, axis))


FP4_VALUES = fp4_value(np.arange(16))  # the 16 FP4 values by code


@dataclass(frozen=True)
class ReleasedFormat:
    """The format a model's authors release its weights in (data/released_formats.csv): mk.sol's data type for its
    bytes, the release it describes, and where that is documented."""

    model: str
    dtype: str
    release: str
    source: str


@lru_cache(maxsize=None)
def released_formats() -> dict[str, ReleasedFormat]:
    with open(RELEASED_FORMATS_CSV, newline="") as f:
        return {r["model"]: ReleasedFormat(**r) for r in csv.DictReader(f)}


def released_format(model: str) -> ReleasedFormat:
    """The format ``model`` (a preset's name) is released in; one line naming the models that have one if not known."""
    known = released_formats()
    if model not in known:
        raise ValueError(f"no released format recorded for {model!r}: data/released_formats.csv has {', '.join(known)}")
    return known[model]


# FP8 with block scales -----------------------------------------------------------------------------
def decode_fp8_block(q: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int] = (128, 128)) -> np.ndarray:
    """``q [..., out, in]`` float8 e4m3 times its block's float32 scale, ``scale_inv [..., ceil(out/b0), ceil(in/b1)]``
    (one a block of ``block``)."""
    rows, cols = q.shape[-2:]
    s = np.repeat(np.repeat(scale_inv.astype(np.float32), block[0], axis=-2), block[1], axis=-1)[..., :rows, :cols]
    return q.astype(np.float32) * s


def encode_fp8_block(w: np.ndarray, block: tuple[int, int] = (128, 128)) -> tuple[np.ndarray, np.ndarray]:
    """(float8 e4m3 codes, float32 scales) of ``w [out, in]``: each block's largest magnitude maps to FP8's 448."""
    rows, cols = w.shape
    nb = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    padded = np.zeros((nb[0] * block[0], nb[1] * block[1]), np.float32)
    padded[:rows, :cols] = w
    amax = np.abs(padded.reshape(nb[0], block[0], nb[1], block[1])).max(axis=(1, 3))
    scale = np.where(amax > 0, amax / FP8_MAX, 1.0).astype(np.float32)
    full = np.repeat(np.repeat(scale, block[0], axis=0), block[1], axis=1)[:rows, :cols]
    return (w / full).astype(ml_dtypes.float8_e4m3fn), scale


# INT4 in groups, packed eight a word -----------------------------------------------------------------
def decode_int4_packed(packed: np.ndarray, scale: np.ndarray, shape) -> np.ndarray:
    """``packed [out, ceil(in/8)]`` int32 and ``scale [out, in/group]`` to float32 ``[out, in]``."""
    rows, cols = (int(d) for d in shape)
    words = packed.astype(np.int64) & 0xFFFFFFFF  # as unsigned bits
    shifts = 4 * np.arange(INT4_PER_WORD)
    q = ((words[..., None] >> shifts) & 0xF).reshape(rows, -1)[:, :cols] - INT4_ZERO
    group = cols // scale.shape[-1]
    return q.astype(np.float32) * np.repeat(scale.astype(np.float32), group, axis=-1)


def encode_int4_packed(w: np.ndarray, group: int = 32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packed int32, float32 scales, shape) of ``w [out, in]``: symmetric, each group's largest magnitude to 7."""
    rows, cols = w.shape
    if cols % group:
        raise ValueError(f"an INT4 group of {group} does not divide the input width {cols}")
    g = w.reshape(rows, cols // group, group).astype(np.float32)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    scale = np.where(amax > 0, amax / 7.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(g / scale), -8, 7).astype(np.int64).reshape(rows, cols) + INT4_ZERO
    pad = -cols % INT4_PER_WORD
    q = np.pad(q, ((0, 0), (0, pad))).reshape(rows, -1, INT4_PER_WORD)
    words = np.sum(q << (4 * np.arange(INT4_PER_WORD)), axis=-1)
    packed = words.astype(np.uint32).view(np.int32)
    return packed, scale[..., 0], np.array([rows, cols], np.int32)


# MXFP4 -----------------------------------------------------------------------------------------------
def decode_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """``blocks [..., G, 16]`` uint8 and ``scales [..., G]`` uint8 to float32 ``[..., 32 G]`` (not transposed)."""
    vals = FP4_VALUES[nibbles(blocks, -1)]  # [..., G, 32]
    return (vals * e8m0_value(scales)[..., None]).reshape(*blocks.shape[:-2], -1)


def encode_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(blocks, scales) of ``w [..., cols]`` (cols a multiple of 32): each block's exponent the smallest power of two
    that brings its largest magnitude within FP4's 6, each value rounded to the nearest FP4 value."""
    *lead, cols = w.shape
    if cols % MX_BLOCK:
        raise ValueError(f"MXFP4 blocks of {MX_BLOCK} do not divide the width {cols}")
    g = w.reshape(*lead, cols // MX_BLOCK, MX_BLOCK).astype(np.float32)
    amax = np.abs(g).max(axis=-1, keepdims=True)
    exp = np.where(amax > 0, np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)), 0).astype(np.int32)
    exp = np.clip(exp, -127, 127)
    scaled = g / np.ldexp(np.float32(1), exp)
    codes = np.abs(scaled[..., None] - FP4_VALUES).argmin(axis=-1).astype(np.uint8)
    return pack_nibbles(codes, -1), np.ascontiguousarray(exp[..., 0] + 127, dtype=np.uint8)


# A checkpoint seen through its format --------------------------------------------------------------
@dataclass(frozen=True)
class CheckpointFormat:
    """What a checkpoint's ``quantization_config`` says: the method, and the FP8 block or the INT4 group."""

    method: str
    block: tuple[int, int] = (128, 128)
    group: int = 32

    @classmethod
    def from_config(cls, q: dict, where: str) -> CheckpointFormat:
        method = q.get("quant_method")
        if method == FP8:
            if q.get("fmt", "e4m3") != "e4m3":
                raise ValueError(f"{where}: FP8 format {q.get('fmt')!r}; mk reads e4m3 weights only")
            block = q.get("weight_block_size") or [128, 128]
            return cls(FP8, block=(int(block[0]), int(block[1])))
        if method == INT4:
            if q.get("format") != "pack-quantized":
                raise ValueError(f"{where}: compressed-tensors format {q.get('format')!r}; mk reads pack-quantized")
            weights = [g.get("weights") or {} for g in (q.get("config_groups") or {}).values()]
            if not weights or any(w.get("num_bits") != 4 or not w.get("symmetric", True) for w in weights):
                raise ValueError(f"{where}: mk reads symmetric 4-bit compressed-tensors groups only, got {weights}")
            return cls(INT4, group=int(weights[0].get("group_size") or 32))
        if method == MXFP4:
            return cls(MXFP4)
        raise ValueError(f"{where}: quant_method {method!r} is not one mk reads ({', '.join(FORMATS)})")


class DecodedCheckpoint:
    """A checkpoint (``info`` name -> (shape, dtype), ``read(name)``) in one of the formats above, shown under its
    float checkpoint's names: each encoded tensor appears once, as float32 of its float shape, and its parts
    (scales, blocks, packed words) are hidden; a tensor stored in float passes through."""

    def __init__(self, ckpt, fmt: CheckpointFormat):
        self._ckpt, self.format = ckpt, fmt
        self._parts: dict[str, tuple[str, ...]] = {}
        self.info: dict[str, tuple[tuple[int, ...], str]] = {}
        hidden: set[str] = set()
        for name, (shape, dtype) in ckpt.info.items():
            decoded = self._decoded(name, shape, dtype)
            if decoded is not None:
                logical, parts, shape_out = decoded
                self._parts[logical] = parts
                self.info[logical] = (shape_out, "F32")
                hidden.update(parts)
        for name, entry in ckpt.info.items():
            if name not in hidden and name not in self.info:
                self.info[name] = entry

    def _decoded(self, name: str, shape, dtype) -> tuple[str, tuple[str, ...], tuple[int, ...]] | None:
        info = self._ckpt.info
        if self.format.method == FP8 and dtype == "F8_E4M3":
            scale = name + "_scale_inv"
            if scale not in info:
                raise ValueError(f"{name} is FP8 but the checkpoint has no {scale} (its block scales)")
            return name, (name, scale), tuple(shape)
        if self.format.method == INT4 and name.endswith(".weight_packed"):
            base = name[: -len("_packed")]
            parts = (name, base + "_scale", base + "_shape")
            missing = [p for p in parts[1:] if p not in info]
            if missing:
                raise ValueError(f"{name} is packed INT4 but the checkpoint has no {', '.join(missing)}")
            return base, parts, tuple(int(d) for d in self._ckpt.read(parts[2]))
        if self.format.method == MXFP4 and name.endswith("_blocks"):
            base = name[: -len("_blocks")]
            if base + "_scales" not in info:
                raise ValueError(f"{name} is MXFP4 but the checkpoint has no {base}_scales")
            *lead, rows, groups, _ = shape
            return base, (name, base + "_scales"), (*lead, groups * MX_BLOCK, rows)
        return None

    def encoded(self, name: str) -> bool:
        """Whether tensor ``name`` (a float checkpoint's name) is stored in the format."""
        return name in self._parts

    def read_codes(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """An encoded tensor's codes and scales as stored, turned to the float tensor's orientation (its input axis
        where the float one has it): FP8 ``[..., out, in]`` and its block scales; INT4 the packed words' bytes,
        two codes a byte, ``[out, in / 2]`` and ``[out, in / group]``; MXFP4 ``[..., in / 2, rows]`` and
        ``[..., in / 32, rows]`` (the float tensor is the decoded one transposed)."""
        a = [self._ckpt.read(p) for p in self._parts[name]]
        if self.format.method == FP8:
            return a[0], a[1]
        if self.format.method == INT4:
            return np.ascontiguousarray(a[0], "<i4").view(np.uint8), a[1]
        blocks = a[0].reshape(*a[0].shape[:-2], -1)
        return np.swapaxes(blocks, -1, -2), np.swapaxes(a[1], -1, -2)

    def read(self, name: str) -> np.ndarray:
        parts = self._parts.get(name)
        if parts is None:
            return self._ckpt.read(name)
        a = [self._ckpt.read(p) for p in parts]
        if self.format.method == FP8:
            return decode_fp8_block(a[0], a[1], self.format.block)
        if self.format.method == INT4:
            return decode_int4_packed(a[0], a[1], a[2])
        return np.swapaxes(decode_mxfp4(a[0], a[1]), -1, -2)
