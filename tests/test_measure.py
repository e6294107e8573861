"""mk.measure's harness: the one timing loop and its stopping rule, the row schema every CSV of data/measured/
shares, the provenance and versions collector, the speed of light a row is set against (spec, probed round by
round, unknown), and the timed instruments (knock-outs, the bandwidth table). The drivers' own tests:
tests/test_measure_cpu.py, test_measure_gpu.py, test_measure_tpu.py; XLA's cost model: test_xla_cost.py."""

import csv
import re
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest

from mk.config import get_config
from mk.files import source_digest
from mk.measure import cpu, gpu, harness, knockouts, loop, smoke
from mk.measure.steps import decode_call
from mk.paths import BENCH_CSV, GPU_CSV, TPU_CSV, TPU_OPS_CSV
from mk.profiling import Estimate, compiled_kernels
from mk.sol import bytes_per_token, speed_of_light
from mk.timing.scheduled import kernel_digest


def _sleeper(seconds):
    return lambda: time.sleep(seconds)


MS = 2.0**-10  # about a millisecond, in binary: a fake clock's sums of these are exact


def test_interleaved_resolves_a_difference_through_a_stall_and_stops_when_its_rule_holds(fake_clock):
    """On a clock each call advances: 10 ms and 13 ms steps, every call 40 ms slower in one round of seven (a stall).
    The paired differences are exact through it (the stall slows both in its round), the medians are the steps', and
    the loop stops at the first round its stopping rule holds."""
    a = [10 * MS] * 3 + [40 * MS] + [10 * MS] * 3
    calls = {"a": fake_clock.step(*a), "b": fake_clock.step(*(t + 3 * MS for t in a)), "a2": fake_clock.step(*a)}
    cmp = loop.interleaved(calls, "a", precision=0.05, budget_s=10, warmup=0, clock=fake_clock)
    d = cmp.differences["b"]
    assert (d.median, d.low, d.high) == (3 * MS, 3 * MS, 3 * MS) and not d.holds_zero
    assert cmp.differences["a2"].median == cmp.differences["a2"].halfwidth == 0 and cmp.differences["a2"].holds_zero
    assert (cmp.times["a"].median, cmp.times["b"].median) == (10 * MS, 13 * MS)
    assert cmp.raw["b"][3] == 43 * MS  # the stall is in the rounds, not in the statistics
    assert loop.precise(cmp.raw, 0.05) and not loop.precise({k: v[:-1] for k, v in cmp.raw.items()}, 0.05)
    assert cmp.rounds > loop.MIN_ROUNDS and cmp.elapsed_s == fake_clock.now
    table = cmp.table().set_index("variant")
    assert table.loc["b", "resolved"] and not table.loc["a2", "resolved"] and table.loc["a", "diff_s"] == 0
    with pytest.raises(ValueError, match="baseline"):
        loop.interleaved({"a": fake_clock.step(0.0)}, "z")


def test_interleaved_on_the_real_clock_tells_a_slower_sleep():
    """The one test on the real clock (time.perf_counter, the default): a 3 ms longer sleep is told, loosely (a loaded
    machine oversleeps both, and stalls some rounds)."""
    cmp = loop.interleaved({"a": _sleeper(0.010), "b": _sleeper(0.013)}, "a", precision=0.05, budget_s=10, warmup=1)
    assert cmp.rounds >= loop.MIN_ROUNDS and cmp.load[0] == cmp.load[0]
    assert 0.001 < cmp.differences["b"].median < 0.010


def test_knockout_table_reports_shrinks_with_intervals_and_seed_columns(fake_clock):
    steps = {frozenset(): 12 * MS, frozenset({"experts"}): 6 * MS, frozenset({"router"}): 12 * MS}
    table = knockouts.knockout_table(
        lambda ko: fake_clock.step(steps[ko]),
        ["experts", "router"],
        bytes_time_s={"experts": 1 * MS, "router": 0.0},
        budget_s=10,
        warmup=1,
        clock=fake_clock,
    )
    assert list(table["component"]) == ["(whole step)", "experts", "router"]
    experts = table.iloc[1]
    assert (experts.shrink_low_s, experts.shrink_s, experts.shrink_high_s) == (6 * MS, 6 * MS, 6 * MS)
    assert experts.verdict.startswith("above its bytes")  # 6 ms shrink against 1 ms of bytes
    assert table.iloc[2].shrink_s == 0 and table.iloc[2].verdict.startswith("noise")  # no change: no shrink
    assert table["shrink_fraction"].iloc[1] == 0.5
    assert table.attrs["rounds"] == loop.MIN_ROUNDS  # every step the same each round: known at once
    seeded = knockouts.with_seed_columns(table)
    assert seeded["seed_vllm_h100_s"].iloc[1] == pytest.approx(1.76e-3)
    assert seeded["seed_megakernel_v5e8_s"].iloc[2] == pytest.approx(0.02e-3)
    assert seeded["seed_vllm_h100_s"].iloc[0] == pytest.approx(5.77e-3)


def test_knockout_table_counts_each_programs_kernels_in_the_program_it_timed(monkeypatch):
    """Calls made with ``program=True``: each knock-out's kernels counted in the program it was timed with
    (compiled once: counting compiles nothing); a knocked-out component launches fewer kernels."""
    from mk.config import TINY_MOE
    from mk.generate import get_step
    from mk.weights import random_params

    cfg, params, step = TINY_MOE, random_params(TINY_MOE, 0), get_step("reference", TINY_MOE)
    counting, compiles_while_counting = [False], []

    def listen(event, _seconds, **_kw):  # (listeners stay registered: this one only hears the counting)
        if counting[0] and event.endswith("backend_compile_duration"):
            compiles_while_counting.append(event)

    def count(*args):
        counting[0] = True
        try:
            return compiled_kernels(*args)
        finally:
            counting[0] = False

    jax.monitoring.register_event_duration_secs_listener(listen)
    monkeypatch.setattr(knockouts, "compiled_kernels", count)
    table = knockouts.knockout_table(
        lambda ko: decode_call(step, params, cfg, 32, 1, "f32", ko, program=True), ["experts"], budget_s=1, warmup=1
    )
    whole, experts = table["kernels"]
    assert 0 < experts < whole
    assert compiles_while_counting == []


def test_the_data_type_table_is_relative_and_paired_by_round():
    step_bytes = {"f32": 4e6, "bf16": 2e6}
    table = cpu.dtype_table(16 * 2**20, {"f32": jnp.float32, "bf16": jnp.bfloat16}, step_bytes, budget_s=2)
    assert list(table.dtype) == ["f32", "bf16"] and table.chosen.sum() == 1
    assert not any("GBps" in c for c in table.columns)  # no bandwidth of its own: the bench's is the one
    chosen = table[table.chosen].iloc[0]
    assert chosen.step_bound_vs_chosen == chosen.gemv_bandwidth_vs_chosen == 1.0 and chosen.resolved
    other = table[~table.chosen].iloc[0]
    assert other.bound_low <= other.step_bound_vs_chosen <= other.bound_high
    assert other.step_bound_vs_chosen >= 1  # the chosen type's bound is the lowest
    assert other.resolved == (other.bound_low > 1)
    assert table.rounds.nunique() == 1 and table.rounds.iloc[0] >= 7


def test_one_data_type_is_not_timed():
    table = cpu.dtype_table(16 * 2**20, {"f32": jnp.float32}, {"f32": 4e6})
    assert table.rounds.tolist() == [0] and table.chosen.all() and (table.step_bound_vs_chosen == 1).all()


def test_the_data_type_table_rejects_a_tiny_array():
    with pytest.raises(ValueError, match="at least 1 MiB"):
        cpu.dtype_table(1000, {"f32": jnp.float32, "bf16": jnp.bfloat16}, {"f32": 1.0, "bf16": 1.0})


def test_a_ratio_is_paired_by_round():
    raw = {"a": [1.0, 2.0, 4.0], "b": [3.0, 2.0, 8.0]}  # per round: 3, 1, 2
    times = {n: Estimate.of(v, 0.95) for n, v in raw.items()}
    cmp = loop.Comparison("a", times, {}, 0.95, 3, 1.0, (0.0, 0.0), raw)
    assert cmp.ratio("b").median == 2.0 != times["b"].median / times["a"].median  # not the ratio of medians (1.5)
    assert (cmp.ratio("b").low, cmp.ratio("b").high) == (1.0, 3.0)


def test_the_stopping_rule_wants_every_watched_median_known_to_its_precision():
    tight, loose = [1.0, 1.001, 0.999, 1.0, 1.0, 1.001, 0.999], [1.0, 2.0, 0.5, 1.0, 3.0, 1.0, 0.7]
    assert loop.precise({"a": tight}, 0.01)
    assert not loop.precise({"a": tight, "b": loose}, 0.01)
    assert not loop.precise({"a": tight}, 0)  # 0: never, the budget or max_rounds ends the run


def test_interleaved_stops_on_the_watched_series_and_keeps_min_rounds(fake_clock):
    calls = {"a": fake_clock.step(MS), "b": fake_clock.step(2 * MS)}
    never = loop.interleaved(
        calls, "a", budget_s=30, min_rounds=3, max_rounds=9, warmup=0, watch=lambda t: {"x": [0, 1]}, clock=fake_clock
    )
    assert never.rounds == 9  # a watched series whose median is never known: to max_rounds
    once = loop.interleaved(calls, "a", precision=0.5, budget_s=1e-6, min_rounds=5, warmup=0, clock=fake_clock)
    assert once.rounds == 5  # the budget is spent at once, min_rounds still run
    # precision 0: to the budget, read from the loop's clock; a round takes 3 ms, so the 34th is past 100 ms
    spent = loop.interleaved(calls, "a", precision=0, budget_s=100 * MS, min_rounds=3, warmup=0, clock=fake_clock)
    assert spent.rounds == 34 and spent.elapsed_s == 34 * 3 * MS
    with pytest.raises(ValueError, match="precision >= 0"):
        loop.interleaved(calls, "a", precision=-1)


def test_the_fraction_pairs_each_rounds_step_with_the_same_rounds_probe(monkeypatch):
    """The fraction of the speed of light is the median over rounds of (bytes / that round's probe bandwidth)
    / that round's step, with its interval: on a loaded machine a slow round slows the probe and the step
    together, so the pairs cancel what the ratio of two medians would not. Known rounds, no timing."""
    steps = [1.0, 2.0, 4.0, 1.0, 2.0, 4.0, 1.0]  # s
    probe = [1.0, 2.0, 4.0, 0.5, 1.0, 2.0, 1.0]  # s to read the probe's bytes
    raw = {"ref": steps, "probe": probe}

    def fake_interleaved(calls, baseline, **_):
        times = {k: Estimate.of(v, 0.95) for k, v in raw.items()}
        return loop.Comparison(baseline, times, {}, 0.95, len(steps), 1.0, (0.0, 0.0), raw)

    monkeypatch.setattr(harness, "interleaved", fake_interleaved)
    sol = harness.MeasuredSpeedOfLight("measured: GEMV probe", bytes_per_step=50, probe=lambda: None, probe_bytes=100)
    _, (row,) = harness.time_engines([harness.TimedStep("ref", None)], sol, {"batch": 1}, 1.0)
    pairs = sorted(50 / (100 / p) / t for p, t in zip(probe, steps))  # 0.5 each round but 0.25 in three
    assert row["fraction_of_sol"] == pytest.approx(pairs[3]) == 0.5
    assert row["fraction_of_sol_low"] == pytest.approx(pairs[0]) and row["fraction_of_sol_high"] == pytest.approx(
        pairs[-1]
    )
    assert row["step_ms"] == 2000.0  # the ratio of the medians, 50 B / 100 B/s / 2 s, would be 0.25
    assert row["interleaved_with"] == "probe" and row["sol_tokens_per_s"] == 2.0  # median 100 B/s over 50 B


def test_provenance_names_the_device_the_software_and_the_commit():
    p = harness.provenance(chips=2)
    assert tuple(p) == harness.PROVENANCE and p["chips"] == 2 and p["date"].endswith("Z")
    assert p["jax_version"] == jax.__version__ and p["device"].startswith(jax.devices()[0].platform)
    assert re.fullmatch(r"[0-9a-f]{12}( \(with uncommitted changes\))?|unknown", p["commit"]), p["commit"]
    assert all(p[k] for k in harness.PROVENANCE), p  # "none" where a package is absent, never blank
    # what ran, computed from the files here, whatever the commit says
    assert (p["code_digest"], p["kernel_digest"]) == (source_digest(), kernel_digest())
    chip = harness.chip_provenance()
    assert tuple(chip) == harness.CHIP_PROVENANCE and chip["kernel_digest"] == p["kernel_digest"]


def test_a_copy_inside_another_repository_has_no_commit_of_its_own_unless_its_sender_names_it(tmp_path, monkeypatch):
    """A copy of the tree without its .git, inside another checkout (as a TPU machine receives it), must not take that
    checkout's commit: unknown, or the commit ``$MK_COMMIT`` names, said to be a copy's."""
    import subprocess

    from mk.files import COMMIT_ENV, git_commit

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "other"], cwd=tmp_path, check=True)
    (tmp_path / "copy").mkdir()
    monkeypatch.delenv(COMMIT_ENV, raising=False)
    assert git_commit(tmp_path) is not None and git_commit(tmp_path / "copy") is None
    monkeypatch.setenv(COMMIT_ENV, "0123456789abcdef")
    assert git_commit(tmp_path / "copy") == "0123456789ab (a copy, as $MK_COMMIT states)"


def test_every_driver_writes_the_shared_columns_first_each_named_once():
    for driver in (cpu, gpu, smoke):
        assert driver.COLUMNS[: len(harness.SHARED)] == harness.SHARED
        assert len(set(driver.COLUMNS)) == len(driver.COLUMNS)
        assert "sol_fraction" not in driver.COLUMNS and "fraction_of_sol" in driver.COLUMNS
    with pytest.raises(ValueError, match="must be new"):
        harness.columns("step_ms")


def test_the_committed_rows_have_their_drivers_columns():
    """data/measured/'s CSVs are appended to by the drivers, which refuse a file with other columns."""
    from mk.measure import attention_anchor, chip_clock, chip_knockouts, dma_latency, hbm, on_chip, tpu_runs

    written = {BENCH_CSV: cpu.COLUMNS, GPU_CSV: gpu.COLUMNS, TPU_CSV: smoke.COLUMNS, TPU_OPS_CSV: on_chip.OP_COLUMNS}
    written.update({TPU_CSV.with_name(tpu_runs.CSVS[part]): columns for part, columns in (
        ("parity", tpu_runs.PARITY_COLUMNS), ("hbm", hbm.COLUMNS), ("clock", chip_clock.COLUMNS),
        ("knockouts", chip_knockouts.COLUMNS), ("anchor", attention_anchor.COLUMNS),
        ("dma", dma_latency.COLUMNS))})  # fmt: skip
    for path, columns in written.items():
        if path.exists():
            with open(path, newline="") as f:
                assert tuple(next(csv.reader(f))) == columns, path


def test_the_speed_of_light_of_a_known_chip_a_given_one_and_an_unknown_one():
    cfg = get_config("gemma4-26b-a4b")
    per_step = bytes_per_token(cfg, 1024, 1, "bf16").total
    h200 = SimpleNamespace(platform="gpu", device_kind="NVIDIA H200")
    sol = harness.spec_speed_of_light(per_step, h200)
    assert sol.bandwidth / sol.bytes_per_step == pytest.approx(speed_of_light(cfg, "h200", 1024).tokens_per_s)
    assert sol.chip == "h200" and sol.source.startswith("h200 spec") and "given" not in sol.source
    cpu_dev = jax.devices("cpu")[0]
    given = harness.spec_speed_of_light(per_step, cpu_dev, chips=8, chip="tpu-v5e")
    assert given.chip == "tpu-v5e-8" and "given, the device is cpu" in given.source
    assert given.bandwidth == pytest.approx(speed_of_light(cfg, "tpu-v5e-8", 1024).bandwidth)
    assert harness.spec_speed_of_light(per_step, cpu_dev) is None
    unknown = harness.unknown_speed_of_light(per_step, cpu_dev)
    assert not unknown.known and unknown.fractions({"a": [1.0]}, "a") is None


def test_device_memory_is_released_on_an_accelerator_and_left_alone_on_the_cpu(monkeypatch):
    """Between cases a chip's memory is collected, and with ``caches`` JAX's compiled programs dropped; on the CPU
    neither (a full collection, or clearing every cache, of a long-lived process costs seconds)."""
    import gc

    calls = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append("collect") or 0)
    monkeypatch.setattr(jax, "clear_caches", lambda: calls.append("clear_caches"))
    harness.release_device_memory(jax.devices("cpu")[0], caches=True)
    assert calls == []
    harness.release_device_memory(SimpleNamespace(platform="tpu"))
    assert calls == ["collect"]
    harness.release_device_memory(SimpleNamespace(platform="gpu"), caches=True)
    assert calls == ["collect", "clear_caches", "collect"]


def test_steps_in_one_call_for_xla_pick_what_single_steps_pick():
    """mk.measure.steps.greedy_steps_call for the general stack: three greedy steps in one program (a fori_loop), each
    step's picks the next one's tokens, pick what three single steps pick from the same cache and positions."""
    from mk.config import TINY_LLAMA
    from mk.measure.steps import greedy_steps_call
    from mk.reference import decode_step, init_cache
    from mk.weights import random_params

    params, context, batch = random_params(TINY_LLAMA, 1), 32, 2
    picks = greedy_steps_call(decode_step, params, TINY_LLAMA, context, batch, "f32", 3)()
    cache = init_cache(TINY_LLAMA, batch, context)
    tokens, pos = (jnp.arange(batch, dtype=jnp.int32) * 7919 + 11) % TINY_LLAMA.vocab_size, context - 3
    for i in range(3):
        logits, cache = decode_step(params, TINY_LLAMA, cache, tokens, jnp.full((batch,), pos + i, jnp.int32))
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        assert (picks[i] == tokens).all(), i
