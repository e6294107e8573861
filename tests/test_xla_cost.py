"""mk.measure.xla_cost: XLA's own TPU cost model of each component of a decode step, compiled ahead of
time for a TPU topology on this CPU. The compiling tests need libtpu (requirements-tpu.txt) and are
skipped without it; the programs' shapes and straight-line form, and the refusal of a non-TPU chip, are
checked without it."""

import importlib.util

import jax
import pytest
from jax.extend.core import ClosedJaxpr, Jaxpr

from mk.chips import get_chip
from mk.config import FULL, GEMMA4_26B_A4B, GEMMA4_31B, SLIDING, TINY_DENSE, TINY_MOE
from mk.measure.xla_cost import KIND, PER_LAYER, PER_STEP, component_programs, per_step, xla_costs
from mk.params import WEIGHT_COMPONENTS
from mk.sol import bytes_per_token

needs_libtpu = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None,
    reason="AOT compilation for TPU needs libtpu (pip install -r requirements-tpu.txt)",
)
CONTEXT = 64  # longer than the tiny models' window (16): the sliding layers read the window, the full all


def _primitives(jaxpr) -> set[str]:
    """Every primitive in ``jaxpr`` and the jaxprs nested in its equations (pjit, custom_jvp, ...)."""
    names = set()
    for eqn in jaxpr.eqns:
        names.add(eqn.primitive.name)
        for p in eqn.params.values():
            for sub in p if isinstance(p, (list, tuple)) else (p,):
                if isinstance(sub, ClosedJaxpr):
                    names |= _primitives(sub.jaxpr)
                elif isinstance(sub, Jaxpr):
                    names |= _primitives(sub)
    return names


@pytest.mark.parametrize("cfg", [TINY_DENSE, TINY_MOE, GEMMA4_26B_A4B, GEMMA4_31B], ids=lambda c: c.name)
def test_programs_are_straight_line_and_named_by_component(cfg):
    """No loop or conditional anywhere (XLA's TPU cost model has no estimate for them), full-size shapes
    traced without allocating anything, and every program's component one of mk.params'."""
    progs = component_programs(cfg, 1024, 1)
    expected = {"sliding_attention", "full_attention", "shared_mlp", "norms", "final_norm", "head"}
    assert set(progs) == expected | ({"router", "experts"} if cfg.is_moe else set())
    for name, prog in progs.items():
        assert prog.component in WEIGHT_COMPONENTS, name
        prims = _primitives(jax.make_jaxpr(prog.fn)(*prog.args).jaxpr)
        assert not prims & {"cond", "while", "scan"}, (name, prims)
    # the attention programs read the layer's cache positions: the window for sliding layers, the context for full
    for t, name in ((SLIDING, "sliding_attention"), (FULL, "full_attention")):
        k_cache = progs[name].args[2]
        assert k_cache.shape == (1, cfg.kv_heads(t), cfg.cache_positions(t, 1024), cfg.head_dim(t))


def test_program_sol_bytes_add_up_to_mk_sol():
    """Each program's share of mk.sol's bytes, times the runs per step, is mk.sol's whole step."""
    for cfg in (TINY_MOE, GEMMA4_26B_A4B):
        progs = component_programs(cfg, CONTEXT, 2)
        runs = {SLIDING: len(cfg.sliding_layers), FULL: len(cfg.full_layers), PER_LAYER: cfg.num_layers, PER_STEP: 1}
        total = sum((p.sol_weight_bytes + p.sol_kv_bytes) * runs[p.layer_kind] for p in progs.values())
        assert total == pytest.approx(bytes_per_token(cfg, CONTEXT, 2).total, rel=1e-12)


def test_non_tpu_chip_is_refused():
    with pytest.raises(ValueError, match="XLA's TPU cost model needs a TPU chip; 'h100'"):
        xla_costs(TINY_MOE, "h100", progress=False)


@pytest.fixture(scope="module")
def tiny_moe_costs():
    return xla_costs(TINY_MOE, "tpu-v5e-8", context=CONTEXT, progress=False)


@needs_libtpu
def test_every_tiny_program_compiles_with_an_estimate(tiny_moe_costs):
    df = tiny_moe_costs
    assert list(df["program"]) == list(component_programs(TINY_MOE, CONTEXT, 1))
    assert (df["optimal_s"] > 0).all(), df[["program", "optimal_s"]]
    assert (df["flops"] > 0).all() and (df["compile_s"] > 0).all()
    assert (df["kind"] == KIND).all() and (df["chip"] == "tpu-v5e-8").all()
    assert (df["jax_version"] == jax.__version__).all() and (df["libtpu_version"] != "none").all()
    # XLA counts every instruction's operands and results (activations, the new K/V, reads of the same bytes
    # by more than one fused op, tiles padded to (8, 128)): at least the weights and KV cache mk.sol counts
    # for that program, never fewer.
    need = df["sol_weight_bytes"] + df["sol_kv_bytes"]
    assert (df["bytes_accessed"] >= need).all(), df[["program", "bytes_accessed", "sol_weight_bytes", "sol_kv_bytes"]]


@needs_libtpu
def test_per_step_scales_by_layer_counts(tiny_moe_costs):
    df = tiny_moe_costs.set_index("program")
    step = per_step(tiny_moe_costs, TINY_MOE).set_index("component")
    assert list(step.index) == [c for c in WEIGHT_COMPONENTS if c in step.index]
    L, S, F = TINY_MOE.num_layers, len(TINY_MOE.sliding_layers), len(TINY_MOE.full_layers)
    expected = {
        "sliding_attention": (S, S * df.loc["sliding_attention", "optimal_s"]),
        "full_attention": (F, F * df.loc["full_attention", "optimal_s"]),
        "shared_mlp": (L, L * df.loc["shared_mlp", "optimal_s"]),
        "router": (L, L * df.loc["router", "optimal_s"]),
        "experts": (L, L * df.loc["experts", "optimal_s"]),
        "norms": (L + 1, L * df.loc["norms", "optimal_s"] + df.loc["final_norm", "optimal_s"]),
        "head": (1, df.loc["head", "optimal_s"]),
    }
    assert set(step.index) == set(expected)
    for comp, (runs, seconds) in expected.items():
        assert step.loc[comp, "runs"] == runs
        assert step.loc[comp, "optimal_s"] == pytest.approx(seconds, rel=1e-12)
    assert step["share"].sum() == pytest.approx(1.0)
    sol = bytes_per_token(TINY_MOE, CONTEXT, 1).total
    assert (step["sol_weight_bytes"] + step["sol_kv_bytes"]).sum() == pytest.approx(sol, rel=1e-12)
    with pytest.raises(ValueError, match="not 'tiny-dense'"):
        per_step(tiny_moe_costs, TINY_DENSE)


@needs_libtpu
@pytest.mark.slow
@pytest.mark.parametrize(
    "cfg, chip", [(GEMMA4_26B_A4B, "tpu-v5e-8"), (GEMMA4_31B, "tpu-v6e-8")], ids=lambda x: getattr(x, "name", x)
)
def test_full_size_against_the_speed_of_light(cfg, chip):
    """Both models full size: every program has an estimate, compiles in seconds, and reads at least
    mk.sol's bytes; the step XLA's model adds up is the speed of light (mk.sol's bytes at the chip's HBM
    bandwidth) or a little slower (measured with libtpu 0.0.42.1: 1.11-1.12x on v5e, 1.00-1.01x on v6e)."""
    df = xla_costs(cfg, chip, context=1024, progress=False)
    assert (df["optimal_s"] > 0).all(), df[["program", "optimal_s"]]
    assert (df["compile_s"] < 30).all(), df[["program", "compile_s"]]
    assert (df["bytes_accessed"] >= df["sol_weight_bytes"] + df["sol_kv_bytes"]).all()
    step_s = per_step(df, cfg)["optimal_s"].sum()
    sol_s = bytes_per_token(cfg, 1024, 1).total / get_chip(chip).per_chip_bandwidth
    assert 0.95 * sol_s <= step_s <= 1.5 * sol_s, (step_s, sol_s)
