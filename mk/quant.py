"""INT8 weights: symmetric, one scale per channel (and per expert), made from a BF16 or F32 tree.

A quantized matrix ``path`` ([..., in, out], as in mk.params) is stored as ``int8`` codes in ``params[path]``
and its scales as ``float32`` in ``params[scale_path(path)]``, one per output channel, shape ``[..., out]``
(``[out]`` for a layer's matrix, ``[E, out]`` for an expert tensor), except a down projection's: one per input
channel, ``[..., in]`` (mk.params.INPUT_SCALED: a chip that holds some of its rows then reads only their
scales). Codes are ``round(w / s)`` clipped to [-127, 127] with ``s = max|w| / 127`` over the other axis (1 where
a channel is all zeros), so a weight comes back as ``codes * s``.

Dequantizing is the same everywhere: ``(codes as float32) * scale``, then rounded to the compute dtype.
The reference dequantizes the whole tree that way (:func:`dequantize`) and the megakernel each weight tile
in VMEM the same way, so both multiply by identical weights and the kernel is held to the reference as
tightly as in BF16 or F32.

Schemes: ``int8-experts`` quantizes the routed experts only; ``int8`` every matrix but the embedding (the
tied head) and the vectors (norms, scales).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from . import format_trees
from .config import ModelConfig
from .params import SCALE_SUFFIX, SCHEMES, check_scheme, param_specs, quantized_paths, scale_path, scales_inputs

QMAX = 127


def _broadcast(scale, per_input: bool):
    """Scales [..., in] or [..., out] as they multiply a matrix [..., in, out]."""
    return scale[..., :, None] if per_input else scale[..., None, :]


def quantize_matrix(w, per_input: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """INT8 codes and float32 scales of ``w`` [..., in, out], one per output channel (or per input channel with
    ``per_input``): symmetric, round to nearest."""
    w = np.asarray(w, np.float32)
    amax = np.max(np.abs(w), axis=-1 if per_input else -2)
    scale = np.where(amax > 0, amax / QMAX, 1.0).astype(np.float32)
    codes = np.clip(np.rint(w / _broadcast(scale, per_input)), -QMAX, QMAX).astype(np.int8)
    return codes, scale


def quantize(params: dict, cfg: ModelConfig, scheme: str) -> dict:
    """``params`` with the matrices of ``scheme`` as INT8 codes plus their scales (a new dict; the others shared).
    Already-quantized input is refused: quantize the float tree."""
    out = dict(params)
    for path in quantized_paths(cfg, scheme):
        if params[path].dtype == jnp.int8:
            raise ValueError(f"{path} is already INT8: quantize a BF16 or F32 parameter tree")
        codes, scale = quantize_matrix(params[path], scales_inputs(path))
        out[path], out[scale_path(path)] = jnp.asarray(codes), jnp.asarray(scale)
    return out


def scheme_of(params: dict, cfg: ModelConfig) -> str:
    """Which scheme a parameter tree is quantized with (``none`` for a float tree; a shipped format's name for an
    mk.format_trees tree); a tree that matches no scheme (scales missing, or INT8 where no scheme puts it) is refused
    with what is wrong."""
    if (fmt := format_trees.format_of(params)) is not None:
        return fmt
    int8 = {s.path for s in param_specs(cfg) if s.path in params and params[s.path].dtype == jnp.int8}
    for scheme in SCHEMES:
        if int8 == set(quantized_paths(cfg, scheme)):
            missing = [scale_path(p) for p in sorted(int8) if scale_path(p) not in params]
            if missing:
                raise ValueError(f"INT8 matrices without their scales: {', '.join(missing[:3])}")
            return scheme
    raise ValueError(
        f"the INT8 matrices ({len(int8)}) match no quantization scheme ({', '.join(SCHEMES[1:])}); "
        "quantize the float tree with mk.quant.quantize"
    )


def dequantize_matrix(codes, scale, dtype, per_input: bool = False):
    """``codes * scale`` in float32, rounded to ``dtype``: what the kernel does to each INT8 weight tile."""
    return (jnp.asarray(codes).astype(jnp.float32) * _broadcast(jnp.asarray(scale), per_input)).astype(dtype)


def dequantize(params: dict, cfg: ModelConfig, dtype=None) -> dict:
    """The float tree the quantized one stands for (every INT8 matrix dequantized to ``dtype``, by default the
    embedding's, scales dropped): the weights the reference and the kernel both multiply by. A tree in a shipped
    format (mk.format_trees) is decoded by its format."""
    if format_trees.format_of(params) is not None:
        return format_trees.dequantize(params, cfg, dtype)
    scheme = scheme_of(params, cfg)
    dtype = dtype or params["embed"].dtype
    out = {k: v for k, v in params.items() if not k.endswith(SCALE_SUFFIX)}
    for path in quantized_paths(cfg, scheme):
        out[path] = dequantize_matrix(params[path], params[scale_path(path)], dtype, scales_inputs(path))
    return out


def quantized_as(params: dict, cfg: ModelConfig, scheme: str | None = None) -> dict:
    """``params`` under ``scheme``, as a loader hands them to the engines: a float tree is quantized with
    ``scheme`` (None: ``none``, left as it is; a shipped format's name: mk.format_trees); an already quantized tree (a
    quantized checkpoint) is used as it is when ``scheme`` is None or its own scheme, and refused otherwise (it
    cannot be re-quantized)."""
    have = scheme_of(params, cfg)
    if have != "none":
        if scheme not in (None, have):
            raise ValueError(
                f"the weights are already quantized as {have!r} (a quantized checkpoint is used as it is); "
                f"quantization {scheme!r} does not match: leave it out or ask for {have!r}"
            )
        return params
    if scheme in format_trees.FORMAT_SCHEMES:
        return format_trees.quantize(params, cfg, scheme)
    scheme = check_scheme(scheme or "none")
    return params if scheme == "none" else quantize(params, cfg, scheme)
