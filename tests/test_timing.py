"""The timing model: its constants, predictions below the speed of light for every chip and engine, the fits,
knock-outs, data types and bad input."""

import csv
import json
from pathlib import Path

import pytest

from mk import timing
from mk.analysis.knockouts import knockouts
from mk.analysis.straggler import straggler_cost, straggler_table
from mk.chips import get_chip, known_chips
from mk.config import get_config, to_hf_dict
from mk.kernel_setup import FIXES, WORKBOOK_KERNEL, WRITE_UP_KERNEL
from mk.params import KNOCKOUTS
from mk.plan import MatmulTile, build_plan
from mk.published import independent_table, published
from mk.sol import speed_of_light

MOE = "gemma4-26b-a4b"


def test_every_constant_names_its_source_and_kind():
    for c in timing.constants():
        assert c.source.strip(), c
        assert c.kind in ("cited", "published", "fitted", "assumed", "measured"), c
        if c.kind == "measured":  # read at run time from data/measured/ (mk.timing.bandwidth), never typed here
            assert c.value is None and c.fit_to is None, c
        elif c.kind == "cited":
            assert c.value is not None and c.value > 0, c
        elif c.kind == "assumed":  # one default for the workbook, given in the file, with no published key
            assert c.value is not None and c.value >= 0 and c.fit_to is None, c
        else:  # fitted or published: read at run time, never typed here, from data/published.csv (the GPU
            # megakernel's cost per op: fitted to a point of data/independent.csv)
            assert c.value is None and c.fit_to, c
            if c.name == "op_overhead_s":
                assert c.kind == "fitted" and c.fit_to in set(independent_table().key), c
            else:
                published(c.fit_to)


@pytest.mark.parametrize("chip", known_chips() + ["tpu-v5e-8", "tpu-v6e-8"])
@pytest.mark.parametrize("engine", timing.ENGINES)
def test_predictions_never_beat_the_speed_of_light(chip, engine):
    if engine == "megakernel" and get_chip(chip).devices_per_chip > 1:  # refused by name: not modelled
        with pytest.raises(ValueError, match="devices"):
            timing.predict(MOE, chip, 1024, 1, engine)
        return
    for model, context, batch in ((MOE, 1024, 1), ("tiny-moe", 64, 3)):
        p = timing.predict(model, chip, context, batch, engine)
        sol = speed_of_light(get_config(model), chip, context, batch)
        assert p.sol_step_s == pytest.approx(sol.step_s)
        assert p.step_s >= sol.step_s
        assert 0 < p.fraction_of_sol <= 1
        assert p.tokens_per_s == pytest.approx(1 / p.step_s)
        assert p.tokens_per_s_total == pytest.approx(batch / p.step_s)


def test_a_chip_of_two_devices_is_refused_by_name_not_modelled():
    """TPU v7x: two TensorCores a chip, each a device, where mk's megakernel runs one program a chip: its step is
    refused by name, its speed of light and the general stack's step are still given."""
    with pytest.raises(ValueError, match=r"tpu-v7x-8: each tpu-v7x chip is 2 devices"):
        timing.predict(MOE, "tpu-v7x-8", 1024)
    assert timing.predict(MOE, "tpu-v7x", 1024, engine="general").step_s > 0
    assert speed_of_light(MOE, "tpu-v7x", 1024).step_s > 0


@pytest.mark.parametrize("chip", ["tpu-v5e-8", "tpu-v6e-8", "h100", "h200", "b200"])
def test_the_megakernel_beats_the_general_stack_for_the_moe_model_at_one_user(chip):
    mk = timing.predict(MOE, chip, 1024, 1, "megakernel")
    general = timing.predict(MOE, chip, 1024, 1, "general")
    assert mk.step_s < general.step_s
    assert mk.kernels_per_step == 1 < general.kernels_per_step


def test_fitted_kernel_costs_meet_the_numbers_they_were_fitted_to():
    vllm = timing.predict(MOE, "h100", 1024, 1, "general", dtype="fp8")
    assert vllm.step_s == pytest.approx(published("vllm_h100_moe_step"), rel=1e-9)
    assert vllm.kernels_per_step == pytest.approx(published("vllm_h100_moe_kernels"))
    dense = timing.predict("gemma4-31b", "tpu-v5e-8", 1024, 1, "general")
    assert dense.fraction_of_sol == pytest.approx(published("vllm_v5e8_dense_sol_fraction"), rel=1e-9)
    assert 0 < timing.kernel_cost("tpu") < timing.kernel_cost("gpu")


def test_general_stack_groups_routed_experts_into_a_few_kernels_whatever_the_batch():
    one = timing.predict(MOE, "h100", 1024, 1, "general")
    eight = timing.predict(MOE, "h100", 1024, 8, "general")
    assert eight.kernels_per_step == one.kernels_per_step  # grouped GEMMs, not one kernel per expert
    assert eight.step_s > one.step_s  # but more experts' bytes


def test_knockouts_only_shrink_the_step_and_name_every_component():
    t = knockouts("tiny-moe", "tpu-v5e-8", 64, 2, "megakernel")
    assert tuple(t.component) == KNOCKOUTS
    assert (t.shrink_ms >= -1e-9).all()
    assert (t.knocked_out_ms <= t.step_ms + 1e-9).all()
    g = knockouts("tiny-moe", "h100", 64, 2, "general")
    assert (g.kernel_time_ms > 0).all()


def test_int8_experts_read_fewer_bytes_and_step_faster():
    bf16 = timing.predict(MOE, "tpu-v5e-8", 1024, 1)
    int8 = timing.predict(MOE, "tpu-v5e-8", 1024, 1, dtype="int8-experts")
    assert int8.step_s < bf16.step_s
    assert int8.sol_step_s < bf16.sol_step_s


def test_matrix_rows_are_padded_to_what_the_matrix_unit_takes():
    cfg, chip = get_config("tiny-moe"), get_chip("tpu-v5e-8")
    rows = timing.constant("matmul_rows", "tpu").value
    one, four = (build_plan(cfg, b, 64, weight_dtype="bfloat16", kv_dtype="bfloat16") for b in (1, 4))
    m1 = next(op for op in one.ops if isinstance(op, MatmulTile))
    m4 = next(op for op in four.ops if isinstance(op, MatmulTile))
    assert m4.flops == 4 * m1.flops
    t1, t4 = timing.compute_seconds(one, chip)(m1), timing.compute_seconds(four, chip)(m4)
    assert t1 == pytest.approx(t4) == pytest.approx(m1.flops * rows / (chip.bf16_flops / chip.chips))


def test_whole_experts_are_paced_by_the_busiest_chip():
    split = timing.predict(MOE, "tpu-v5e-8", 1024, 1, "megakernel")
    whole = timing.predict(MOE, "tpu-v5e-8", 1024, 1, "megakernel", setup=WORKBOOK_KERNEL.but(placement="whole"))
    assert "busiest" in whole.models and "every chip" in split.models
    assert whole.step_s > split.step_s


def test_fits_in_hbm_says_when_the_model_does_not():
    assert not timing.predict(MOE, "tpu-v5e", 1024).fits_in_hbm  # 16 GB for 51 GB of weights
    assert timing.predict(MOE, "tpu-v5e-8", 1024).fits_in_hbm


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(chip="tpu-v9"), "unknown chip"),
        (dict(engine="vllm"), "unknown engine"),
        (dict(setup=dict(placement="half")), "unknown expert placement"),
        (dict(setup=dict(ffn_layout="columns")), "unknown ffn_layout"),
        (dict(setup=dict(draft_tokens=-1)), "drafted tokens per user must be 0 or more"),
        (dict(context=0), "context must be a positive integer"),
        (dict(batch=1.5), "batch must be a positive integer"),
        (dict(dtype="int3"), "unknown dtype"),
        (dict(chip="l40s-8"), r"no interconnect bandwidth for l40s \(ici_bandwidth_Bps\)"),  # PCIe only
        (dict(chip="mi300x-8"), r"no link latency for mi300x \(an ici_hop_latency_s row"),  # no Infinity Fabric latency
    ],
)
def test_bad_input_is_refused_with_the_fix(kwargs, message):
    args = dict(model="tiny-moe", chip="tpu-v5e-8", context=64, batch=1, engine="megakernel")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        if "setup" in args:  # a setup with a bad switch is refused where it is made
            args["setup"] = WORKBOOK_KERNEL.replace(**args["setup"])
        timing.predict(**args)


@pytest.mark.parametrize("chip", known_chips() + ["tpu-v5e-8"])
def test_cli_predict_answers_for_every_chip_and_engine_below_mk_sol(chip, capsys):
    from mk.__main__ import main

    args = ["--model", MOE, "--chip", chip, "--context", "4096", "--batch", "2", "--json"]
    assert main(["sol", *args]) == 0
    sol = json.loads(capsys.readouterr().out)
    for engine in timing.ENGINES:
        if engine == "megakernel" and get_chip(chip).devices_per_chip > 1:  # refused by name, with the reason
            assert main(["predict", *args, "--engine", engine]) != 0 and "devices" in capsys.readouterr().err
            continue
        assert main(["predict", *args, "--engine", engine]) == 0
        d = json.loads(capsys.readouterr().out)
        assert {"step_ms", "tokens_per_s", "fraction_of_sol"} <= set(d)
        assert d["engine"] == engine and d["kind"].startswith("modelled")
        assert d["tokens_per_s"] <= sol["tokens_per_s"] * (1 + 1e-12)
        assert d["step_ms"] >= sol["step_ms"] * (1 - 1e-12)
        assert d["fraction_of_sol"] == pytest.approx(sol["step_ms"] / d["step_ms"])


def test_cli_predict_refuses_bad_input_with_status_2(capsys):
    from mk.__main__ import main

    for chip, missing in (("l40s-8", "ici_bandwidth_Bps"), ("mi300x-8", "ici_hop_latency_s")):
        assert main(["predict", "--model", MOE, "--chip", chip, "--context", "1024"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and chip in err and missing in err, err
    with pytest.raises(SystemExit):
        main(["predict", "--model", MOE, "--chip", "h100", "--context", "0"])


@pytest.mark.parametrize("chip", ["h100-8", "b200-8"])
def test_cli_predicts_nvlink_slices_no_faster_than_the_speed_of_light(chip, mk_json):
    args = ["--model", MOE, "--chip", chip, "--context", 1024, "--json"]
    sol = mk_json("sol", *args)
    d = mk_json("predict", *args)
    assert d["chip"] == chip and d["kind"].startswith("modelled")
    assert d["step_ms"] >= sol["step_ms"] * (1 - 1e-12) and 0 < d["fraction_of_sol"] <= 1
    assert d["constants"]["ici_hop_latency_s"] == "6e-07 (cited)"  # NVLink's, not the TPU's 1 us
    assert d["pacing"]["ici_ms"] > 0


def test_cli_ffn_layout_switch_gives_the_step_before_and_after(mk_json):
    """The default layout (the MLPs' intermediate on rows) moves only real weights and is faster; ``--ffn-layout
    lanes`` is the first layout, the write-up's fixes' step (mk.kernel_setup.FIXES (e)), with its padding."""
    args = ["--model", MOE, "--chip", "tpu-v5e-8", "--context", 1024, "--json"]
    rows, lanes = mk_json("predict", *args), mk_json("predict", *args, "--ffn-layout", "lanes")
    assert rows["pacing"]["weight_bytes"] == pytest.approx(rows["pacing"]["weight_payload_bytes"], rel=1e-9)
    assert lanes["pacing"]["weight_bytes"] > 1.2 * lanes["pacing"]["weight_payload_bytes"]
    assert rows["step_ms"] < lanes["step_ms"]
    lanes_setup = WORKBOOK_KERNEL.but(ffn_layout="lanes")
    assert lanes["step_ms"] == pytest.approx(timing.predict(MOE, "tpu-v5e-8", 1024, setup=lanes_setup).step_s * 1e3)
    assert lanes["setup"] == lanes_setup.name and rows["setup"] == WORKBOOK_KERNEL.name


def test_positions_split_keep_long_contexts_near_the_speed_of_light(mk_json):
    """The workbook's kernel on 26B-A4B over the v5e-8 (mk.kernel_setup.WORKBOOK_KERNEL: intermediate on rows,
    positions split):
    at 128K positions a chip reads about its even share of the full layers' cache, so the step keeps at least 75%
    of the speed of light (48% in the first kernel); ``--attention-split heads`` is fix (f), every chip of a group
    reading the whole head's positions."""
    args = ["--model", MOE, "--chip", "tpu-v5e-8", "--context", 131072, "--json"]
    split, whole = mk_json("predict", *args), mk_json("predict", *args, "--attention-split", "heads")
    assert split["fraction_of_sol"] >= 0.75 > whole["fraction_of_sol"]
    assert split["pacing"]["kv_bytes"] < 0.4 * whole["pacing"]["kv_bytes"]
    assert whole["step_ms"] == pytest.approx(timing.predict(MOE, "tpu-v5e-8", 131072, setup=FIXES[-2]).step_s * 1e3)


def test_applies_to_names_a_kind_all_or_known_chips():
    for c in timing.constants():
        names = c.applies_to.split()
        assert c.applies_to in ("tpu", "gpu", "all") or set(names) <= set(known_chips()), c
        assert len(names) == len(set(names)), c


@pytest.mark.parametrize(
    "chip, rows",
    [("h100", 64), ("h200", 64), ("h20", 64), ("b200", 64), ("a100-80gb", 16), ("l40s", 16), ("mi300x", 16)]
    + [("mi325x-8", 16), ("tpu-v5p", 8)],
)
def test_matrix_rows_follow_the_chips_own_row_before_its_kinds(chip, rows):
    """NVIDIA's wgmma (M = 64) is the GPU default; Ampere/Ada (mma.sync) and AMD CDNA 3 (MFMA) pad to 16 rows."""
    c = get_chip(chip)
    assert timing.chip_constant("matmul_rows", c).value == rows
    plan = build_plan(get_config("tiny-moe"), 1, 64, weight_dtype="bfloat16", kv_dtype="bfloat16")
    m1 = next(op for op in plan.ops if isinstance(op, MatmulTile))
    assert timing.compute_seconds(plan, c)(m1) == pytest.approx(m1.flops * rows / (c.bf16_flops / c.chips))
    assert timing.constant("matmul_rows", "gpu").value == 64  # without a chip: the kind's row


def test_link_latency_per_kind_and_vendor():
    assert timing.link_latency(get_chip("h100")) == 0.0  # one chip: no link
    for chip in ("h100-8", "h200-8", "b200-8", "a100-40gb-8", "a100-80gb-8", "h20-8"):
        assert timing.link_latency(get_chip(chip)) == pytest.approx(6e-7)
    for chip in ("tpu-v4-8", "tpu-v5p-8", "tpu-v7x-8"):
        assert timing.link_latency(get_chip(chip)) == pytest.approx(1e-6)
    with pytest.raises(ValueError, match="no link latency for mi300x"):
        timing.link_latency(get_chip("mi300x-8"))
    with pytest.raises(ValueError, match=r"no interconnect bandwidth for mi325x \(ici_bandwidth_Bps\)"):
        timing.link_latency(get_chip("mi325x-8"))


def test_step_breakdown_adds_up_and_names_the_int8_scale_blocks():
    for dtype in ("bf16", "int8-experts"):
        b = timing.step_breakdown(MOE, "tpu-v5e-8", 1024, 1, dtype)
        p = timing.predict(MOE, "tpu-v5e-8", 1024, 1, dtype=dtype)
        assert b["step_s"] == pytest.approx(p.step_s) and b["fraction_of_sol"] == pytest.approx(p.fraction_of_sol)
        assert b["weights_moved_bytes"] >= b["weights_real_bytes"] > 0
        assert 0 < b["hbm_floor_s"] <= b["step_s"]
        assert (b["scale_blocks_bytes"] > 0) == (dtype != "bf16")


def test_the_straggler_costs_the_busiest_chips_step_over_an_average_chips():
    c = straggler_cost(MOE, "tpu-v5e-8", 1024, 1)
    assert c["busiest_experts"] > 2.5 and c["average_experts"] == pytest.approx(1.0)  # 128 experts, 8 chips, top-8
    assert c["whole_step_s"] > c["average_chip_step_s"] > 0
    assert c["straggler_s"] == pytest.approx(c["whole_step_s"] - c["average_chip_step_s"])
    # the same steps predict gives for the setup it names, each way (the write-up's kernel by default)
    whole = timing.predict(MOE, "tpu-v5e-8", 1024, 1, setup=WRITE_UP_KERNEL.but(placement="whole"))
    assert c["whole_step_s"] == pytest.approx(whole.step_s, rel=1e-12) and c["setup"] == WRITE_UP_KERNEL.name
    assert c["split_step_s"] == pytest.approx(timing.predict(MOE, "tpu-v5e-8", 1024, setup=WRITE_UP_KERNEL).step_s)
    t = straggler_table(MOE, "tpu-v5e", [2, 8], [1])
    assert t.chips.tolist() == [2, 8] and (t.straggler_ms > 0).all()
    with pytest.raises(ValueError, match="dense model"):
        straggler_cost("gemma4-31b", "tpu-v5e-8")
    with pytest.raises(ValueError, match="one chip"):
        straggler_cost(MOE, "tpu-v5e")


def test_assumed_costs_come_from_the_data_file_and_a_given_one_is_said_so():
    rows = [c for c in timing.constants() if c.kind == "assumed"]
    # the core's costs, and a copy's latency until a chip of the kind measures it (mk.timing.bandwidth.copy_latency)
    assert {c.name for c in rows} == {*timing.ASSUMED, "dma_latency_s"} and all(c.source for c in rows)
    default = timing.predict(MOE, "tpu-v5e-8", 4096, 2)  # a plan data/schedule keeps no schedule of
    assert default.op_costs == "assumed" and default.constants["op_overhead_s"].endswith("(assumed, data/timing.csv)")
    more = timing.predict(MOE, "tpu-v5e-8", 4096, 2, costs=timing.GivenCosts(1e-6, 1e-6))
    assert more.step_s > default.step_s and more.constants["op_overhead_s"].endswith("(given)")
    with pytest.raises(ValueError, match="unknown assumed cost"):
        timing.assumed_costs("tpu", per_layer_s=1.0)


CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"


@pytest.mark.parametrize("model", ["llama-3.2-1b", "qwen3-8b", "qwen3-30b-a3b", "gemma4-31b", "deepseek-v3"])
def test_cli_sol_and_predict_answer_for_a_config_json(model, mk_json, tmp_path):
    """``python -m mk sol|predict --model path/to/config.json``: every family's config read from its file (Gemma 4 31B
    as transformers writes it), both engines, never faster than the speed of light; the megakernel's kernel count 1."""
    if model == "gemma4-31b":
        (tmp_path / "config.json").write_text(json.dumps(to_hf_dict(get_config(model))))
        path = tmp_path / "config.json"
    else:
        path = CONFIGS / model / "config.json"
    args = ["--model", path, "--chip", "h100", "--context", 1024, "--json"]
    sol = mk_json("sol", *args)
    for engine in timing.ENGINES:
        d = mk_json("predict", *args, "--engine", engine)
        assert d["engine"] == engine and d["kind"].startswith("modelled")
        assert d["step_ms"] >= sol["step_ms"] * (1 - 1e-12) and 0 < d["fraction_of_sol"] <= 1
        assert (d["kernels_per_step"] == 1) == (engine == "megakernel")


def test_cli_unknown_model_type_exits_2_naming_the_families(tmp_path, capsys):
    from mk.__main__ import main

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba", "hidden_size": 8}))
    for command in ("sol", "predict"):
        assert main([command, "--model", str(tmp_path), "--chip", "h100", "--context", "64"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "'mamba'" in err and "llama" in err and "deepseek_v3" in err, err


def test_a_copys_latency_is_paid_where_the_stream_runs_dry_and_measured_where_a_chip_measured_it(tmp_path):
    """mk.plan.timeline charges ``dma_latency_s`` before a copy's first byte only where nothing is moving (the step's
    first copy, a read the core waits on): the step grows by at least one latency and by less than one a copy. The
    chip's latency is the intercept of one copy's time alone against its size, from the newest run on such a chip."""
    from mk.chips import measured_copy_latency
    from mk.measure import dma_latency
    from mk.plan import timeline
    from mk.timing.bandwidth import copy_latency

    plan = build_plan(get_config("tiny-moe"), 2, 64, weight_dtype="bfloat16", kv_dtype="bfloat16")
    chip, bw = get_chip("tpu-v5e"), 700e9
    end = [max(r["end_s"] for r in timeline(plan, chip, bandwidth=bw, dma_latency_s=s)) for s in (0.0, 1e-6)]
    copies = len(plan.loads) + sum(1 for op in plan.ops if op.serial_bytes)
    assert 1e-6 <= end[1] - end[0] < copies * 1e-6
    assert copy_latency(chip).kind in ("assumed", "measured")
    # each call: its copies and a fixed 60 us (the older run's 70 us), but for one call of 90 us (the median skips it)
    rows = [dict(dict.fromkeys(dma_latency.COLUMNS, ""), date=d, device="tpu: TPU v5 lite", nbytes=n, copy_us=us,
                 trips=trips, device_us=call + trips * us)
            for d, runs in (("2026-01-01", ((4096, 9.0, 70), (2**22, 20.0, 70))),  # an older run
                            ("2026-02-01", ((4096, 1.5 + 4096 / 800e3, 60), (2**22, 1.5 + 2**22 / 800e3, 60))))
            for n, us, fixed in runs for trips, call in ((200, fixed), (2000, fixed if n > 4096 else 90))]  # fmt: skip
    rows.append(dict(rows[-1], device="tpu: TPU v6 lite", copy_us=99.0))  # another kind of chip
    path = tmp_path / "tpu_dma.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, dma_latency.COLUMNS)  # the columns mk.measure.dma_latency writes
        w.writeheader()
        w.writerows(rows)
    got = measured_copy_latency("tpu-v5e-8", path)
    assert got.seconds == pytest.approx(1.5e-6) and got.copy_rate == pytest.approx(800e9) and got.sizes == 2
    assert got.call_seconds == pytest.approx(60e-6)
    assert measured_copy_latency("tpu-v5e", tmp_path / "none.csv") is None
