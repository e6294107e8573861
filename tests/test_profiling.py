import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mk import profiling as P

HLO = """HloModule jit_step, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

%fused_computation (p0: f32[8]) -> f32[8] {
  %p0 = f32[8]{0} parameter(0)
  ROOT %neg = f32[8]{0} negate(%p0)
}

%body (t: (s32[], f32[8])) -> (s32[], f32[8]) {
  %t = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%t), index=0
  %x = f32[8]{0} get-tuple-element(%t), index=1
  %f = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused_computation
  %d = f32[8]{0} dot(%f, %f)
  ROOT %r = (s32[], f32[8]{0}) tuple(%i, %d)
}

%cond (t.1: (s32[], f32[8])) -> pred[] {
  %t.1 = (s32[], f32[8]{0}) parameter(0)
  ROOT %c = pred[] constant(true)
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %k = s32[] constant(0)
  %cc = f32[8]{0} custom-call(%a), custom_call_target="tpu_custom_call"
  %ars = f32[8]{0} all-reduce-start(%cc), replica_groups={}, to_apply=%fused_computation
  %ard = f32[8]{0} all-reduce-done(%ars)
  %tp = (s32[], f32[8]{0}) tuple(%k, %ard)
  %w = (s32[], f32[8]{0}) while(%tp), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"5"}}
  %g = f32[8]{0} get-tuple-element(%w), index=1
  ROOT %out = f32[8]{0} fusion(%g), kind=kLoop, calls=%fused_computation
}
"""


def test_count_kernels_on_handwritten_hlo():
    kc = P.count_kernels(HLO)
    # entry: custom-call, all-reduce (start counted, done not), final fusion; the loop body
    # (a fusion and a dot) runs 5 times.
    assert kc.by_kind == {"fusion": 6.0, "custom-call": 1.0, "collective": 1.0, "other": 5.0}
    assert kc.total == 13 and kc.unknown_trip_loops == 0
    assert kc.by_opcode["dot"] == 5 and kc.names == {"cc", "ars", "out", "f", "d"}


def test_count_kernels_flags_loops_without_trip_count():
    kc = P.count_kernels(HLO.replace(', backend_config={"known_trip_count":{"n":"5"}}', ""))
    assert kc.total == 5 and kc.unknown_trip_loops == 1


def test_count_kernels_needs_an_entry():
    with pytest.raises(ValueError, match="no ENTRY"):
        P.count_kernels("HloModule m\n")


def _layers(w, x):
    h, _ = jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi) + 1, None), x, w)
    return jax.nn.softmax(h @ w[0]).sum()


def test_compiled_kernel_count_scales_with_loop_and_matches_the_trace():
    x = jnp.ones((1, 128))
    k4 = P.compiled_kernels(_layers, jnp.ones((4, 128, 128)), x)
    k8 = P.compiled_kernels(_layers, jnp.ones((8, 128, 128)), x)
    per_layer = (k8.total - k4.total) / 4
    assert per_layer >= 1 and k4.total > 4 * per_layer
    w = jnp.ones((4, 128, 128))
    f = jax.jit(_layers)
    traced = P.trace_kernels(lambda: f(w, x), 3, k4.names)
    if jax.devices()[0].platform == "cpu":  # XLA:CPU records one event per executed instruction
        assert traced == k4.total


def test_a_switch_counts_its_largest_branch_and_names_every_branch():
    def f(x, i):
        return jax.lax.switch(i, [lambda x: jnp.sin(x @ x.T) * 2, lambda x: jnp.cos(x @ x.T) + 1], x)

    x, i = jnp.ones((64, 64)), jnp.int32(1)
    kc = P.compiled_kernels(f, x, i)
    f = jax.jit(f)
    traced = P.trace_kernels(lambda: f(x, i), 2, kc.names)
    if jax.devices()[0].platform == "cpu":  # the branch that ran is as large as the one counted
        assert traced == kc.total


def test_count_eager_ops_unrolls_scans_and_inlines_jit():
    def f(x):
        y = jax.lax.scan(lambda c, _: (jnp.sin(c) * 2, None), x, None, length=3)[0]
        return jax.jit(jnp.cos)(y) + 1

    assert P.count_eager_ops(f, jnp.ones(3)) == 3 * 2 + 1 + 1


def test_median_interval_is_the_order_statistic_interval():
    assert P.median_interval(list(range(1, 21))) == (6, 15)  # n = 20, 95%: ranks 6 and 15
    assert P.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few values: the whole range
    rng = np.random.default_rng(0)
    hits = np.mean([lo <= 0 <= hi for lo, hi in (P.median_interval(rng.standard_normal(15)) for _ in range(2000))])
    assert 0.94 <= hits <= 0.99  # it covers the true median as often as it says


def test_gemv_probe_reads_its_bytes_and_the_device_is_named():
    call, nbytes = P.gemv_probe(16 * 2**20)
    assert nbytes == 16 * 2**20 and call().shape == (nbytes // (4 * 4096),)
    assert P.device_name().startswith(jax.devices()[0].platform)


def test_gemv_probe_rejects_a_tiny_array():
    with pytest.raises(ValueError, match="at least 1 MiB"):
        P.gemv_probe(1000)


def test_fraction_of_sol():
    # 1 GB at 10 GB/s is 0.1 s at best; a 0.2 s step reaches half of it
    assert P.fraction_of_sol(0.2, 1e9, 1e10) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="positive"):
        P.fraction_of_sol(0.0, 1e9, 1e10)


def test_a_device_trace_is_read_op_by_op_and_summarised_by_category():
    """A TPU trace's "XLA Ops" line (here a hand-written one: the CPU's trace has none) gives each op's runs and
    seconds a call with its category; the summary puts each category's total first, then the longest ops, with shares
    of every op's time."""

    def event(op: int, start_us: int, us: int, category: str) -> str:
        return (f"events {{ metadata_id: {op} offset_ps: {start_us * 10**6} duration_ps: {us * 10**6} "
                f'stats {{ metadata_id: 9 str_value: "{category}" }} }}')  # fmt: skip

    events = [event(1, 0, 3, "convolution fusion"), event(2, 3, 1, "data formatting"),
              event(1, 5, 5, "convolution fusion"), event(3, 10, 2, "convolution fusion")]  # fmt: skip
    names = "".join(f'event_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }} '
                    for i, n in ((1, "fusion.1"), (2, "copy.2"), (3, "fusion.3")))  # fmt: skip
    category = 'stat_metadata { key: 9 value { id: 9 name: "hlo_category" } }'
    text = (f'planes {{ id: 1 name: "/device:TPU:0" lines {{ id: 1 name: "{P.trace.DEVICE_OPS_LINE}" '
            f'{" ".join(events)} }} {names} {category} }}')  # fmt: skip
    ops = P.ops_seconds(jax.profiler.ProfileData.from_text_proto(text).planes, calls=2)
    assert [(o["op"], o["runs"], o["hlo_category"]) for o in ops] == [
        ("fusion.1", 1.0, "convolution fusion"), ("fusion.3", 0.5, "convolution fusion"),
        ("copy.2", 0.5, "data formatting")]  # fmt: skip
    assert ops[0]["seconds"] == pytest.approx(4e-6)
    summary = P.op_summary(ops, top=1)
    assert [(r["what"], r["name"]) for r in summary] == [
        ("category", "convolution fusion"), ("category", "data formatting"), ("op", "fusion.1")]  # fmt: skip
    assert [r["share"] for r in summary] == pytest.approx([10 / 11, 1 / 11, 8 / 11])


def test_a_v5e_trace_names_each_op_by_its_hlo_text():
    """The v5e's "XLA Ops" events carry no category stat and are named by the whole HLO instruction (as a real trace
    on the chip wrote them): the op is the instruction's name, its category the opcode, a fusion's with its kind."""
    hlo = ['%copy-start = (bf16[4096,4096]{1,0:T(8,128)(2,1)S(1)}, u32[]{:S(2)}) copy-start(bf16[4096,4096]'
           '{1,0:T(8,128)(2,1)} %w.1), cross_program_prefetch_index=0',
           '%slice_reduce_fusion = bf16[8,32]{1,0:T(8,128)(2,1)S(1)} fusion(bf16[8,32,128]{2,1,0:T(8,128)(2,1)S(1)} '
           '%reduce-window), kind=kLoop, calls=%fused_computation']  # fmt: skip
    assert [P.trace.hlo_op(h) for h in hlo] == [("copy-start", "copy-start"), ("slice_reduce_fusion", "fusion kLoop")]
    names = "".join(f'event_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }} '
                    for i, n in enumerate(hlo, 1))  # fmt: skip
    events = " ".join(f"events {{ metadata_id: {i} offset_ps: {t * 10**6} duration_ps: {us * 10**6} }}"
                      for i, t, us in ((1, 0, 3), (2, 4, 2), (2, 10, 2)))  # fmt: skip
    text = (f'planes {{ id: 1 name: "/device:TPU:0" lines {{ id: 1 name: "{P.trace.DEVICE_OPS_LINE}" {events} }} '
            f"{names} }}")  # fmt: skip
    ops = P.ops_seconds(jax.profiler.ProfileData.from_text_proto(text).planes, calls=1)
    assert [(o["op"], o["runs"], o["hlo_category"]) for o in ops] == [
        ("slice_reduce_fusion", 2, "fusion kLoop"), ("copy-start", 1, "copy-start")]  # fmt: skip
    assert [o["seconds"] for o in ops] == pytest.approx([4e-6, 3e-6])
