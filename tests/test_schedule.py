"""The TPU compiler's schedule as an instrument (mk.measure.schedule): bundles read from libtpu's dump, each loop body
counted as many times as its loop runs."""

import importlib.util

import pytest

from mk.measure.schedule import find_loops, issued_bundles, parse_bundles

# libtpu's format, cut down: two straight bundles, a loop (bound 5) holding a loop (bound 4), a bundle after. A back
# branch carries no '>' in the dump and is followed by its delay slot, which does.
TEXT = """= control target key start
LB: loop body
= control target key end

     0   :  { %1 = vsyncpa [#allocation3], 0 }
   0x1   :  { %2 = dma.hbm_to_vmem [thread:$0]  /*hbm=*/%s1,
base_bounds: (1, 1) */ }
   0x2 LB: > { %s3 = sadd.s32 1, %s4 }
   0x3 LB: >> { %v5 = vld [vmem:[#allocation2] sm:$0xff] }
   0x4   : >> { %p6 = scmp.ge.s32.totalorder %s7, 4 /* loop exit test */ }
   0x5   :  { %8 = sbr.rel (!%p6) target = $region9 }
   0x6   : >> { %v9 = vadd.f32 %v5, %v5 }
   0x7   : > { %p10 = scmp.ge.s32.totalorder %s3, 5 /* loop exit test */ }
   0x8   :  { %11 = sbr.rel (!%p10) target = $region4 }
   0x9   : > { %v12 = vmov %v9 }
   0xa   :  { %13 = vsyncpa [#allocation3], 1 }
"""


def test_bundles_and_nested_loops_are_read_and_counted():
    bundles = parse_bundles(TEXT)
    assert [b.address for b in bundles] == list(range(11)) and bundles[1].text.count("\n") == 1
    (outer,) = find_loops(bundles)
    inner = outer.inner[0]
    assert (outer.start, outer.end, outer.trips, inner.start, inner.end, inner.trips) == (2, 9, 5, 3, 6, 4)
    # the outer body: 0x2, 0x7-0x9 and the inner loop (0x3-0x6) 4 times; 0x0, 0x1 and 0xa once
    assert issued_bundles(bundles) == 3 + 5 * (4 + 4 * 4)
    assert issued_bundles(bundles, {0x3: 1}) == 3 + 5 * (4 + 4)  # a trip count given overrides the bound


def test_a_loop_without_a_constant_bound_needs_its_count():
    text = TEXT.replace("%s7, 4 /*", "%s7, %s8 /*")
    with pytest.raises(ValueError, match="at bundle 0x3 has no constant bound"):
        issued_bundles(parse_bundles(text))
    with pytest.raises(ValueError, match="no bundles found"):
        parse_bundles("HloModule x\n")


def test_without_libtpu_one_line_names_it(monkeypatch):
    import importlib.util as iu

    from mk.measure.schedule import final_bundles

    real = iu.find_spec
    monkeypatch.setattr(iu, "find_spec", lambda name, *a: None if name == "libtpu" else real(name, *a))
    with pytest.raises(RuntimeError, match="needs libtpu"):
        final_bundles("pass", "k")


LOOP_KERNEL = """
import jax, jax.numpy as jnp
from jax.experimental import pallas as pl
from mk.tpu import aot_compile

def kernel(x_ref, o_ref):
    o_ref[...] = jax.lax.fori_loop(0, {n}, lambda i, acc: acc * 1.0001 + x_ref[...], jnp.zeros((8, 128), jnp.float32))

f = lambda x: pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32), name="loop_of_{n}")(x)
aot_compile(f, "tpu-v5e", jax.ShapeDtypeStruct((8, 128), jnp.float32))
"""


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="the compiler's schedule needs libtpu")
def test_a_loops_bundles_count_once_per_trip():
    """A Pallas kernel whose loop runs N times, compiled by libtpu for a v5e: the bundles one call issues grow by the
    loop body's bundles for each trip, and the loop's bound read off its exit test is N."""
    from mk.measure.schedule import final_bundles

    counted = {}
    for n in (37, 74):
        bundles = parse_bundles(final_bundles(LOOP_KERNEL.format(n=n), f"loop_of_{n}"))
        (loop,) = find_loops(bundles)
        assert loop.trips == n and not loop.inner
        counted[n] = (issued_bundles(bundles), loop.bundles, len(bundles))
    (a, body, length), (b, body2, length2) = counted[37], counted[74]
    assert body == body2 and length == length2  # the same code, another bound
    assert b - a == 37 * body and a == length - body + 37 * body
