"""Ahead-of-time compilation of the decode step for real TPUs (v5e, v6e) on this CPU machine, with
libtpu's own Mosaic compiler: layouts, primitives without a TPU lowering and VMEM overflow fail
here, not on a user's TPU. Needs libtpu (requirements-tpu.txt); skipped without it."""

import os

import jax.numpy as jnp
import pytest

from mk.chips import get_chip
from mk.config import GEMMA4_26B_A4B, GEMMA4_31B, TINY_DENSE, TINY_MOE
from mk.megakernel.kernel import compile_for_tpu
from mk.plan import layers_in_hbm
from mk.profiling import count_kernels

pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install -r requirements-tpu.txt)")

CHIPS = ("tpu-v5e", "tpu-v6e")
# Full-size steps: the first full layer is layer 5, so 6 layers hold 5 sliding + 1 full. Compiling as
# many layers as a chip's HBM holds (mk.plan.layers_in_hbm: 8-29) takes minutes per model on 2 cores;
# set MK_AOT_HBM_LAYERS=1 to do that.
HBM_LAYERS = os.environ.get("MK_AOT_HBM_LAYERS") == "1"


def _check(plan, compiled, chip):
    kc = count_kernels(compiled.as_text())
    assert kc.by_opcode.get("custom-call") == 1, kc.by_opcode  # the whole step is one Mosaic kernel
    # Besides it, XLA's memory-space assignment may only move the two tiny int32 operands (token ids,
    # position) into VMEM/SMEM before the launch: no compute of the step runs outside the kernel.
    assert set(kc.by_opcode) <= {"custom-call", "copy", "copy-start"}, kc.by_opcode
    assert kc.by_opcode.get("copy", 0) + kc.by_opcode.get("copy-start", 0) <= 2, kc.by_opcode
    assert plan.vmem_bytes <= get_chip(chip).vmem_bytes
    return kc


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("cfg,batch", [(TINY_DENSE, 1), (TINY_MOE, 4)], ids=lambda x: getattr(x, "name", str(x)))
def test_tiny_step_compiles_for_tpu(cfg, batch, chip):
    plan, compiled = compile_for_tpu(cfg, chip, batch, 64)
    _check(plan, compiled, chip)


@pytest.mark.slow
@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize("cfg", [GEMMA4_26B_A4B, GEMMA4_31B], ids=lambda c: c.name)
def test_full_size_step_compiles_for_tpu(cfg, chip):
    n = layers_in_hbm(cfg, get_chip(chip).hbm_bytes, 1, 2048) if HBM_LAYERS else 6
    cut = cfg.truncated(n)
    assert cut.sliding_layers and cut.full_layers
    plan, compiled = compile_for_tpu(cut, chip, 1, 2048, jnp.bfloat16, jnp.bfloat16)
    _check(plan, compiled, chip)


def test_vmem_overflow_fails_in_the_compiler_too():
    """The plan's VMEM budget is the compiler's: a step whose weight tiles cannot fit is refused by
    libtpu's compiler itself when the plan's own check is bypassed."""
    from mk.tpu import probe_vmem
    assert probe_vmem("tpu-v5e") == get_chip("tpu-v5e").vmem_bytes
    assert probe_vmem("tpu-v6e") == get_chip("tpu-v6e").vmem_bytes
