"""INT8 weights (mk.quant): the format's properties, the reference on a quantized tree, quantized checkpoints
(mk's own and one transformers saved), ``--quantize`` on the command line and in the bench, and the quality
report (sanity only: how good INT8 is on a random model is reported, not asserted)."""

import json

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from safetensors.numpy import load_file, save_file

from mk import reference, sol
from mk.analysis.quality import RANDOM_WEIGHTS, quality, quality_summary
from mk.config import TINY_DENSE, TINY_MOE
from mk.generate import generate
from mk.measure import cpu as bench
from mk.params import EXPERTS, param_specs, scales_inputs
from mk.quant import (
    SCALE_SUFFIX,
    dequantize,
    quantize,
    quantize_matrix,
    quantized_as,
    quantized_paths,
    scale_path,
    scheme_of,
)
from mk.weights import load_checkpoint, random_params, save_checkpoint

# Two users, one prompt past the sliding window; every generation here decodes NEW_TOKENS after them, so the
# compiled prefill and decode step are shared between tests.
PROMPTS = [[5, 17, 3, 99, 42, 7, 250, 11, 64, 8, 1, 300, 77, 12, 9, 31, 2, 400, 6, 18], [4, 5, 6, 7, 8]]
NEW_TOKENS = 32


def _same(a: dict, b: dict) -> bool:
    """Same keys, and every array bit for bit in the same dtype."""
    return a.keys() == b.keys() and all(
        np.asarray(a[k]).dtype == np.asarray(b[k]).dtype and np.array_equal(np.asarray(a[k]), np.asarray(b[k]))
        for k in a
    )


# The format ------------------------------------------------------------------------------------------
def test_quantize_matrix_codes_scales_and_rounding():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3, 64, 24)).astype(np.float32)
    w[1, :, 5] = 0.0  # an all-zero output channel
    codes, scale = quantize_matrix(w)
    assert codes.dtype == np.int8 and codes.shape == w.shape
    assert scale.dtype == np.float32 and scale.shape == (3, 24)  # one per output channel, per expert
    assert codes.min() >= -127 and codes.max() <= 127
    assert (scale > 0).all()
    assert scale[1, 5] == 1.0 and not codes[1, :, 5].any()  # zero column: codes 0, scale 1
    used = np.abs(codes).max(axis=-2)
    assert used[1, 5] == 0 and np.delete(used.ravel(), 1 * 24 + 5).min() == 127  # the others use the whole range
    back = codes.astype(np.float32) * scale[:, None, :]
    assert (np.abs(back - w) <= scale[:, None, :] / 2 * (1 + 1e-6)).all()  # round to nearest


def test_a_tensor_that_is_already_codes_times_scale_comes_back_exactly():
    rng = np.random.default_rng(1)
    codes = rng.integers(-127, 128, size=(2, 32, 16)).astype(np.int8)
    codes[:, 0, :] = 127  # every column reaches the end of the range, so max|w| / 127 is its scale
    scale = 2.0 ** rng.integers(-12, -2, size=(2, 16)).astype(np.float32)  # exact in float32
    w = codes.astype(np.float32) * scale[:, None, :]
    got_codes, got_scale = quantize_matrix(w)
    np.testing.assert_array_equal(got_codes, codes)
    np.testing.assert_array_equal(got_scale, scale)
    cfg = TINY_MOE
    p = random_params(cfg, seed=0)
    # a down projection is scaled per input channel (its rows), the gate per output channel (its columns)
    for path, per_input in (("layers.1.expert_down", True), ("layers.1.expert_gate", False)):
        E, K, N = p[path].shape
        c = rng.integers(-127, 128, size=(E, K, N)).astype(np.int8)
        if per_input:
            c[:, :, 0] = -127
            s = 2.0 ** rng.integers(-10, -4, size=(E, K)).astype(np.float32)
            p[path] = jnp.asarray(c.astype(np.float32) * s[:, :, None])
        else:
            c[:, 0, :] = -127
            s = 2.0 ** rng.integers(-10, -4, size=(E, N)).astype(np.float32)
            p[path] = jnp.asarray(c.astype(np.float32) * s[:, None, :])
    q = quantize(p, cfg, "int8-experts")
    for path in ("layers.1.expert_down", "layers.1.expert_gate"):
        np.testing.assert_array_equal(np.asarray(dequantize(q, cfg)[path]), np.asarray(p[path]))
    assert q[scale_path("layers.1.expert_down")].shape == p["layers.1.expert_down"].shape[:-1]


@pytest.mark.parametrize("scheme", ["int8-experts", "int8"])
def test_quantize_a_tree(scheme):
    cfg = TINY_MOE
    p = random_params(cfg, seed=0, dtype=jnp.bfloat16)
    q = quantize(p, cfg, scheme)
    specs = {s.path: s for s in param_specs(cfg)}
    int8 = {k for k, v in q.items() if v.dtype == jnp.int8}
    assert int8 == set(quantized_paths(cfg, scheme))
    want = {k for k, s in specs.items() if s.matrix and k != "embed" and (scheme == "int8" or s.component == EXPERTS)}
    assert int8 == want
    for k in int8:
        shape = specs[k].shape
        want = shape[:-1] if scales_inputs(k) else shape[:-2] + shape[-1:]  # per input channel: down projections
        assert q[scale_path(k)].dtype == jnp.float32 and q[scale_path(k)].shape == want
    assert all(q[k] is p[k] for k in p if k not in int8)  # the rest shared, not copied
    assert scheme_of(q, cfg) == scheme and scheme_of(p, cfg) == "none"
    d = dequantize(q, cfg)
    assert d.keys() == p.keys() and all(v.dtype == jnp.bfloat16 for v in d.values())  # the float tensors' dtype


def test_broken_trees_are_refused_clearly():
    cfg = TINY_MOE
    p = random_params(cfg, seed=0)
    q = quantize(p, cfg, "int8-experts")
    with pytest.raises(ValueError, match="already INT8"):
        quantize(q, cfg, "int8-experts")
    missing = {k: v for k, v in q.items() if k != scale_path("layers.0.expert_up")}
    with pytest.raises(ValueError, match=f"without their scales: layers.0.expert_up{SCALE_SUFFIX}"):
        scheme_of(missing, cfg)
    with pytest.raises(ValueError, match="match no quantization scheme"):
        scheme_of({**p, "layers.0.q": quantize(p, cfg, "int8")["layers.0.q"]}, cfg)
    with pytest.raises(ValueError, match=f"missing layers.0.expert_up{SCALE_SUFFIX}"):
        save_checkpoint(missing, cfg, "/nonexistent/never-written")
    with pytest.raises(ValueError, match="already quantized as 'int8-experts'.*'int8' does not match"):
        quantized_as(q, cfg, "int8")
    assert quantized_as(q, cfg) is q and quantized_as(q, cfg, "int8-experts") is q
    assert quantized_as(p, cfg) is p and scheme_of(quantized_as(p, cfg, "int8"), cfg) == "int8"


# The reference on a quantized tree -------------------------------------------------------------------
def test_reference_on_a_quantized_tree_is_the_reference_on_its_dequantized_tree(tiny_cfg, monkeypatch):
    cfg = tiny_cfg
    scheme = "int8-experts" if cfg.is_moe else "int8"
    p = random_params(cfg, seed=2)
    q = quantize(p, cfg, scheme)
    calls = []
    real = reference.dequantize
    monkeypatch.setattr(reference, "dequantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    tokens, logits = generate(q, cfg, PROMPTS, NEW_TOKENS, return_logits=True)
    assert len(calls) == 1  # once for the tree: prefill and every decode step share it
    want_tokens, want_logits = generate(dequantize(q, cfg), cfg, PROMPTS, NEW_TOKENS, return_logits=True)
    np.testing.assert_array_equal(logits, want_logits)  # identical, not close
    np.testing.assert_array_equal(tokens, want_tokens)
    assert reference.float_params(p, cfg) is p  # a float tree goes through untouched
    if cfg.is_moe:
        t = np.array([PROMPTS[0][:8]])
        np.testing.assert_array_equal(
            reference.routed_experts(q, cfg, t), reference.routed_experts(dequantize(q, cfg), cfg, t)
        )


# Checkpoints -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheme", ["int8-experts", "int8"])
def test_quantized_checkpoint_round_trips_exactly(tmp_path, scheme):
    cfg = TINY_MOE
    q = quantize(random_params(cfg, seed=0, dtype=jnp.bfloat16), cfg, scheme)
    save_checkpoint(q, cfg, tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    assert hf["quantization_config"] == {"quant_method": "mk-int8", "scheme": scheme, "scale_suffix": "_qscale"}
    assert hf["dtype"] == "bfloat16"
    t = load_file(tmp_path / "model.safetensors")
    gu = "model.layers.1.experts.gate_up_proj"
    assert t[gu].dtype == np.int8 and t[gu + "_qscale"].shape == (cfg.num_experts, 2 * cfg.expert_intermediate)
    np.testing.assert_array_equal(t[gu + "_qscale"][:, cfg.expert_intermediate :], q["layers.1.expert_up_qscale"])
    q_proj = "model.layers.0.self_attn.q_proj.weight"
    assert (q_proj + "_qscale" in t) == (scheme == "int8")
    loaded_cfg, r = load_checkpoint(tmp_path)
    assert loaded_cfg == cfg.replace(name=tmp_path.name)
    assert _same(dict(sorted(r.items())), dict(sorted(q.items())))
    assert scheme_of(r, cfg) == scheme
    # a cast touches the float tensors only
    _, r32 = load_checkpoint(tmp_path, dtype=jnp.float32)
    assert r32["embed"].dtype == jnp.float32
    assert all(
        r32[k].dtype == jnp.int8 and r32[scale_path(k)].dtype == jnp.float32 for k in quantized_paths(cfg, scheme)
    )


def test_broken_quantized_checkpoints_name_what_is_wrong(tmp_path):
    cfg = TINY_MOE
    save_checkpoint(quantize(random_params(cfg, seed=0), cfg, "int8-experts"), cfg, tmp_path)
    good = load_file(tmp_path / "model.safetensors")
    down, gu = "model.layers.0.experts.down_proj", "model.layers.2.experts.gate_up_proj"
    damaged = dict(good)
    del damaged[down + "_qscale"]
    damaged[gu + "_qscale"] = good[gu + "_qscale"][:, :4]
    damaged["model.layers.1.experts.down_proj"] = good["model.layers.1.experts.down_proj"].astype(np.float32)
    save_file(damaged, tmp_path / "model.safetensors")
    with pytest.raises(ValueError) as e:
        load_checkpoint(tmp_path)
    msg = str(e.value)
    assert "3 problem(s)" in msg, msg
    assert f"missing {down}_qscale (the scales of {down}" in msg
    assert f"{gu}_qscale has shape [8, 4], expected [8, {2 * cfg.expert_intermediate}]" in msg
    assert "model.layers.1.experts.down_proj has dtype F32, expected I8 (quantization scheme int8-experts)" in msg
    # INT8 codes without the quantization_config that says how to read them
    save_file(good, tmp_path / "model.safetensors")
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in hf.items() if k != "quantization_config"}))
    with pytest.raises(ValueError, match="has dtype I8.*quantization_config"):
        load_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**hf, "quantization_config": {"quant_method": "awq"}}))
    with pytest.raises(ValueError, match="quant_method 'awq'"):
        load_checkpoint(tmp_path)


def test_a_transformers_checkpoint_loaded_quantized_saved_and_reloaded(hf_checkpoint, tmp_path):
    folder, _ = hf_checkpoint("tiny-moe")
    cfg, p = load_checkpoint(folder)
    q = quantize(p, cfg, "int8")
    save_checkpoint(q, cfg, tmp_path)
    cfg2, r = load_checkpoint(tmp_path)
    assert cfg2.replace(name=cfg.name) == cfg
    assert _same(dict(sorted(r.items())), dict(sorted(q.items()))) and scheme_of(r, cfg) == "int8"


# Command line and bench -------------------------------------------------------------------------------
def test_cli_generate_quantized_is_the_quantized_reference_and_deterministic(mk_json, tmp_path, capsys):
    from mk.__main__ import main

    ids = ";".join(",".join(map(str, p)) for p in PROMPTS)
    args = ["--prompt-ids", ids, "--new-tokens", str(NEW_TOKENS), "--engine", "reference", "--json"]
    got = mk_json("generate", "--model", "tiny-moe", "--seed", "0", "--quantize", "int8-experts", *args)
    q = quantize(random_params(TINY_MOE, seed=0), TINY_MOE, "int8-experts")
    want = generate(q, TINY_MOE, PROMPTS, NEW_TOKENS)
    assert got["quantize"] == "int8-experts" and got["tokens"] == want.tolist()
    # a quantized checkpoint is used as it is: the same tokens in this process, and a mismatch refused
    save_checkpoint(q, TINY_MOE, tmp_path)
    assert main(["generate", "--checkpoint", str(tmp_path), *args]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == got["tokens"]
    assert main(["generate", "--checkpoint", str(tmp_path), "--quantize", "int8", *args]) == 2
    assert "already quantized as 'int8-experts'" in capsys.readouterr().err


def test_bench_row_records_the_quantization(tmp_path):
    r = bench.run_bench(TINY_DENSE, 16, 1, weights=bench.BenchWeights(quantize="int8"), budget_s=0.3, probe_bytes=2**20)
    row = r.row()
    assert row["dtype"] == "f32+int8" and r.bytes_per_token == sol.bytes_per_token(TINY_DENSE, 16, 1, "f32+int8").total
    assert r.bytes_per_token < sol.bytes_per_token(TINY_DENSE, 16, 1, "f32").total
    bench.append_row(row, tmp_path / "bench.csv")  # same columns as every older row


# Quality ------------------------------------------------------------------------------------------------
def test_quality_reports_sensible_numbers():
    cfg = TINY_MOE
    p = random_params(cfg, seed=0)
    t = quality(p, cfg, "int8-experts", PROMPTS, new_tokens=NEW_TOKENS)
    assert len(t) == 2 * NEW_TOKENS and t.step.tolist() == list(range(NEW_TOKENS)) * 2
    assert (t.max_abs_logit_error >= t.mean_abs_logit_error).all() and (t.mean_abs_logit_error >= 0).all()
    assert t.max_abs_logit_error.max() > 0  # INT8 moves the logits
    assert (t.reference_margin >= 0).all()
    s = quality_summary(t, {cfg.name})
    assert s.user.tolist() == [0, 1] and ((s.agreement >= 0) & (s.agreement <= 1)).all()
    assert (s.weights == RANDOM_WEIGHTS).all()  # random weights say so on every row: not a trained model's quality
    assert ((s.forced_agreement >= 0) & (s.forced_agreement <= 1)).all()
    for row in s.itertuples():
        assert (row.agreement == 1) == pd.isna(row.first_divergence)
        assert pd.isna(row.first_divergence) or 0 <= row.first_divergence < NEW_TOKENS
    # no quantization: nothing moves
    none = quality_summary(quality(p, cfg, "none", PROMPTS, new_tokens=NEW_TOKENS))
    assert none.agreement.tolist() == [1.0, 1.0] and none.max_abs_logit_error.tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="pass the float tree"):
        quality(quantize(p, cfg, "int8"), cfg, "int8", PROMPTS)
