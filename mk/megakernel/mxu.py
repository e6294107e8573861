"""The kernel's matrix products, with one precision rule: every dot says the precision its data type means, so
none depends on the caller's ``jax.default_matmul_precision`` (which Pallas reads when it traces a dot).

- **f32 operands**: ``HIGHEST``. An f32 step means f32 products; at ``DEFAULT`` Mosaic runs an f32 dot as one bf16
  pass, rounding both operands to 8 bits of mantissa (what XLA does for the reference at its own default).
- **16-bit and narrower operands** (bf16 weights and caches, INT8 and FP8 codes widened to bf16): ``DEFAULT``. Their
  products are exact in one pass with f32 accumulation; ``HIGHEST`` on them does not lower ("Bad lhs type": Mosaic's
  fp32 contraction wants f32 operands).

The data type that decides is the one the step was built for (its weights' for a projection, its cache's for
attention), passed as ``dtype``: an f32 operand of a 16-bit product (attention's query and probabilities against a bf16
step's upcast K and V tiles) is rounded to that type first. A TPU's one pass rounds it anyway; rounding it here makes
Pallas's interpreter on a CPU, whose default pass is f32, compute what the chip does (measured: Qwen3-MoE's bf16
parity on a v5e took a routing jump the interpreter did not, until the interpreter rounded the query too).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

ROWS_BY_COLS = (((1,), (0,)), ((), ()))  # x @ w
ROWS_BY_ROWS = (((1,), (1,)), ((), ()))  # x @ w.T: both contracted on lanes


def precision_for(dtype) -> jax.lax.Precision:
    """The precision a product in ``dtype`` means (the module's rule)."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else jax.lax.Precision.DEFAULT


def dot(x, w, dims=ROWS_BY_COLS, dtype=None):
    """``x`` times ``w`` contracted as ``dims`` (ROWS_BY_COLS or ROWS_BY_ROWS), accumulated in f32, at the precision
    ``dtype`` means (default: ``w``'s), an f32 operand of a narrower product rounded to it first (the module's rule)."""
    dtype = jnp.dtype(w.dtype if dtype is None else dtype)
    if dtype != jnp.float32:
        x, w = _as_fed(x, dtype), _as_fed(w, dtype)
    return jax.lax.dot_general(x, w, dims, precision=precision_for(dtype), preferred_element_type=jnp.float32)


def _as_fed(x, dtype):
    """An f32 operand rounded to ``dtype`` and kept f32 (the operand Mosaic lowers stays the one it always took)."""
    return x.astype(dtype).astype(jnp.float32) if x.dtype == jnp.float32 else x
