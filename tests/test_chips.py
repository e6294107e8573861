"""Chip specs from data/chips.csv, slices derived from them, and errors for unknown names."""

import csv
import math
from types import SimpleNamespace

import pytest

from mk.chips import base_chips, get_chip, known_chip, known_chips
from mk.paths import CHIPS_CSV

NEW_CHIPS = ("a100-40gb", "a100-80gb", "h20", "l40s", "mi300x", "mi325x", "tpu-v4", "tpu-v5p")


def test_required_chips_with_sources():
    chips = base_chips()
    for name in ("tpu-v5e", "tpu-v6e", "tpu-v7x", "h100", "h200", "b200", *NEW_CHIPS):
        assert name in chips
    for c in chips.values():
        assert c.source.strip(), f"{c.name} has no source"
        assert c.kind in ("tpu", "gpu"), c.name
        assert c.hbm_bandwidth > 0 and c.hbm_bytes > 0 and c.bf16_flops > 0 and c.chips == 1
        assert math.isnan(c.ici_bandwidth) or c.ici_bandwidth > 0, c.name
        assert math.isnan(c.vmem_bytes) or (c.vmem_bytes > 0 and c.kind == "tpu"), c.name


@pytest.mark.parametrize(
    "name, linked",
    [("a100-40gb", True), ("a100-80gb", True), ("h20", True), ("mi300x", True), ("tpu-v4", True), ("tpu-v5p", True)]
    + [("tpu-v7x", True), ("l40s", False), ("mi325x", False)],
)
def test_interconnect_bandwidth_where_the_chip_has_a_cited_link(name, linked):
    """One way per link (TPUs) or per GPU (NVLink, Infinity Fabric); empty for a PCIe-only GPU (L40S) and where
    no figure was found (MI325X)."""
    c = get_chip(name)
    assert (c.ici_bandwidth > 0) if linked else math.isnan(c.ici_bandwidth)
    assert "dense" in c.source or c.kind == "tpu"  # GPU FLOP/s are dense (no sparsity), and say so


def test_values_read_from_the_csv_not_typed_in_code():
    with open(CHIPS_CSV, newline="") as f:
        rows = {r["name"]: r for r in csv.DictReader(f)}
    assert get_chip("h100").hbm_bandwidth == float(rows["h100"]["hbm_bandwidth_Bps"])
    assert get_chip("tpu-v5e").vmem_bytes == float(rows["tpu-v5e"]["vmem_bytes"])


@pytest.mark.parametrize("name, n", [("tpu-v5e-8", 8), ("tpu-v6e-8", 8), ("h100-8", 8), ("tpu-v7x-4", 4)])
def test_slices_add_up_per_chip_values(name, n):
    s, base = get_chip(name), get_chip(name.rsplit("-", 1)[0])
    assert s.chips == n and s.base == base.name and s.name == name
    assert s.hbm_bandwidth == pytest.approx(n * base.hbm_bandwidth)
    assert s.hbm_bytes == pytest.approx(n * base.hbm_bytes)
    assert s.bf16_flops == pytest.approx(n * base.bf16_flops)
    assert s.per_chip_bandwidth == pytest.approx(base.hbm_bandwidth)
    assert (math.isnan(s.ici_bandwidth) and math.isnan(base.ici_bandwidth)) or s.ici_bandwidth == base.ici_bandwidth


def test_seed_slice_bandwidths():
    # The seed: "Google TPU v5e, 8 chips | 6.55 TB/s", "TPU v6e, 8 chips | 13.1 TB/s".
    assert get_chip("tpu-v5e-8").hbm_bandwidth == pytest.approx(6.55e12, rel=1e-3)
    assert get_chip("tpu-v6e-8").hbm_bandwidth == pytest.approx(13.1e12, rel=2e-3)


def test_names_are_case_and_space_insensitive():
    assert get_chip(" H100 ") == get_chip("h100")
    assert get_chip("TPU-V5E-8").chips == 8


@pytest.mark.parametrize("name", ["a100", "tpu-v5e-0", "tpu-v9-8", "", "h100-x"])
def test_unknown_chip_lists_known_ones(name):
    with pytest.raises(ValueError) as e:
        get_chip(name)
    msg = str(e.value)
    assert f"unknown chip {name!r}" in msg
    assert all(k in msg for k in known_chips())
    assert "tpu-v5e-8" in msg  # says how to ask for a slice


@pytest.mark.parametrize(
    "platform, kind, chip",
    [
        ("gpu", "NVIDIA H200", "h200"),
        ("gpu", "NVIDIA H100 80GB HBM3", "h100"),
        ("gpu", "NVIDIA H20", "h20"),
        ("gpu", "NVIDIA L40S", "l40s"),
        ("tpu", "TPU v5 lite", "tpu-v5e"),
        ("tpu", "TPU v6 lite", "tpu-v6e"),
        ("tpu", "TPU7x", "tpu-v7x"),
        ("tpu", "TPU v4", "tpu-v4"),
        ("tpu", "TPU v5", "tpu-v5p"),  # as libtpu 0.0.42.1 names a v5p topology's devices
        ("tpu", "TPU v3", None),
        ("cpu", "cpu", None),
    ],
)
def test_the_chip_a_device_is(platform, kind, chip):
    """A JAX device's kind as its platform names it, to its row of data/chips.csv (None: no known chip)."""
    assert known_chip(SimpleNamespace(platform=platform, device_kind=kind)) == chip


def test_documented_slice_shapes_multiply_out_and_v5e_and_v6e_hosts_hold_eight_chips():
    from mk.chips import slice_shapes

    shapes = slice_shapes()
    for base in ("tpu-v5e", "tpu-v6e"):  # both 256-chip pods on a 2D torus
        assert [s.chips for s in shapes[base]] == [1, 4, 8, 16, 32, 64, 128, 256]
        assert all(s.hosts * 8 == s.chips for s in shapes[base])  # 8 chips a host; the smaller slices share one
    assert [s.torus for s in shapes["tpu-v6e"][-2:]] == [((8, False), (16, True)), ((16, True), (16, True))]
    assert "tpu-v7x" not in shapes  # its topologies are listed publicly, not which dimensions wrap around
    assert all(len(s.dims) == 3 for s in shapes["tpu-v5p"]) and all(len(s.dims) == 2 for s in shapes["tpu-v5e"])
    assert all(get_chip(s.name).chips == s.chips for v in shapes.values() for s in v)


@pytest.mark.parametrize("model, dtype", [("kimi-k2", "bf16"), ("kimi-k2", "int4"), ("gemma4-26b-a4b", "bf16")])
def test_the_smallest_slice_holds_the_model_and_the_one_before_it_does_not(model, dtype):
    from mk.chips import slice_shapes
    from mk.sol import smallest_slices, speed_of_light

    for r in smallest_slices(model, 1024, 1, dtype).itertuples():
        names = [s.name for s in slice_shapes()[r.chip]]
        assert r.fits and speed_of_light(model, r.slice, 1024, 1, dtype).fits_in_hbm
        i = names.index(r.slice)
        assert i == 0 or not speed_of_light(model, names[i - 1], 1024, 1, dtype).fits_in_hbm


def test_kimi_k2_needs_a_v5e_pod_at_bf16_and_no_documented_v5e_slice_holds_it_in_f32(mk_json):
    got = {
        r["chip"]: r
        for r in mk_json("sol", "--model", "kimi-k2", "--chip", "auto", "--context", 1024, "--json")["slices"]
    }
    assert got["tpu-v5e"]["slice"] == "tpu-v5e-256" and got["tpu-v5e"]["fits"]
    f32 = {
        r["chip"]: r
        for r in mk_json("sol", "--model", "kimi-k2", "--chip", "auto", "--context", 1024, "--dtype", "f32", "--json")[
            "slices"
        ]
    }
    assert f32["tpu-v5e"]["slice"] == "tpu-v5e-256" and not f32["tpu-v5e"]["fits"]


def test_the_engine_finds_the_chip_it_compiles_for_from_its_device():
    """mk.chips.compile_target: a TPU device's chip (its VMEM limit's), None off a TPU (the interpreter), and a TPU
    generation data/chips.csv lacks refused by name, as is a v7x TensorCore (two devices a chip: not one kernel's)."""
    import jax

    from mk.chips import compile_target

    class Device:
        platform = "tpu"

        def __init__(self, kind):
            self.device_kind = kind

    assert compile_target(Device("TPU v5 lite")) == "tpu-v5e" and compile_target(Device("TPU v6 lite")) == "tpu-v6e"
    assert compile_target(jax.devices()[0]) is None
    with pytest.raises(ValueError, match="no VMEM budget for a 'TPU v9'"):
        compile_target(Device("TPU v9"))
    with pytest.raises(ValueError, match="each tpu-v7x chip is 2 devices"):
        compile_target(Device("TPU7x"))


def test_a_compiled_kernel_gets_the_plans_vmem_limit_for_its_chip():
    """The kernel's Mosaic parameters carry the plan's VMEM limit for the chip it is compiled for (the engine and the
    ahead-of-time compile both build it through build_call); a compile without a chip is refused."""

    from mk.config import TINY_MOE
    from mk.megakernel.kernel import build_call, compiler_params
    from mk.plan import build_plan

    plan = build_plan(TINY_MOE, 2, 64)
    assert compiler_params(plan, "tpu-v5e").vmem_limit_bytes == plan.vmem_limit("tpu-v5e") > plan.vmem_bytes
    assert compiler_params(plan, None).vmem_limit_bytes is None  # interpreted: no compiler
    with pytest.raises(ValueError, match="needs its target chip"):
        build_call(plan)
