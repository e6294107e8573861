"""One chip standing in for a slice (mk.kernel_setup.KernelSetup.loopback): chip 0's step of a chip-of-8 setup run on
one device, each cross-chip exchange a local copy of the bytes a sender would send, into the same buffer on the same
semaphore. Its plan is chip 0's of the real slice; it runs race-free in the interpreter and compiles with libtpu
to one Mosaic kernel without a barrier; what it receives is its own partials, so its values are not a slice's."""

import jax.numpy as jnp
import numpy as np
import pytest

from mk.config import FULL, TINY_MOE
from mk.kernel_setup import WORKBOOK_KERNEL, WRITE_UP_KERNEL
from mk.megakernel import make_step
from mk.plan import build_plan
from mk.reference import init_cache
from mk.tpu import races_detected, reset_interpreter
from mk.weights import random_params

# eight query heads (one a chip) on 2 sliding and 1 full KV heads, 8 experts split over the chips; one full layer
CFG8 = TINY_MOE.replace(name="tiny-moe-8h-1", num_heads=8, sliding_kv_heads=2, full_kv_heads=1, layer_types=(FULL,))


@pytest.mark.parametrize("setup", [WRITE_UP_KERNEL, WORKBOOK_KERNEL], ids=["write-up", "workbook"])
def test_one_chip_runs_a_chip_of_eight_step_race_free(setup):
    """The write-up's kernel (all to all) and the workbook's (reduce-scatter, attention split by positions: members
    exchange softmax states): every exchange's local copies land, none overlaps a read or write (races checked)."""
    reset_interpreter()
    alone = make_step(CFG8, setup.replace(loopback=True), detect_races=True)
    assert not alone.sharded and alone.setup.chips == 8 and alone.chip is None  # one CPU device, interpreted
    cache = init_cache(CFG8, 2, 256, jnp.float32, multiple=16)  # 8 chips sharing a KV head: 2 blocks each
    out = alone.run(alone.packed(random_params(CFG8, 3)), CFG8, alone.adopt_cache(cache), jnp.asarray([7, 11]), 9)
    assert not races_detected()
    assert np.isfinite(np.asarray(out.logits)).all()
    assert out.logits.shape[1] < CFG8.vocab_size  # chip 0's vocabulary rows only


def test_the_stand_in_plans_chip_zeros_step_of_the_slice():
    """Same weight bytes, cache, ops and exchanges as chip 0 of the real slice: the plan is the real one."""
    for setup in (WRITE_UP_KERNEL, WORKBOOK_KERNEL):
        real, alone = (build_plan(CFG8, 2, 256, setup=s) for s in (setup, setup.replace(loopback=True)))
        assert alone.code_fingerprint == real.code_fingerprint
        assert alone.weight_bytes == real.weight_bytes and alone.items == real.items


def test_a_stand_in_needs_a_slice_of_one_host():
    with pytest.raises(ValueError, match="loopback stands one chip in"):
        WORKBOOK_KERNEL.replace(chips=1, loopback=True)
    with pytest.raises(ValueError, match="loopback stands one chip in"):
        WORKBOOK_KERNEL.replace(attention_split="users", loopback=True)


def test_the_stand_in_compiles_for_one_v5e_as_one_kernel_without_a_barrier():
    """libtpu compiles chip 0's step of the write-up's 8-chip kernel for a single chip: one Mosaic call, no collective
    (the kernel neither signals a barrier nor names a peer)."""
    pytest.importorskip("libtpu")
    from mk.megakernel.aot import compile_plan

    plan = build_plan(
        CFG8, 2, 256, weight_dtype="bfloat16", kv_dtype="bfloat16", setup=WRITE_UP_KERNEL.replace(loopback=True)
    )
    text = compile_plan(plan, "tpu-v5e").as_text()
    assert text.count('custom_call_target="tpu_custom_call"') == 1
    assert "all-reduce" not in text and "collective" not in text.replace("collective_id", "")


def test_the_model_walks_a_stand_in_with_its_exchanges_local_copies():
    """A loopback setup's prediction (mk.timing.pace.loopback) is chip 0's step with no link: each exchange's rounds
    one copy's fixed time each and its sent bytes at the HBM read rate, walked in the timeline where the slice's links
    are; faster than the slice's step, slower than chip 0 with its exchanges free."""
    from dataclasses import replace

    from mk.chips import get_chip
    from mk.plan import step_ends
    from mk.timing import predict
    from mk.timing.bandwidth import copy_latency, read_rate
    from mk.timing.pace import megakernel_costs
    from mk.timing.work import named_plan

    real, alone = (predict(CFG8, "tpu-v5e-8", 256, 1, "megakernel", setup=s)
                   for s in (WORKBOOK_KERNEL, WORKBOOK_KERNEL.replace(loopback=True)))  # fmt: skip
    assert alone.pacing.ici_s == 0 < real.pacing.ici_s and alone.step_s < real.step_s
    plan, slice_plan = (named_plan(CFG8, "tpu-v5e-8", 256, 1, s) for s in (WORKBOOK_KERNEL.replace(loopback=True),
                                                                              WORKBOOK_KERNEL))  # fmt: skip
    assert plan.items == slice_plan.items  # the same step, only its links local
    chip = get_chip("tpu-v5e-8")
    costs = megakernel_costs(plan, chip)
    local = replace(chip, ici_bandwidth=read_rate(chip).per_chip)
    (experts,) = plan.pacing_experts  # one user: its top-k, every layer
    every = [{i: experts for i in range(CFG8.num_layers)}]
    copies, free = (step_ends(plan, local, every, **dict(costs, ici_latency_s=s))[0]
                    for s in (copy_latency(chip).seconds, 0.0))  # fmt: skip
    assert alone.step_s == pytest.approx(copies) and free < copies
