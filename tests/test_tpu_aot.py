"""Ahead-of-time compilation of the decode step for real TPUs (v5e, v6e) on this CPU machine, with
libtpu's own Mosaic compiler: layouts, primitives without a TPU lowering and VMEM overflow fail
here, not on a user's TPU. Needs libtpu (requirements-tpu.txt); skipped without it."""

from pathlib import Path

import pytest

from mk.chips import get_chip
from mk.config import (
    FULL,
    GEMMA4_26B_A4B,
    GEMMA4_31B,
    SLIDING,
    TINY_DEEPSEEK_V3,
    TINY_DENSE,
    TINY_GPT_OSS,
    TINY_LLAMA,
    TINY_MIXTRAL,
    TINY_MOE,
    TINY_QWEN3_MOE,
)
from mk.kernel_setup import Collective, KernelSetup
from mk.megakernel.aot import compile_for_tpu
from mk.plan import AllReduce, Start, layers_in_hbm
from mk.plan.schedule import pattern_period
from mk.profiling import count_kernels

CONFIGS = Path(__file__).resolve().parent.parent / "data" / "configs"

pytest.importorskip("libtpu", reason="AOT compilation for TPU needs libtpu (pip install -r requirements-tpu.txt)")

CHIPS = ("tpu-v5e", "tpu-v6e")
# Full-size steps (full-size shapes, tiles and VMEM budget). The kernel emits each regular run of tiles as one
# loop (StepPlan.folded), so its code grows with the layers, not the tiles. A whole model's compile takes a
# minute or two on 2 cores, so every model, chip and expert placement is compiled at full size once, not every
# combination: on one chip, each model's sliding + full layer pair for the VMEM check (26B-A4B on v6e, 31B on
# v5e); over 8 chips, every layer of both models (26B-A4B whole and 31B on v5e-8, 26B-A4B split on v6e-8).
FULL_SIZE_VMEM = [(GEMMA4_26B_A4B, "tpu-v6e"), (GEMMA4_31B, "tpu-v5e")]
PERIOD = pattern_period(GEMMA4_31B.layer_types)  # Gemma 4's sliding/full pattern: 6 layers
assert pattern_period(GEMMA4_26B_A4B.layer_types) == PERIOD


def _hbm_cut(cfg, chip):
    return cfg.truncated(layers_in_hbm(cfg, get_chip(chip).hbm_bytes, 1, 2048))


def _check(plan, compiled, chip):
    kc = count_kernels(compiled.as_text())
    assert kc.by_opcode.get("custom-call") == 1, kc.by_opcode  # the whole step is one Mosaic kernel
    # Besides it, XLA's memory-space assignment may only move operands between HBM and VMEM around the
    # launch (tiny presets: their KV caches and the users block are a few KiB, so it moves them): no
    # compute of the step runs outside the kernel.
    assert set(kc.by_opcode) <= {"custom-call", "copy", "copy-start"}, kc.by_opcode
    assert plan.vmem_bytes <= get_chip(chip).vmem_bytes
    return kc


# twelve layers (the pattern four times): the loop over stacked layers compiles too
TINY_MOE_X4 = TINY_MOE.replace(name="tiny-moe-x4", layer_types=TINY_MOE.layer_types * 4)


@pytest.mark.parametrize("chip", CHIPS)
@pytest.mark.parametrize(
    "cfg,batch", [(TINY_DENSE, 1), (TINY_MOE, 4), (TINY_MOE_X4, 2)], ids=lambda x: getattr(x, "name", str(x))
)
def test_tiny_step_compiles_for_tpu(cfg, batch, chip):
    plan, compiled = compile_for_tpu(cfg, chip, batch, 64)
    _check(plan, compiled, chip)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize(
    "cfg",
    [TINY_DENSE, TINY_MOE, TINY_LLAMA, TINY_QWEN3_MOE, TINY_MIXTRAL, TINY_GPT_OSS, TINY_DEEPSEEK_V3],
    ids=lambda c: c.name,
)
def test_every_family_compiles_as_the_engine_builds_it(cfg, dtype):
    """Each family's tiny kernel through the engine's own build (mk.megakernel.kernel.build_call: the plan's VMEM
    limit for the chip, each dot's precision from its data type), compiled by libtpu for a v5e: in f32 under
    ``default_matmul_precision("highest")``, as the parity check runs it (a bf16 dot given HIGHEST does not lower:
    "Bad lhs type"), and in bf16, with ragged users."""
    import jax

    from mk.dtypes import get_dtype

    arrays = get_dtype(dtype).arrays
    with jax.default_matmul_precision("highest" if dtype == "f32" else "default"):
        plan, compiled = compile_for_tpu(cfg, "tpu-v5e", 3, 64, weight_dtype=arrays, kv_dtype=arrays)
    _check(plan, compiled, "tpu-v5e")


@pytest.mark.slow
@pytest.mark.parametrize("cfg,chip", FULL_SIZE_VMEM, ids=lambda x: getattr(x, "name", str(x)))
def test_full_size_plan_vmem_agrees_with_the_compiler(cfg, chip):
    """The compiler's VMEM figure for a full-size step against the plan's budget. Only the table of norm
    vectors (one row per layer vector) grows with the layers: one sliding + one full layer stand for the
    HBM-sized cut (same tiles, buffers and activations) and compile in seconds, not minutes."""
    from mk.megakernel.aot import compiler_vmem_bytes
    from mk.plan import build_plan

    pair = cfg.replace(name=f"{cfg.name}[sliding+full]", layer_types=(SLIDING, FULL))
    parts = [
        build_plan(c, 1, 2048, weight_dtype="bfloat16", kv_dtype="bfloat16").vmem_breakdown()
        for c in (pair, _hbm_cut(cfg, chip))
    ]
    vectors = "norm and scale vectors"
    assert {k: v for k, v in parts[0].items() if k != vectors} == {k: v for k, v in parts[1].items() if k != vectors}
    plan_bytes, compiler_bytes = compiler_vmem_bytes(pair, chip, 1, 2048)
    assert plan_bytes <= compiler_bytes * 1.01  # (the compiler rounds to three digits)
    assert compiler_bytes <= plan_bytes * 1.05 + 64 * 1024, (plan_bytes, compiler_bytes)


def test_vmem_overflow_fails_in_the_compiler_too():
    """The plan's VMEM budget is the compiler's: a step whose weight tiles cannot fit is refused by
    libtpu's compiler itself when the plan's own check is bypassed."""
    from mk.tpu import probe_vmem

    assert probe_vmem("tpu-v5e") == get_chip("tpu-v5e").vmem_bytes
    assert probe_vmem("tpu-v6e") == get_chip("tpu-v6e").vmem_bytes
    assert probe_vmem("tpu-v5p") == get_chip("tpu-v5p").vmem_bytes == 64 * 2**20  # data/chips.csv from this probe


@pytest.mark.parametrize(
    "cfg, batch, chip",
    [(TINY_DENSE, 1, "tpu-v5e"), (TINY_MOE, 4, "tpu-v5e"), (TINY_MOE, 8, "tpu-v5e-8")],
    ids=["tiny-dense-1", "tiny-moe-4", "tiny-moe-8-over-8-chips"],
)
def test_plan_vmem_agrees_with_the_compiler(cfg, batch, chip):
    """The compiler's own VMEM figure for the kernel (from its refusal at half the plan) is the plan's
    budget within a few percent (Mosaic adds a little internal scratch); over 8 chips the plan counts the
    all-reduce's and the greedy pick's buffers (a sixth of it) and each layer type's write-back staging."""
    from mk.kernel_setup import WORKBOOK_KERNEL
    from mk.megakernel.aot import compiler_vmem_bytes

    options = {"setup": WORKBOOK_KERNEL.on(8)} if chip != "tpu-v5e" else {}
    plan_bytes, compiler_bytes = compiler_vmem_bytes(cfg, chip, batch, 64, **options)
    assert plan_bytes <= compiler_bytes * 1.01  # (the compiler rounds to three digits)
    assert compiler_bytes <= plan_bytes * 1.05 + 64 * 1024, (plan_bytes, compiler_bytes)


def test_kernels_per_step_reference_against_megakernel():
    """The table notebook 03 shows: the reference's TPU program launches many kernels, the megakernel's
    one Mosaic custom call (counted, not assumed)."""
    from mk.megakernel.parity import kernels_per_step_on_tpu

    t = kernels_per_step_on_tpu(TINY_MOE, "tpu-v5e", 1, 32).set_index("engine")
    assert t.loc["megakernel", "by_custom-call"] == 1
    assert t.loc["reference (XLA)", "kernels"] > 10 * t.loc["megakernel", "kernels"]


def test_the_references_tpu_program_reads_the_routed_experts_in_place():
    """mk.reference.prepare keeps every expert matrix [intermediate, hidden] and, for a TPU, the experts stacked: XLA's
    v5e program of the decode step then copies no expert's weights and runs no conditional. With the down matrices
    [hidden, intermediate] it copied every expert's down matrix (E x layers of them, routed or not) at every step
    (Gemma 4 26B-A4B's pair of layers: 2 GB read and written); with the experts split into E arrays it looped over a
    conditional of E branches per routed slot."""
    from mk.megakernel.parity import reference_on_tpu
    from mk.profiling.hlo import relayouts

    H, I = 256, 64
    cfg = TINY_MOE.replace(hidden_size=H, expert_intermediate=I)
    text = reference_on_tpu(cfg, "tpu-v5e", 2, 32).as_text()
    copies = relayouts(text)
    assert not {f"bf16[{H},{I}]", f"bf16[{I},{H}]"} & set(copies), copies
    assert " conditional(" not in text and f"bf16[{cfg.num_experts},{I},{H}]" in text


def test_the_references_many_user_cache_write_is_a_loop_with_the_cache_in_the_cores_memory():
    """XLA's v5e program writes many users' new K and V (mk.reference.write_slots, a scatter) in a while loop over the
    users, one a layer for K and one for V, some over the layer's cache copied into the core's memory (memory space 1)
    and back; one user's write is no loop. What the chip's op profiles of llama-3.2-1b's many-user XLA steps spend
    their time in (mk.analysis.on_tpu's reason for those misses)."""
    import re

    from mk.megakernel.parity import reference_on_tpu

    cfg, B, S = TINY_LLAMA, 4, 256
    cache = f"bf16[{B},{cfg.kv_heads('full')},{S},{cfg.head_dim('full')}]"
    entry = reference_on_tpu(cfg, "tpu-v5e", B, S).as_text().split("ENTRY", 1)[1]
    loops = [line for line in entry.splitlines() if " while(" in line]
    assert len(loops) == 2 * len(cfg.layer_types) and all(cache in line for line in loops), loops
    into_core = re.findall(rf"= \({re.escape(cache)}\{{[^}}]*S\(1\)\}}, {re.escape(cache)}\{{[^}}S]*\}}", entry)
    out_of_core = re.findall(rf"= \({re.escape(cache)}\{{[^}}S]*\}}, {re.escape(cache)}\{{[^}}]*S\(1\)\}}", entry)
    assert into_core and out_of_core, (into_core, out_of_core)
    one = reference_on_tpu(cfg, "tpu-v5e", 1, S).as_text().split("ENTRY", 1)[1]
    assert " while(" not in one


@pytest.mark.slow
@pytest.mark.parametrize(
    "model, chip, placements, attention_split, drafts",
    [
        (GEMMA4_26B_A4B, "tpu-v5e-8", ("whole",), "heads", 3),
        (GEMMA4_31B.truncated(PERIOD), "tpu-v5e-8", ("whole",), "heads", 3),
        (GEMMA4_26B_A4B.truncated(PERIOD), "tpu-v6e-8", ("split",), "positions", 0),
    ],
    ids=["v5e-8-speculative-moe", "v5e-8-speculative-dense", "v6e-8-positions-split"],
)
def test_full_size_models_compile_sharded_over_eight_chips(model, chip, placements, attention_split, drafts):
    """Both models at full size, bf16, split over 8 chips: every model, slice and expert placement once (one a test,
    so that the test workers share them), not every combination; the MLPs' intermediate on rows. The MoE model
    whole on the v5e-8 (every layer: the loop over layers at full width, 40 s here); elsewhere one period of the
    layer pattern, every tile and buffer the whole model's (libtpu takes about 2.5 s a layer of code at full width,
    and a whole model's first and last periods are code of their own: 15 s against 36 s for the 31B); on the v5e-8 the
    speculative step (3 drafts a user: 4 rows through one weight pass, the rows' hidden states out), on the v6e-8
    the plain step with the full layers' KV positions split over the 4 chips sharing each head. One Mosaic kernel
    per chip; each chip's arguments, as the compiler lays them out, are the plan's sharded weights and cache (not
    the whole model replicated) and fit its HBM."""
    from mk.megakernel.aot import sharded_compiles

    setup = KernelSetup(attention_split=attention_split, draft_tokens=drafts)
    table = sharded_compiles([model], [chip], placements=placements, setup=setup)
    assert (table["draft_tokens"] == drafts).all()
    assert list(table["placement"]) == (list(placements) if model.is_moe else ["-"])
    assert (table["mosaic_calls"] == 1).all(), table
    assert (table["compiler_hbm_gb"] == table["plan_hbm_gb"]).all(), table  # byte for byte
    assert (table["compiler_hbm_gb"] < table["hbm_per_chip_gb"]).all(), table
    assert (table["plan_vmem_mib"] <= table["vmem_limit_mib"]).all()


@pytest.mark.parametrize("chip", ("tpu-v5e-8", "tpu-v6e-8"))
@pytest.mark.parametrize(
    "collective",
    [Collective(), Collective(overlap=False, bf16_payload=True, reduce_scatter=True)],
    ids=["default", "bf16-reduce-scatter-no-overlap"],
)
def test_tiny_sharded_step_compiles_with_every_switch(collective, chip):
    """The all-reduce's DMAs move only the users' rows (1 in f32, 2 in bf16: a DMA may not cut a packed
    sublane word) at lane offsets computed from the chip's index: the Mosaic compiler takes them."""
    cfg8 = TINY_MOE.replace(name="tiny-moe-8h", num_heads=8, sliding_kv_heads=2, full_kv_heads=1)
    plan, compiled = compile_for_tpu(cfg8, chip, 1, 64, setup=KernelSetup(8, "whole", collective))
    assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == 1
    assert {op.rows for op in plan.ops if isinstance(op, AllReduce)} == ({1, 2} if collective.bf16_payload else {1})


# eight query heads: one a chip; a window of 64, so 4 chips sharing a sliding KV head each hold a whole block of 16
EIGHT_HEADS_W64 = TINY_MOE.replace(
    name="tiny-moe-8h-w64", num_heads=8, sliding_kv_heads=2, full_kv_heads=1, sliding_window=64
)


@pytest.mark.parametrize("chip", ("tpu-v5e-8", "tpu-v6e-8"))
def test_tiny_step_with_positions_split_over_chips_compiles(chip):
    """Chips sharing a KV head split its positions (4 a sliding head, 8 the full one): the query heads gathered
    and the partial states sent over remote DMAs within each group, at offsets computed from the chip's index."""
    setup = KernelSetup(8, "split", attention_split="positions")
    plan, compiled = compile_for_tpu(EIGHT_HEADS_W64, chip, 2, 256, setup=setup)
    assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == 1
    assert (plan.position_share("sliding"), plan.position_share("full")) == (4, 8)
    assert plan.cache_len("full") == 256 // 8


@pytest.mark.parametrize("chip, batch", [("tpu-v5e-8", 8), ("tpu-v6e-8", 16)])
def test_tiny_step_with_users_split_over_chips_compiles(chip, batch):
    """Chips own users (1 or 2 each): each chip's q, k, v heads of every owner's users staged and sent, and the
    outputs sent back, over remote DMAs of the users' rows; the owner's attention over every KV head."""
    setup = KernelSetup(8, "whole", attention_split="users")
    plan, compiled = compile_for_tpu(EIGHT_HEADS_W64, chip, batch, 128, setup=setup)
    assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == 1
    assert plan.cache_users == batch // 8 and plan.cache_heads("sliding") == 2


@pytest.mark.parametrize("scheme, chip", [("int8-experts", "tpu-v5e"), ("int8", "tpu-v6e")])
def test_int8_step_compiles_for_tpu(scheme, chip):
    """INT8 tiles (and their scale blocks) stream and are dequantized in VMEM: libtpu compiles the step."""
    plan, compiled = compile_for_tpu(TINY_MOE, chip, 4, 64, quantize=scheme)
    _check(plan, compiled, chip)
    assert any(ld.scaled for ld in plan.loads)


def test_int8_plan_vmem_agrees_with_the_compiler():
    """No VMEM beyond the plan's budget for the dequantized tiles (it held for the full-size 26B-A4B pair of a
    sliding and a full layer too, when measured)."""
    from mk.megakernel.aot import compiler_vmem_bytes

    plan_bytes, compiler_bytes = compiler_vmem_bytes(TINY_MOE, "tpu-v5e", 4, 64, quantize="int8")
    assert plan_bytes <= compiler_bytes * 1.01
    assert compiler_bytes <= plan_bytes * 1.05 + 64 * 1024, (plan_bytes, compiler_bytes)


@pytest.mark.parametrize("placement, chip", [("whole", "tpu-v5e-8"), ("split", "tpu-v6e-8")])
def test_int8_step_compiles_over_eight_chips(placement, chip):
    """Every matrix INT8 over 8 chips, heads split: each chip's scales cut with its output channels or experts."""
    cfg8 = TINY_MOE.replace(name="tiny-moe-8h", num_heads=8, sliding_kv_heads=2, full_kv_heads=1)
    plan, compiled = compile_for_tpu(cfg8, chip, 2, 64, setup=KernelSetup(8, placement), quantize="int8")
    assert compiled.as_text().count('custom_call_target="tpu_custom_call"') == 1
    assert any(ld.scaled for ld in plan.loads)


@pytest.mark.parametrize(
    "folder, placements", [("llama-3.1-8b", ("split",)), ("qwen3-30b-a3b", ("whole", "split"))], ids=lambda x: str(x)
)
def test_other_families_compile_whole_over_v5e_8(folder, placements):
    """Llama-3.1-8B (SiLU, untied head, Llama 3 RoPE) and Qwen3-30B-A3B (QK-norm, 128 experts without a shared MLP,
    both placements), every layer at full size over a v5e-8: one Mosaic kernel a chip, whose arguments as the compiler
    lays them out are the plan's sharded weights and cache, within a chip's HBM."""
    from mk.megakernel.aot import sharded_compiles

    table = sharded_compiles([str(CONFIGS / folder)], ["tpu-v5e-8"], placements=placements)
    assert len(table) == len(placements) and (table["mosaic_calls"] == 1).all(), table
    assert (table["compiler_hbm_gb"] == table["plan_hbm_gb"]).all(), table
    assert (table["compiler_hbm_gb"] < table["hbm_per_chip_gb"]).all(), table


def test_emitted_code_splits_at_the_loop_over_layers_and_compile_times_count_it():
    """The loop over layers forms only where two whole repeats of the pattern sit between the first and the last;
    below that both emissions write the same code, above it the code stops growing with the layers; compile_times
    reports the same counts beside the compile time."""
    from mk.megakernel.aot import compile_times, emitted_code_table, layer_loop_onset

    period, onset = layer_loop_onset(TINY_MOE, max_len=64)
    assert period == TINY_MOE.num_layers and onset == 4 * period
    deep = TINY_MOE.replace(layer_types=TINY_MOE.layer_types * 6)
    code = emitted_code_table(deep, [2, onset, onset + 2 * period], max_len=64).set_index(["layers", "loop_layers"])
    assert code.loc[(2, True)].equals(code.loc[(2, False)]) and code.loc[(2, True)].looped_layers == 0
    looped = code.xs(True, level="loop_layers")
    assert looped.looped_layers.tolist()[1:] == [2 * period, 4 * period]
    assert looped.emitted_ops.iloc[1] == looped.emitted_ops.iloc[2] < code.loc[(onset, False)].emitted_ops
    assert (looped.emitted_in_layer_loop + looped.emitted_outside == looped.emitted_ops).all()
    times = compile_times(TINY_MOE, "tpu-v5e", [2], max_len=64, repeats=1)
    assert times.emitted_ops.tolist() == code.xs(2, level="layers").emitted_ops.tolist()
    assert (times.compile_s > 0).all()


def test_weight_copies_at_priority_one_compile_apart_from_every_other_copy():
    """Tiles.weight_priority=1: the weight tiles' copies start at DMA priority 1 and every other copy (KV tiles, the
    route's table, the users block) at 0, and the step compiles for a v5e; by default every copy starts at 0."""
    from mk.megakernel.aot import compile_plan, traced_plan
    from mk.plan import Tiles, build_plan

    plans = {p: build_plan(TINY_MOE, 2, 64, tiles=Tiles(weight_priority=p)) for p in (0, 1)}
    text = {p: str(traced_plan(plan, "tpu-v5e").jaxpr) for p, plan in plans.items()}
    assert "dma_start(p1" not in text[0] and "dma_start(p0" in text[0]
    assert "dma_start(p1" in text[1] and "dma_start(p0" in text[1]
    starts = sum(1 for it in plans[1].items if isinstance(it, Start))  # a weight tile's start, once or in a loop
    assert 0 < text[1].count("dma_start(p1") <= starts
    _check(plans[1], compile_plan(plans[1], "tpu-v5e"), "tpu-v5e")
