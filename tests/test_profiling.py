import time

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


def _sleeper(seconds):
    return lambda: time.sleep(seconds)


def test_median_interval_is_the_order_statistic_interval():
    assert P.median_interval(list(range(1, 21))) == (6, 15)  # n = 20, 95%: ranks 6 and 15
    assert P.median_interval([3.0, 1.0, 2.0]) == (1.0, 3.0)  # too few values: the whole range
    rng = np.random.default_rng(0)
    hits = np.mean([lo <= 0 <= hi for lo, hi in (P.median_interval(rng.standard_normal(15)) for _ in range(2000))])
    assert 0.94 <= hits <= 0.99  # it covers the true median as often as it says


def test_interleaved_resolves_a_real_difference_and_bounds_a_null_one():
    cmp = P.interleaved(
        {"a": _sleeper(0.010), "b": _sleeper(0.013), "a2": _sleeper(0.010)}, "a", precision=0.05, budget_s=10, warmup=1
    )
    assert cmp.rounds >= 7 and cmp.load[0] == cmp.load[0]
    d = cmp.differences["b"]
    assert not d.holds_zero and 0.002 < d.median < 0.004 and d.low <= d.median <= d.high
    assert abs(cmp.differences["a2"].median) < 0.001 and cmp.differences["a2"].halfwidth < 0.001
    table = cmp.table().set_index("variant")
    assert table.loc["b", "resolved"] and table.loc["a", "diff_s"] == 0
    with pytest.raises(ValueError, match="baseline"):
        P.interleaved({"a": _sleeper(0)}, "z")


def test_knockout_table_reports_shrinks_with_intervals_and_seed_columns():
    steps = {frozenset(): 0.012, frozenset({"experts"}): 0.006, frozenset({"router"}): 0.012}
    table = P.knockout_table(
        lambda ko: _sleeper(steps[ko]),
        ["experts", "router"],
        bytes_time_s={"experts": 0.001, "router": 0.0},
        budget_s=10,
        warmup=1,
    )
    assert list(table["component"]) == ["(whole step)", "experts", "router"]
    experts = table.iloc[1]
    assert experts.shrink_low_s <= experts.shrink_s <= experts.shrink_high_s
    assert experts.shrink_s == pytest.approx(0.006, abs=0.001)
    assert experts.verdict.startswith("above its bytes")  # 6 ms shrink against 1 ms of bytes
    assert table.iloc[2].shrink_low_s < 0.001  # no change: a shrink about zero
    assert table["shrink_fraction"].iloc[1] == pytest.approx(0.5, abs=0.1)
    seeded = P.with_seed_columns(table)
    assert seeded["seed_vllm_h100_s"].iloc[1] == pytest.approx(1.76e-3)
    assert seeded["seed_megakernel_v5e8_s"].iloc[2] == pytest.approx(0.02e-3)
    assert seeded["seed_vllm_h100_s"].iloc[0] == pytest.approx(5.77e-3)


def test_knockout_table_counts_each_programs_kernels_in_the_program_it_timed(monkeypatch):
    """Calls made with ``program=True``: each knock-out's kernels counted in the program it was timed with
    (compiled once: counting compiles nothing); a knocked-out component launches fewer kernels."""
    from mk.bench import decode_call
    from mk.config import TINY_MOE
    from mk.generate import get_step
    from mk.profiling import knockouts
    from mk.weights import random_params

    cfg, params, step = TINY_MOE, random_params(TINY_MOE, 0), get_step("reference", TINY_MOE)
    counting, compiles_while_counting = [False], []

    def listen(event, _seconds, **_kw):  # (listeners stay registered: this one only hears the counting)
        if counting[0] and event.endswith("backend_compile_duration"):
            compiles_while_counting.append(event)

    def count(*args):
        counting[0] = True
        try:
            return P.compiled_kernels(*args)
        finally:
            counting[0] = False

    jax.monitoring.register_event_duration_secs_listener(listen)
    monkeypatch.setattr(knockouts, "compiled_kernels", count)
    table = P.knockout_table(
        lambda ko: decode_call(step, params, cfg, 32, 1, "f32", ko, program=True), ["experts"], budget_s=1, warmup=1
    )
    whole, experts = table["kernels"]
    assert 0 < experts < whole
    assert compiles_while_counting == []


def test_bandwidth_probes_both_kernels_in_each_type_interleaved():
    table = P.probe_table(16 * 2**20, {"f32": jnp.float32, "bf16": jnp.bfloat16}, budget_s=2)
    assert set(zip(table.dtype, table.probe)) == {(d, p) for d in ("f32", "bf16") for p in ("reduce_sum", "matvec")}
    assert (table.GBps > 0.1).all() and (table.low_GBps <= table.GBps).all() and (table.GBps <= table.high_GBps).all()
    assert table.rounds.nunique() == 1 and table.rounds.iloc[0] >= 7
    call, nbytes = P.gemv_probe(16 * 2**20)
    assert nbytes == 16 * 2**20 and call().shape == (nbytes // (4 * 4096),)
    assert P.device_name().startswith(jax.devices()[0].platform)


def test_bandwidth_probe_rejects_a_tiny_array():
    with pytest.raises(ValueError, match="at least 1 MiB"):
        P.probe_table(1000, {"f32": jnp.float32})
    with pytest.raises(ValueError, match="at least 1 MiB"):
        P.gemv_probe(1000)


def test_sol_fraction():
    # 1 GB at 10 GB/s is 0.1 s at best; a 0.2 s step reaches half of it
    assert P.sol_fraction(0.2, 1e9, 1e10) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="positive"):
        P.sol_fraction(0.0, 1e9, 1e10)
