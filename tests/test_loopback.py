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


def test_the_model_gives_a_stand_in_its_local_copies_in_place_of_the_links():
    """mk.timing.Pace.stand_in_s: chip 0 exchanging with itself pays each round one copy's fixed time and its sent bytes
    at the HBM rate, not the links' latency and bandwidth (mk.analysis.on_tpu.modelled_step of a stand-in's row)."""
    from mk.chips import get_chip
    from mk.timing import predict
    from mk.timing.bandwidth import copy_latency, read_rate

    p = predict(CFG8, "tpu-v5e-8", 256, 2, "megakernel", setup=WORKBOOK_KERNEL)
    plan = build_plan(CFG8, 2, 256, setup=WORKBOOK_KERNEL)
    cross = [op for op in plan.ops if op.sent_bytes]
    chip = get_chip("tpu-v5e-8")
    rounds, sent = sum(op.rounds for op in cross), sum(op.sent_bytes for op in cross)
    assert rounds > len(cross) > 0  # reduce-scatter, then all-gather: two rounds an all-reduce
    want = rounds * copy_latency(chip).seconds + sent / read_rate(chip).per_chip
    assert p.pacing.loopback_s == pytest.approx(want) and 0 < p.pacing.loopback_s < p.pacing.ici_s
    assert p.pacing.stand_in_s == pytest.approx(p.step_s - p.pacing.ici_s + want)
