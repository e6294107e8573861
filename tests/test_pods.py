"""Slices past one host: the torus all-reduce (priced here; the kernel runs it: tests/test_sharding.py), placement
'hosts' (timed, not run), the fit, the all-reduce's share."""

import pytest

from mk.chips import get_chip, slice_shape
from mk.kernel_setup import WORKBOOK_KERNEL, Collective, Placement
from mk.sharding import flat_ring_all_reduce, one_link_all_reduce, ring_hops, torus_all_reduce, torus_best
from mk.sharding.pods import pod_setup
from mk.sol import auto_chip
from mk.timing import named_plan, predict, step_plan


def test_wraparound_is_read_from_the_slice_rows_as_documented():
    assert slice_shape(get_chip("tpu-v5e-256")).torus == ((16, True), (16, True))
    assert slice_shape(get_chip("tpu-v5e-128")).torus == ((8, False), (16, True))  # the longer axis wraps
    assert slice_shape(get_chip("tpu-v5e-16")).torus == ((4, False), (4, False))
    # a v5p slice is named by its TensorCores, two a chip (Google's AcceleratorType): v5p-128 is a 64-chip cube
    assert slice_shape(get_chip("tpu-v5p-128")).torus == ((4, True),) * 3  # a full cube
    assert slice_shape(get_chip("tpu-v5p-64")).torus == ((2, False), (4, False), (4, False))
    assert get_chip("tpu-v5p-8").chips == 4 and slice_shape(get_chip("tpu-v5p-8")).topology == "2x2x1"
    assert (
        slice_shape(get_chip("tpu-v5e-8")).chips_per_host == 8
        and slice_shape(get_chip("tpu-v5p-128")).chips_per_host == 4
    )
    with pytest.raises(ValueError, match="named by its TensorCores, 2 a chip"):
        get_chip("tpu-v5p-7")
    assert slice_shape(get_chip("tpu-v7x-8")) is None and get_chip("tpu-v7x-8").chips == 8


def test_torus_all_reduce_goes_dimension_by_dimension():
    assert (ring_hops(16, True), ring_hops(4, False), ring_hops(1, True)) == (8, 3, 0)
    # 2 bf16 rows of 7168 lanes over 16x16: 3584 lanes -> 448 -> 512 lanes (whole tiles), then 32 -> 128
    ex = torus_all_reduce(2, 7168, 2, ((16, True), (16, True)))
    x, y = 2 * 512 * 2, 2 * 128 * 2
    assert ex.rounds == 2 * (8 + 8)
    assert ex.sent_bytes == 2 * 15 * x + 2 * 15 * y and ex.link_bytes == 2 * 8 * x + 2 * 8 * y
    # without wraparound a line's end shards cross every link: n - 1 hops, (n - 1) shards on the busiest link
    line = torus_all_reduce(1, 1024, 4, ((4, False),))
    assert line.rounds == 6 and line.link_bytes == 2 * 3 * 256 * 4
    # the flat ring over all 256 chips waits 8x the torus's rounds
    assert flat_ring_all_reduce(2, 7168, 2, 256).rounds == 256
    # the greedy pick's best: the block keeps its size, each dimension's group keeping its best
    assert torus_best(8192, ((16, True), (16, True))).link_bytes == 8 * 8192 + 8 * 8192
    # one host's model is the one-link one, unchanged
    coll = Collective(bf16_payload=True, reduce_scatter=True)
    assert one_link_all_reduce(coll, 2, 7168, 8, 2).rounds == 2


def test_one_host_keeps_its_setup_and_a_pod_gets_the_torus_and_whole_experts_over_hosts():
    from mk.config import get_config

    kimi = get_config("kimi-k2")
    assert pod_setup(WORKBOOK_KERNEL, get_chip("tpu-v5e-8"), kimi) == WORKBOOK_KERNEL.on(8)
    s = pod_setup(WORKBOOK_KERNEL, get_chip("tpu-v5e-256"), kimi)
    assert s.placement == Placement.HOSTS and s.host_chips == 8 and s.torus == ((16, True), (16, True))
    plan = named_plan("kimi-k2", "tpu-v5e-256", 1024, 1, WORKBOOK_KERNEL)
    assert plan.expert_groups == 32 and plan.experts_held == 12 and plan.share.expert_intermediate == 256
    assert plan.share.num_heads == 1  # 64 heads over 64 of the 256 chips, each repeated 4 times


def test_4_bit_experts_split_in_whole_groups_as_they_run():
    """gpt-oss-120b's 2,880-wide experts split over 8 chips would leave 360 rows a chip, which cut MXFP4's groups of
    32: the setup the timing model charges and the kernel runs rounds each chip's slice up to 384 (chip 7's last 192
    zeros), in the 4-bit formats only; Kimi K2's INT4 experts over a host's 8 chips (256 rows) are whole groups. The
    plan timed is the format's own, its bytes the codes' and scales'."""
    from mk.config import get_config

    oss, kimi, v5e8 = get_config("gpt-oss-120b"), get_config("kimi-k2"), get_chip("tpu-v5e-8")
    for dtype, rows in (("mxfp4", 32), ("int4", 32), ("bf16", 1), ("fp8-block", 1)):
        assert pod_setup(WORKBOOK_KERNEL, v5e8, oss, dtype=dtype).expert_rows == rows
    bf16, mx = (named_plan("gpt-oss-120b", "tpu-v5e-8", 1024, 1, WORKBOOK_KERNEL, d) for d in ("bf16", "mxfp4"))
    assert (bf16.share.expert_intermediate, mx.share.expert_intermediate, mx.quantize) == (360, 384, "mxfp4")
    assert mx.setup.placement == Placement.SPLIT and "whole groups of 32 rows" in mx.setup.name
    assert sum(ld.nbytes for ld in mx.loads) < 0.6 * sum(ld.nbytes for ld in bf16.loads)
    s = pod_setup(WORKBOOK_KERNEL, get_chip("tpu-v5e-128"), kimi, dtype="int4")
    assert s.placement == Placement.HOSTS and s.expert_rows == 1


def test_mla_down_projections_split_by_rows_where_that_reads_fewer_bytes_a_chip():
    """Kimi K2's q_a and kv_a (7,168 rows) over a slice's chips in whole-lane blocks of rows, at most one a chip: 896
    over 8 chips, 512 over 16 (chips 14 and 15 hold zeros), 128 over 128 (chips 56-127); whole on one chip and with
    ``latent_down`` whole. Over a v5e-128 in FP8 blocks the split reads 54.8x fewer of their bytes a chip (0.94 GB a
    step) and adds an all-reduce of their partial sums a layer, which the model charges on the torus's links."""
    from mk.config import get_config
    from mk.kernel_setup import WRITE_UP_KERNEL
    from mk.plan import AllReduce
    from mk.sharding import latent_down_rows

    kimi = get_config("kimi-k2")
    rows = {c: latent_down_rows(kimi, WRITE_UP_KERNEL.on(c)) for c in (1, 8, 16, 128)}
    assert rows == {1: 0, 8: 896, 16: 512, 128: 128}
    assert latent_down_rows(kimi, WRITE_UP_KERNEL.but(chips=8, latent_down="whole")) == 0
    split, whole = (WRITE_UP_KERNEL, WRITE_UP_KERNEL.but(latent_down="whole"))
    plans = [named_plan("kimi-k2", "tpu-v5e-128", 1024, 1, s, "fp8-block") for s in (split, whole)]
    down = [sum(ld.nbytes for ld in p.loads if ld.tensor.endswith(("q_a", "kv_a"))) for p in plans]
    assert {ld.rows for ld in plans[0].loads if ld.tensor.endswith("q_a")} == {(0, 128)}
    assert down[1] - down[0] > 0.9e9 and down[1] / down[0] == pytest.approx(54.8, abs=0.05)
    assert plans[1].weight_bytes - plans[0].weight_bytes == pytest.approx(down[1] - down[0])  # the rest as it was
    sums = [[op.acts for op in p.ops if isinstance(op, AllReduce)] for p in plans]
    assert sums[0].count(("qa", "kva")) == kimi.num_layers and len(sums[0]) == len(sums[1]) + kimi.num_layers
    timed = [predict("kimi-k2", "tpu-v5e-128", 1024, setup=s, dtype="fp8-block") for s in (split, whole)]
    assert timed[0].pacing.ici_s > timed[1].pacing.ici_s


@pytest.mark.parametrize("batch", [1, 8])
def test_kimi_k2_on_a_v5e_pod_pays_more_for_its_all_reduce_than_on_one_host(batch):
    one, pod = (predict("kimi-k2", c, 1024, batch) for c in ("tpu-v5e-8", "tpu-v5e-256"))
    assert pod.pacing.ici_s > 2 * one.pacing.ici_s
    # the straggler: the busiest of 32 hosts fetches more than the mean of its share of the k x B routed experts
    plan = step_plan(*_args("tpu-v5e-256", batch))
    mean = sum(n * p for n, p in plan.distinct_experts.items())
    assert pod.pacing.experts_per_layer > mean
    assert pod.pacing.expert_share == 1 / 8 and 0 < pod.fraction_of_sol < 1
    assert "busiest of 32 hosts" in pod.models


def _args(chip, batch):
    from mk.config import get_config

    return get_config("kimi-k2"), get_chip(chip), 1024, batch, "bf16", WORKBOOK_KERNEL


def test_the_fit_is_said_plainly():
    one, pod = predict("kimi-k2", "tpu-v5e-8", 1024), predict("kimi-k2", "tpu-v5e-256", 1024)
    assert not one.fits_in_hbm and "do not fit" in one.to_dict()["fit_note"]
    assert pod.fits_in_hbm and pod.to_dict()["fits_in_hbm"]
    assert predict("kimi-k2", "tpu-v5p-32", 1024, dtype="fp8-block").fits_in_hbm
    assert auto_chip("kimi-k2", "tpu-v5e", "bf16").name == "tpu-v5e-256"
    assert auto_chip("kimi-k2", "tpu-v7x", "fp8-block").name == "tpu-v7x-8"  # no slice rows: powers of two
    # no slice rows for v4: powers of two of chips, each named by its TensorCores (2 chips: tpu-v4-4)
    assert auto_chip("gemma4-31b", "tpu-v4").chips == 2 and auto_chip("gemma4-31b", "tpu-v4").name == "tpu-v4-4"
    with pytest.raises(ValueError, match="fits no documented tpu-v5e slice"):
        auto_chip("kimi-k2", "tpu-v5e", "f32")


def test_the_all_reduce_share_grows_with_the_slice():
    from mk.analysis.allreduce import allreduce_share, torus_against_ring

    t = allreduce_share("kimi-k2", chips=(8, 64, 256))
    assert list(t.topology) == ["2x4", "8x8", "16x16"] and list(t.placement) == ["split", "hosts", "hosts"]
    assert t.allreduce_ms.is_monotonic_increasing and t.share.is_monotonic_increasing
    r = torus_against_ring("tpu-v5e-256", [28672]).set_index("algorithm").exchange_us
    assert r.iloc[0] < r.iloc[1]  # the torus beats one ring through all 256 chips


def test_predict_says_where_kimi_k2_fits_and_picks_the_smallest_slice(mk_json):
    """``python -m mk predict`` for Kimi K2: it does not fit a v5e-8 in BF16 (and says the time assumes it did), it
    fits a v5p-32 in FP8 blocks and a v5e-256 in BF16; ``--chip auto`` picks that v5e-256; the time on the links
    between chips is larger over 256 chips than over 8."""

    def predict_json(chip, dtype="bf16"):
        return mk_json("predict", "--model", "kimi-k2", "--chip", chip, "--context", 1024, "--dtype", dtype, "--json")

    one = predict_json("tpu-v5e-8")
    assert not one["fits_in_hbm"] and "do not fit tpu-v5e-8's HBM in bf16; the time assumes" in one["fit_note"]
    assert predict_json("tpu-v5p-32", "fp8-block")["fits_in_hbm"]
    pod, auto = predict_json("tpu-v5e-256"), predict_json("auto")
    assert pod["fits_in_hbm"] and auto["chip"] == "tpu-v5e-256" and auto["chip_picked"] and not pod["chip_picked"]
    assert pod["links_ms"] > 2 * one["links_ms"] > 0
    assert predict_json("auto", "fp8-block")["chip"] == "tpu-v5e-128"  # half the bytes: half the chips
