"""The TPU compiler's schedule as an instrument (mk.measure.bundles): bundles read from libtpu's dump, each loop body
counted as many times as its loop runs."""

import importlib.util

import pytest

from mk.measure.bundles import find_loops, find_skips, issued, issued_bundles, parse_bundles, scope_stacks

# libtpu's format, cut down: two straight bundles; a loop (bound 5) holding a loop (bound 4) and a stretch a forward
# branch skips; a bundle after. A branch is followed by four delay slots that issue either way; its target is the bundle
# that starts the region it names.
TEXT = """= control target key start
LB: loop body
PF: predicated region fallthrough
= control target key end

     0   :  { %1 = vsyncpa [#allocation3], 0 }
   0x1   :  { %2 = dma.hbm_to_vmem [thread:$0]  /*hbm=*/%s1,
base_bounds: (1, 1) */ }
   0x2 LB: > { %s3 = sadd.s32 1, %s4 } /* Start region 4 */
   0x3 LB: >> { %v5 = vld [vmem:[#allocation2] sm:$0xff] } /* Start region 9 */
   0x4   : >> { %p6 = scmp.ge.s32.totalorder %s7, 4 /* loop exit test */ }
   0x5   :  { %8 = sbr.rel (!%p6) target = $region9 }
   0x6   : >> { %v9 = vadd.f32 %v5, %v5 }
   0x7   :  {}
   0x8   :  {}
   0x9   :  {}
   0xa   : > { %p10 = scmp.ge.s32.totalorder %s3, 5 /* loop exit test */ }
   0xb   : > { %p12 = scmp.lt.s32.totalorder %s3, 2 }
   0xc   : > { %13 = sbr.rel (%p12) target = $region20 }
   0xd   :  {}
   0xe   :  {}
   0xf   :  {}
  0x10   :  {}
  0x11   : > { %v14 = vmul.f32 %v9, %v9 }
  0x12 PF: > { %v15 = vmov %v14 } /* Start/End empty region 20 */
  0x13   :  { %11 = sbr.rel (!%p10) target = $region4 }
  0x14   :  {}
  0x15   :  {}
  0x16   :  {}
  0x17   :  {}
  0x18   :  { %16 = vsyncpa [#allocation3], 1 }
"""


def test_bundles_and_nested_loops_are_read_and_counted():
    bundles = parse_bundles(TEXT)
    assert [b.address for b in bundles] == list(range(25)) and bundles[1].text.count("\n") == 1
    (outer,) = find_loops(bundles)
    inner = outer.inner[0]
    # each loop from its LB bundle to the delay slots after its back branch
    assert (outer.start, outer.end, outer.trips, inner.start, inner.end, inner.trips) == (2, 0x17, 5, 3, 9, 4)
    (skip,) = find_skips(bundles)
    assert (skip.branch, skip.start, skip.end) == (0xC, 0x11, 0x11)
    # 0x0, 0x1 and 0x18 once; the outer loop's own 15 bundles and the inner loop's 7 four times, five times over
    assert issued_bundles(bundles) == 3 + 5 * (15 + 4 * 7)
    assert issued_bundles(bundles, {0x3: 1}) == 3 + 5 * (15 + 7)  # a trip count given overrides the bound
    counts = issued(bundles, share=lambda sk: 0.5)  # the skippable bundle runs half the time
    assert sum(c for c, _ in counts) == 3 + 5 * (15 + 4 * 7) - 5 * 0.5
    named = issued(bundles, trips=lambda lp: "n" if lp.start == 3 else None, share=lambda sk: "s")
    assert named[0x6] == (5.0, ("n",)) and named[0x11] == (5.0, ("s",)) and named[0x18] == (1.0, ())


def test_named_scopes_are_read_from_trace_marks_which_issue_nothing():
    text = TEXT.replace(
        "   0x6   : >> { %v9 = vadd.f32 %v5, %v5 }",
        "   0x6   : >> { %20 = vtrace 3087007744 /* TraceMeStart(MatmulTile) [ */ ;; %v9 = vadd.f32 %v5, %v5 }",
    ).replace("   0x7   :  {}", "   0x7   :  { %21 = vtrace 3355443200 /* ] TraceMeEnd(MatmulTile) */ }")
    bundles = parse_bundles(text)
    stacks = scope_stacks(bundles)
    assert stacks[0x6] == ("MatmulTile",) and stacks[0x7] == ("MatmulTile",) and stacks[0x8] == ()
    assert bundles[0x7].is_mark and not bundles[0x6].is_mark and not bundles[0x8].is_mark
    assert issued_bundles(bundles) == issued_bundles(parse_bundles(TEXT)) - 5 * 4  # the mark's bundle, 20 times


def test_a_loop_without_a_constant_bound_needs_its_count():
    text = TEXT.replace("%s7, 4 /*", "%s7, %s8 /*")
    with pytest.raises(ValueError, match="at bundle 0x3 has no constant bound"):
        issued_bundles(parse_bundles(text))
    with pytest.raises(ValueError, match="no bundles found"):
        parse_bundles("HloModule x\n")


def test_without_libtpu_one_line_names_it(monkeypatch):
    import importlib.util as iu

    from mk.measure.bundles import final_bundles

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
    from mk.measure.bundles import final_bundles

    counted = {}
    for n in (37, 74):
        bundles = parse_bundles(final_bundles(LOOP_KERNEL.format(n=n), f"loop_of_{n}"))
        (loop,) = find_loops(bundles)
        assert loop.trips == n and not loop.inner
        counted[n] = (issued_bundles(bundles), loop.bundles, len(bundles))
    (a, body, length), (b, body2, length2) = counted[37], counted[74]
    assert body == body2 and length == length2  # the same code, another bound
    assert b - a == 37 * body and a == length - body + 37 * body
