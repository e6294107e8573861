"""What the norms' time on the 26B-A4B chip-of-8 stand-in is made of, on a TPU v5e: three builds of kernel revision 4
timed interleaved in one loop, one copy of the weights, context 1024, one and eight users, random bf16 weights (seed
0), device time (20 steps back to back) beside the host's, medians with 95% intervals (mk.measure.harness).

- ``base``: revision 4 as it is.
- ``shared-rms``: the attention residual's three norms of the same x (the FFN's input norm, Gemma 4's second FFN
  norm and the router's) take one mean square and one rsqrt between them: the same operations on the same values,
  so its logits must equal base's bit for bit (checked, and written in the rows).
- ``static-vectors`` (a probe, not a kernel: its logits are wrong): inside the loop over layers each layer's norm
  weights and scales are picked from the vector table by a select and a sublane sum over an (8, W) tile
  (``EmitContext.layer_vec``, the layer index traced); here layer 0's row is read at a static place instead, so its
  step less base's is what those picks cost.
- ``no-head-norms`` (a probe): the q, k and v heads' norms inside the attention's q/k/v op (QKVNormRope: the
  attention's component, not the norms', in the timing model) passed through, as the norms knock-out passes them.

Run on 2026-12-06 as ``python data/measured/tpu_logs/2026-12-06-layer-vectors.py OUT.csv`` from the repository's
root (the first three variants; output 2026-12-06-layer-vectors.csv and .txt beside this file), then as ``OUT.csv
stand-in-1 base,no-head-norms`` (one user; 2026-12-06-head-norms.csv and .txt). ``tiny`` as the second argument runs
the same on the CPU (tiny-moe, one chip, interpret mode) to check the script.
"""

import contextlib
import sys
import time
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

import mk.megakernel.attention as attention
import mk.megakernel.dense as dense
import mk.megakernel.emit as emit
import mk.megakernel.kernel as kernel
from mk.measure.harness import TimedStep, provenance, spec_speed_of_light, time_engines
from mk.measure.on_chip import SLICE, Case, CaseEngines, Cell
from mk.megakernel import make_step
from mk.plan.records import AttentionResidual
from mk.progress import Log
from mk.sol import bytes_per_token

STEPS, BUDGET_S, MIN_ROUNDS = 20, 15.0, 5


def shared_rms_residual(k, op):
    """dense.emit_attention_residual with the three norms of x sharing one mean square and rsqrt."""
    a, layout, i = k.scratch.acts, k.layout, op.layer
    norm = partial(dense.rms, eps=layout.rms_eps, on=k.norms_on, n=k.share.hidden_size)
    x = a["x"][...]
    if op.attention_on:
        out = a["attn_out"][...]
        if layout.attention_bias:
            out = out + k.layer_vec(i, "o_bias")
        x = x + (norm(out, w=k.layer_vec(i, "post_attn_norm")) if layout.sandwich_norms else out)
        a["x"][...] = x
    y = norm(x)  # x * rsqrt(mean square + eps), as each norm below computes it
    a["xn"][...] = y * k.layer_vec(i, "pre_ffn_norm") if k.norms_on else y
    if layout.is_moe and layout.router == "gemma4":
        a["x2"][...] = y * k.layer_vec(i, "pre_ffn_norm_2") if k.norms_on else y
        a["rin"][...] = y * k.layer_vec(i, "router_scale") * jnp.float32(k.share.hidden_size**-0.5)


original_layer_vec = kernel.EmitContext.layer_vec


def static_layer_vec(self, layer, name, width=None):
    """A probe: layer 0's vector at its static row, whatever the (traced) layer."""
    if isinstance(layer, int):
        return original_layer_vec(self, layer, name, width)
    return self.vec(f"layers.0.{name}", width or self.layout.hidden_size)


original_head_rms = attention.head_rms


def no_head_rms(x, eps, weight, on, n, hd):
    """A probe: a head's norm passed through, as with the norms knocked out."""
    return original_head_rms(x, eps, weight, False, n, hd)


@contextlib.contextmanager
def variant(name: str):
    """The kernel's code as ``name`` builds it, while a step is compiled."""
    saved = emit.EMIT[AttentionResidual], kernel.EmitContext.layer_vec, attention.head_rms
    if name == "shared-rms":
        emit.EMIT[AttentionResidual] = shared_rms_residual
    elif name == "static-vectors":
        kernel.EmitContext.layer_vec = static_layer_vec
    elif name == "no-head-norms":
        attention.head_rms = no_head_rms
    try:
        yield
    finally:
        emit.EMIT[AttentionResidual], kernel.EmitContext.layer_vec, attention.head_rms = saved


def main(out: str, which: str = "stand-in", variants: str = "base,shared-rms,static-vectors") -> None:
    log, device, rows = Log(False), jax.devices()[0], []
    VARIANTS = tuple(variants.split(","))
    if which == "tiny":
        spec, cells = dict(model="tiny-moe", layers=None), (Cell(64, 1),)
    else:
        spec = dict(model="gemma4-26b-a4b", layers=None, setup="workbook")
        cells = (Cell(1024, 1),) if which == "stand-in-1" else (Cell(1024, 1), Cell(1024, 8))
    t = time.perf_counter()
    engines = {v: CaseEngines(Case(**spec), device, 0, log) for v in VARIANTS}
    engines["base"].build("megakernel")
    for v in VARIANTS[1:]:  # one copy of the weights: the variants differ only in code emitted, not in packing
        e = engines[v]
        e.weights["megakernel"] = engines["base"].weights["megakernel"]
        e.steps["megakernel"] = make_step(e.cfg, e.setup)
    log(f"engines built in {time.perf_counter() - t:.0f} s")
    base = engines["base"]
    chips = SLICE if base.setup.loopback else 1
    for cell in cells:
        t = time.perf_counter()
        calls = {}
        for v in VARIANTS:
            with variant(v):
                calls[v] = engines[v].call("megakernel", cell)[0]  # compiled (and run twice) under its code
        logits = {v: np.asarray(jax.device_get(calls[v]()), np.float32) for v in VARIANTS}
        log(f"{cell}: {len(calls)} steps compiled in {time.perf_counter() - t:.0f} s")
        per_token = bytes_per_token(base.cfg, cell.context, cell.batch, "bf16").total
        sol = spec_speed_of_light(per_token, device, chips, "tpu-v5e" if device.platform != "tpu" else None)
        run = dict(provenance(device), model=base.cfg.name, dtype="bf16", context=cell.context, batch=cell.batch,
                   weights="random (seed 0)")  # fmt: skip
        timed = [TimedStep(v, calls[v], engine="megakernel") for v in VARIANTS]
        _, got = time_engines(timed, sol, run, BUDGET_S, min_rounds=MIN_ROUNDS, steps_back_to_back=STEPS, log=log)
        for v, r in zip(VARIANTS, got):
            diff = float(np.max(np.abs(logits[v] - logits["base"])))
            rows.append(dict(r, setup=base.case.setup_label, variant=v, max_logit_diff_vs_base=diff,
                             logits_equal_base=bool(np.array_equal(logits[v], logits["base"]))))  # fmt: skip
            log(f"{cell} {v}: device {r['device_step_ms']:.4f} ms [{r['device_step_low_ms']:.4f}, "
                f"{r['device_step_high_ms']:.4f}], host {r['step_ms']:.3f} ms, logits vs base {diff:.3g}")  # fmt: skip
        pd.DataFrame(rows).to_csv(out, index=False)
    for e in engines.values():
        e.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
