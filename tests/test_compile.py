"""``python -m mk compile``: the step compiled ahead of time for TPU slices past one host (libtpu's topology
descriptions, no TPU), and ``--multi-host``'s refusal off a slice. The compiles need libtpu and skip without it."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from mk.chips import get_chip, slice_shape
from mk.megakernel.aot import aot_target
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
    assert aot_target("tpu-v5e-16")[1] == "v5e:4x4" and aot_target("tpu-v5p-8")[1] == "v5p:2x2x2"
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
    assert d["plan_vmem_bytes"] < d["compiler_vmem_bytes"] < d["vmem_limit_bytes"]


@needs_libtpu
def test_sixty_four_chips_run_out_of_semaphores_in_one_line():
    """The known limit past 16 chips: the all-to-all exchanges keep DMA semaphores per peer, and over 64 chips they
    exceed the core's semaphore memory (sflag); libtpu refuses the step and the command says so in one line."""
    out = _run("compile", "--model", "tiny-moe", "--chip", "tpu-v5e-64", "--no-vmem")
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "sflag" in lines[0], out.stderr[-2000:]


@needs_libtpu
@pytest.mark.slow
def test_full_size_moe_compiles_over_a_two_host_slice(mk_json):
    """gemma4-26b-a4b whole (every layer, bf16) over a v5e-16: one Mosaic call a chip, the plan's bytes a chip holds
    byte for byte, within its HBM (about 80 s here)."""
    d = mk_json("compile", "--model", "gemma4-26b-a4b", "--chip", "tpu-v5e-16", "--no-vmem", "--json")
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
