"""``python -m mk tpu-measure`` (mk.measure.tpu_runs, .on_chip, .hbm, .chip_parity) run through on the CPU: the kernel
interpreted (races checked), rows labelled as the CPU's; a resumed run skips what is measured. The numbers it takes on
a TPU are data/measured/'s."""

import math

import jax.numpy as jnp
import pandas as pd
import pytest
from jax.experimental.pallas import tpu as pltpu

from mk.chips import get_chip, measured_limit
from mk.config import FULL, LAYER_PAIR, TINY_DENSE, with_layers
from mk.files import source_digest
from mk.measure import hbm, on_chip, tpu_runs
from mk.measure.on_chip import Case, Cell
from mk.profiling import dma_stream_call
from mk.timing import read_rate
from mk.timing.scheduled import kernel_digest, kernel_revision

ONE_LAYER = TINY_DENSE.replace(name="tiny-dense-1", layer_types=(FULL,))


def test_without_a_tpu_the_command_says_so_and_exits_2(capsys):
    from mk.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["tpu-measure"])
    assert e.value.code == 2 and "tpu-measure: no TPU found" in capsys.readouterr().err


def test_a_run_writes_parity_read_rate_and_both_engines_rows_and_a_second_run_resumes(tmp_path):
    probes = [hbm.Probe("xla matvec", 2**22), hbm.Probe("pallas dma stream", 2**22, 2**20, 2)]
    case = Case(ONE_LAYER, cells=(Cell(32, 2),))
    kw = dict(out_dir=tmp_path, cases=(case,), parity_checks=[("tiny-llama", "f32", "none")], require_tpu=False,
              quiet=True, steps=2, min_rounds=3, budget_s=0.1, probe_budget_s=0.1)  # fmt: skip
    import mk.measure.hbm as h

    original = h.dma_stream_call
    h.dma_stream_call = lambda *a: original(*a[:4], pltpu.InterpretParams())  # no Mosaic on a CPU
    try:
        done = tpu_runs.run(("parity", "hbm", "table"), hbm_probes=probes, **kw)
    finally:
        h.dma_stream_call = original
    assert done["parity"] == 1 and done["parity_held"] and done["hbm"] == 2 and done["table"] == 2, done
    parity = pd.read_csv(tmp_path / "tpu_parity.csv")
    assert parity.held.all() and parity.max_logit_diff.max() < 1e-4 and (parity.device.str.startswith("cpu")).all()
    rates = pd.read_csv(tmp_path / "tpu_hbm.csv")
    assert set(rates.method) == {"xla matvec", "pallas dma stream"} and (rates.device_GBps > 0).all()
    t = pd.read_csv(tmp_path / "tpu.csv")
    assert tuple(t.columns) == on_chip.COLUMNS and set(t.engine) == {"reference", "megakernel"}
    for r in t.itertuples():
        assert r.backend == "cpu" and r.model == "tiny-dense-1" and r.layers == "all" and r.steps_back_to_back == 2
        assert 0 < r.device_step_low_ms <= r.device_step_ms <= r.device_step_high_ms
        assert r.device_tokens_per_s == pytest.approx(1e3 / r.device_step_ms, abs=0.005)  # rounded to 2 decimals
        assert r.chip == "tpu-v5e" and r.device_fraction_of_spec > 0 and pd.isna(r.limit_GBps)  # no TPU limit
    mk = t[t.engine == "megakernel"].iloc[0]
    assert "interpret mode" in mk.runs_as and mk.interleaved_with == "reference, reference back to back"
    # what ran, computed where it ran: the code's digests, the revision the kernel's digest is, each engine's program
    for name, rows in (("tpu", t), ("parity", parity), ("hbm", rates)):
        assert (rows.code_digest == source_digest()).all() and (rows.kernel_digest == kernel_digest()).all(), name
    assert (t.kernel_revision == kernel_revision()).all()
    assert t.program_digest.str.fullmatch("[0-9a-f]{16}").all() and t.program_digest.nunique() == 2
    again = tpu_runs.run(parts=("table",), **kw)
    assert again["table"] == 0 and len(pd.read_csv(tmp_path / "tpu.csv")) == 2  # measured on this kind of device
    older = t.assign(kernel_revision=kernel_revision() - 1, kernel_digest="0123456789abcdef")
    older.to_csv(tmp_path / "older.csv", index=False)
    assert on_chip.done_cells(tmp_path / "older.csv", "cpu") == set()  # an earlier kernel's rows: measured again
    # rows from before rows carried a kernel's digest: by the revision they record
    t.assign(kernel_digest=None).to_csv(tmp_path / "undigested.csv", index=False)
    assert len(on_chip.done_cells(tmp_path / "undigested.csv", "cpu")) == 2
    older.assign(kernel_digest=None).to_csv(tmp_path / "undigested.csv", index=False)
    assert on_chip.done_cells(tmp_path / "undigested.csv", "cpu") == set()


def test_the_table_can_be_cut_to_some_models_and_refuses_one_it_lacks():
    cases = tpu_runs.table_cases("llama-3.2-1b,qwen3-8b")
    assert cases and {c.config().name.split("[")[0] for c in cases} == {"llama-3.2-1b", "qwen3-8b"}
    assert tpu_runs.table_cases() == tpu_runs.TABLE
    with pytest.raises(ValueError, match="'llama-3-8b'.*llama-3.2-1b"):
        tpu_runs.table_cases("llama-3-8b")


def test_a_measured_limit_is_the_best_device_rate_of_a_gib_or_more(tmp_path):
    base = dict.fromkeys(hbm.COLUMNS, "")
    rows = [
        base | dict(device="tpu: TPU v5 lite", chips=1, method="xla matvec", bytes=2**28, device_GBps=800.0,
                    date="2026-12-04T00:00:00Z"),
        base | dict(device="tpu: TPU v5 lite", chips=1, method="xla matvec", bytes=2**31, device_GBps=741.5,
                    date="2026-12-04T00:00:00Z"),
        base | dict(device="tpu: TPU v5 lite", chips=1, method="pallas dma stream", bytes=2**32, device_GBps=743.0,
                    date="2026-12-04T00:00:00Z"),
        base | dict(device="tpu: TPU v6 lite", chips=1, method="xla matvec", bytes=2**32, device_GBps=1500.0,
                    date="2026-12-04T00:00:00Z"),
    ]  # fmt: skip
    pd.DataFrame(rows, columns=hbm.COLUMNS).to_csv(tmp_path / "r.csv", index=False)
    limit = measured_limit("tpu-v5e", tmp_path / "r.csv")
    assert limit.bandwidth == 743e9 and limit.method == "pallas dma stream" and limit.nbytes == 2**32
    assert limit.source.startswith("measured on a TPU v5 lite, 2026-12-04: ")
    rate = read_rate(get_chip("tpu-v5e"))  # the stored file's: its label names the kind once
    assert rate.kind == "measured" and "(measured on a TPU v5 lite" in rate.label
    assert "measured: measured" not in rate.label
    assert measured_limit("tpu-v5p", tmp_path / "r.csv") is None
    assert (
        limit.fraction_of_spec == pytest.approx(743 / 819) and measured_limit("tpu-v5e-8", tmp_path / "r.csv") == limit
    )


def test_the_table_plans_each_engines_bytes_before_it_allocates():
    cell = Cell(32768, 8)
    pair = Case("gemma4-26b-a4b", LAYER_PAIR)
    ref, ref_extra = on_chip.planned_bytes(pair, "reference", cell)
    mk, mk_extra = on_chip.planned_bytes(pair, "megakernel", cell)
    assert 3e9 < ref < mk < 1.2 * ref  # the kernel's layout pads; both hold the pair's weights and a 32K cache
    embed = 2 * 262144 * 2816  # bf16 bytes of the largest tensor, drawn first
    assert (
        ref_extra < embed and mk_extra == embed
    )  # the reference's peak: its last layer's; the kernel's: one in flight
    assert pair.config().layer_types == ("sliding", "full") and pair.config().name == "gemma4-26b-a4b[sliding+full]"
    with pytest.raises(ValueError, match="no sliding and full layer"):
        with_layers("llama-3.2-1b", LAYER_PAIR)
    stand_in = Case("gemma4-26b-a4b", setup="write-up")
    assert stand_in.engines == ("megakernel",) and stand_in.kernel_setup().loopback
    whole = on_chip.planned_bytes(Case("gemma4-26b-a4b"), "reference", Cell(1024, 1))[0]
    chip0 = on_chip.planned_bytes(stand_in, "megakernel", Cell(1024, 1))[0]
    assert whole / 8 < chip0 < whole / 5 < 12e9  # an eighth, and what every chip keeps whole: one v5e holds it
    assert jnp.dtype("bfloat16").itemsize == 2


def test_a_routed_familys_bf16_check_takes_its_logits_bound_with_routing_fixed(monkeypatch):
    """bf16 tiny-qwen3-moe, one user for two teacher-forced steps: the row carries the kernel's and the kernel-like
    reference's largest logit errors with the router knocked out in both engines, and is held to those (routing as is
    only keeps the picks: mk.measure.chip_parity's docstring argues why)."""
    from mk.measure import chip_parity

    monkeypatch.setattr(chip_parity, "BF16_PROMPTS", (11,))
    monkeypatch.setattr(chip_parity, "BF16_STEPS", 2)
    row = chip_parity.check("tiny-qwen3-moe", "bf16")
    assert row["error"] == "" and row["races"] is False, row
    fixed, like = row["fixed_routing_logit_diff"], row["fixed_routing_kernel_rounding_logit_diff"]
    assert 0 < fixed <= chip_parity.BF16_FACTOR * like, row
    assert row["criterion"].startswith("teacher-forced: routing fixed") and row["held"], row


def test_the_tile_size_probes_stream_small_tiles_each_a_valid_stream():
    """Chunks of 0.25-1 MiB, two and four deep, each a DMA stream the probe can build (whole 16-row tiles, more chunks
    than copies in flight); the probe reads what it says, in interpret mode."""
    chosen = hbm.tile_size_probes()
    assert {(p.chunk_bytes, p.in_flight) for p in chosen} == {(c, d) for c in (2**18, 2**19, 2**20) for d in (2, 4)}
    assert all(p.method == "pallas dma stream" and p.nbytes == 4 * 2**30 for p in chosen)
    small = hbm.tile_size_probes(2**21, chunks=(2**18,), depths=(4,))[0]
    call, size = dma_stream_call(small.nbytes, small.chunk_bytes, small.in_flight, None, pltpu.InterpretParams())
    assert size == 2**21 and float(call()[0, 0]) == 8.0  # 8 chunks, each a tile of ones touched once


def test_the_dma_probe_copies_what_it_says_and_times_one_copy_from_two_trip_counts(tmp_path):
    """Each trip's copy lands (its first tile of ones summed once a trip), a size that is not whole bf16 tiles is
    refused, and a run writes a row a trip count with one copy's time from their difference (interpreted: a CPU's
    rows, the driver checked, no chip's time)."""
    from mk.measure import dma_latency

    x = jnp.ones((2 * 16, 128), jnp.bfloat16)
    assert float(dma_latency.round_trip_kernel(4096, 3, interpret=True)(x)[0, 0]) == 3.0
    with pytest.raises(ValueError, match="multiple of 4 KiB"):
        dma_latency.round_trip_kernel(5000, 3)
    t = dma_latency.measure(sizes=(4096,), trips=(2, 6), out=tmp_path / "dma.csv", budget_s=0.1, quiet=True,
                            interpret=True)  # fmt: skip
    assert list(t.trips) == [2, 6]
    # a busy host can time 2 and 6 trips alike: the copy's time is then unknown (NaN), never an inverted interval
    known = t.copy_us.notna()
    assert ((t.copy_low_us <= t.copy_us) & (t.copy_us <= t.copy_high_us))[known].all()
    assert tuple(pd.read_csv(tmp_path / "dma.csv").columns) == dma_latency.COLUMNS


def test_a_copy_rate_interval_through_zero_leaves_one_copys_time_unbounded_or_unknown():
    from types import SimpleNamespace as Rate

    from mk.measure.dma_latency import per_copy_us

    assert per_copy_us(Rate(low=1e6, median=2e6, high=4e6)) == [0.25, 0.5, 1.0]  # us: low, median, high
    assert per_copy_us(Rate(low=-1e5, median=2e6, high=4e6)) == [0.25, 0.5, math.inf]
    assert math.isnan(per_copy_us(Rate(low=-3e6, median=-1e6, high=2e6))[1])
