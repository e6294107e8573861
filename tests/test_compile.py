"""``python -m mk compile``: the step compiled ahead of time for TPU slices past one host (libtpu's topology
descriptions, no TPU), and ``--multi-host``'s refusal off a slice. The compiles need libtpu and skip without it."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mk.chips import get_chip, slice_shape
from mk.config import GEMMA4_26B_A4B, to_hf_dict
from mk.megakernel.aot import aot_target
from mk.plan.schedule import pattern_period
from mk.tpu import TOPOLOGIES

ROOT = Path(__file__).resolve().parent.parent
needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="AOT compilation for TPU needs libtpu (pip install -r requirements-tpu.txt)",
)


def test_slices_compile_for_the_topology_their_documented_shape_names():
    """A slice's topology is read from data/slices.csv; a topology name gives its slice; the hand table agrees with
    the data where both have a slice."""
    for name in ("tpu-v5e-16", "tpu-v5e-64", "tpu-v5p-8"):
        shape = slice_shape(get_chip(name))
        assert aot_target(name) == (name, f"{shape.chip.removeprefix('tpu-')}:{shape.topology}")
    assert aot_target("tpu-v5e-16")[1] == "v5e:4x4" and aot_target("tpu-v5p-16")[1] == "v5p:2x2x2"
    assert aot_target("v5p:2x2x2") == ("tpu-v5p-16", "v5p:2x2x2")  # a v5p slice named by its TensorCores
    assert aot_target("v6e:4x4") == ("tpu-v6e-16", "v6e:4x4")
    for name, topo in TOPOLOGIES.items():
        shape = slice_shape(get_chip(name))
        if shape is not None and shape.chips > 1:
            assert shape.topology_name == topo
    for bad in ("tpu-v5e-3", "h100-8", "v5e:4xq"):
        with pytest.raises(ValueError, match="topology"):
            aot_target(bad)


def _run(*args):
    return subprocess.run([sys.executable, "-m", "mk", *args], capture_output=True, text=True, cwd=ROOT, timeout=600)


def test_a_model_too_big_for_the_slice_is_refused_in_one_line():
    """The plan's bytes a chip holds against its HBM, before anything compiles (no libtpu needed)."""
    out = _run("compile", "--model", "gemma4-31b", "--chip", "tpu-v5e")
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not fit tpu-v5e" in lines[0] and "GB of HBM" in lines[0], out.stderr


def _tuple_table_bytes() -> int:
    """What the compiler's output figure adds for a tuple of outputs (its index table) beyond the arrays: measured
    on a two-output program."""
    import jax
    import jax.numpy as jnp

    from mk.tpu import aot_compile

    x = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    m = aot_compile(lambda a: (a, a * 2), "tpu-v5e", x).memory_analysis()
    return m.output_size_in_bytes - 2 * x.size * x.dtype.itemsize


@needs_libtpu
def test_one_chip_compiles_with_its_plans_bytes(mk_json):
    """``mk compile`` on one chip (no setup to split the step): the plan's bytes, the setup named one chip."""
    d = mk_json("compile", "--model", "tiny-dense", "--chip", "tpu-v5e", "--no-vmem", "--json")
    assert (d["chips"], d["mosaic_calls"], d["setup"]) == (1, 1, "one chip")
    assert d["compiler_argument_bytes"] == d["plan_bytes"]


@needs_libtpu
def test_tiny_moe_compiles_over_a_two_host_slice_as_planned(mk_json):
    """tiny-moe over a v5e-16 (v5e:4x4, more than one host): one Mosaic call a chip, and each chip's arguments as the
    compiler lays them out are the plan's weights, cache and users block, byte for byte; the outputs are the cache
    (written in place) and the users block, plus the tuple's index table."""
    from mk.tpu import topology

    d = mk_json("compile", "--model", "tiny-moe", "--chip", "tpu-v5e-16", "--json")
    assert (d["chips"], d["topology"], d["mosaic_calls"]) == (16, "v5e:4x4", 1)
    assert d["hosts"] == len({dev.process_index for dev in topology("v5e:4x4").devices}) > 1
    assert (
        d["compiler_argument_bytes"]
        == d["plan_bytes"]
        == d["plan_weight_bytes"] + d["plan_cache_bytes"] + d["plan_users_bytes"]
    )
    assert d["compiler_alias_bytes"] == d["plan_cache_bytes"]
    assert d["compiler_output_bytes"] == d["plan_cache_bytes"] + d["plan_users_bytes"] + _tuple_table_bytes()
    assert d["compiler_vmem_bytes"] < d["vmem_limit_bytes"]
    _assert_plan_vmem_is_the_compilers(d)
    assert "all-reduce over the 4x4 torus" in d["setup"]  # past one host the kernel's all-reduce goes round the torus


def _assert_plan_vmem_is_the_compilers(d: dict) -> None:
    """The plan's VMEM, its cross-chip buffers counted, is the compiler's figure within 5% (Mosaic adds a little; the
    compiler rounds its figure to three digits)."""
    assert d["plan_vmem_bytes"] <= d["compiler_vmem_bytes"] * 1.01
    assert d["compiler_vmem_bytes"] <= 1.05 * d["plan_vmem_bytes"], (d["plan_vmem_bytes"], d["compiler_vmem_bytes"])


@needs_libtpu
@pytest.mark.parametrize("chip, topology", [("tpu-v5e-64", "v5e:8x8"), ("tpu-v5p-128", "v5p:4x4x4")])
def test_tiny_moe_compiles_over_an_eight_host_torus_and_a_v5p_cube_as_planned(mk_json, chip, topology):
    """Past 16 chips the cross-chip ops' peers share their DMA semaphores (one a semaphore per peer overran libtpu's
    semaphore memory at 32 chips): tiny-moe compiles over a v5e 8x8 (64 chips) and a v5p 4x4x4 cube (64 chips, a 3D
    torus), its all-reduce round the torus, one Mosaic call a chip, each chip's arguments the plan's byte for byte,
    its VMEM (the cross-chip buffers half of it) the compiler's figure within 5%."""
    d = mk_json("compile", "--model", "tiny-moe", "--chip", chip, "--json")
    assert (d["chips"], d["topology"], d["mosaic_calls"]) == (64, topology, 1) and d["hosts"] > 1
    assert f"all-reduce over the {topology.split(':')[1]} torus" in d["setup"]
    assert d["compiler_argument_bytes"] == d["plan_bytes"]
    assert d["compiler_alias_bytes"] == d["plan_cache_bytes"]
    _assert_plan_vmem_is_the_compilers(d)


def test_a_chips_semaphores_stop_growing_with_the_slice_past_sixteen_chips():
    """One DMA semaphore a peer up to mk.kernel_setup.PEER_SEMAPHORE_CHIPS chips (the kernel whose schedules
    data/schedule stores), one shared past it: the cross-chip ops keep as many semaphores on 256 chips as on 32."""
    from mk.config import TINY_MOE
    from mk.kernel_setup import PEER_SEMAPHORE_CHIPS, WORKBOOK_KERNEL
    from mk.megakernel.refs import collective_shapes
    from mk.plan import build_plan

    def sems(chips):
        c = collective_shapes(build_plan(TINY_MOE, 1, 1024, setup=WORKBOOK_KERNEL.on(chips)))
        return [s.shape for ex in c.exchange.values() for s in (ex.send_sem, ex.recv_sem)] + [c.sems.shape]

    assert sems(8)[0] == (2, 8) and sems(PEER_SEMAPHORE_CHIPS)[0] == (2, PEER_SEMAPHORE_CHIPS)
    assert sems(32) == sems(256) and sems(32)[0] == (2, 1)


@needs_libtpu
@pytest.mark.slow
def test_full_size_moe_compiles_over_an_eight_host_slice(mk_json, tmp_path):
    """gemma4-26b-a4b at full width (bf16), one period of its layer pattern given as a config.json the way a user
    gives one, over a v5e-64 (8x8, its all-reduce round the torus, its peers sharing semaphores): one Mosaic call a
    chip, the plan's bytes a chip holds byte for byte, within its HBM. The whole model's loop over layers at full
    width compiles in tests/test_tpu_aot.py; its 30 layers here took 50 s, one period 14 s."""
    config = tmp_path / "gemma4-26b-a4b-6" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(to_hf_dict(GEMMA4_26B_A4B.truncated(pattern_period(GEMMA4_26B_A4B.layer_types)))))
    d = mk_json("compile", "--model", config, "--chip", "tpu-v5e-64", "--no-vmem", "--json")
    assert d["mosaic_calls"] == 1 and d["hosts"] > 1
    assert d["compiler_argument_bytes"] == d["plan_bytes"] < d["hbm_bytes"]
    assert d["compiler_alias_bytes"] == d["plan_cache_bytes"]


def test_multi_host_is_refused_off_a_slice():
    out = _run("generate", "--multi-host", "--model", "tiny-moe", "--prompt-ids", "1,2", "--new-tokens", "1")
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--multi-host" in lines[0] and "--worker=all" in lines[0], out.stderr


def test_multi_host_joins_the_runtime_and_refuses_a_lone_process(monkeypatch):
    """Where jax.distributed.initialize() starts, the process count decides: one process is refused (and the runtime
    shut down again), more are returned."""
    import jax

    from mk.tpu import start_multi_host

    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda: calls.append("initialize"))
    monkeypatch.setattr(jax.distributed, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(jax, "process_count", lambda: 1)
    with pytest.raises(ValueError, match="only process"):
        start_multi_host()
    assert calls == ["initialize", "shutdown"]
    monkeypatch.setattr(jax, "process_count", lambda: 4)
    assert start_multi_host() == 4 and calls[-1] == "initialize"


def test_multi_host_runs_over_the_slices_torus(monkeypatch):
    """``generate --multi-host`` takes every chip JAX's runtime joined (its --chips must say how many) and, past one
    host, sums round the slice's torus and places a split MoE's experts whole over hosts, as ``mk compile`` compiles
    it."""
    from types import SimpleNamespace

    import jax

    from mk.cli.generate import _over_the_slice
    from mk.config import GEMMA4_26B_A4B
    from mk.kernel_setup import WORKBOOK_KERNEL
    from mk.sharding.pods import expert_group

    chips = [SimpleNamespace(platform="tpu", device_kind="TPU v5 lite") for _ in range(16)]
    monkeypatch.setattr(jax, "devices", lambda: chips)
    setup = _over_the_slice(WORKBOOK_KERNEL.on(16), GEMMA4_26B_A4B)
    assert setup.torus == slice_shape(get_chip("tpu-v5e-16")).torus == ((4, False), (4, False))
    # whole experts over groups of 4 chips: 704 // 8 chips would leave a chip less than a lane tile of each expert
    assert (setup.placement, setup.host_chips) == ("hosts", expert_group(GEMMA4_26B_A4B, 16, 8)) == ("hosts", 4)
    assert not setup.repeat_heads
    with pytest.raises(ValueError, match="give --chips 16"):
        _over_the_slice(WORKBOOK_KERNEL.on(8), GEMMA4_26B_A4B)
