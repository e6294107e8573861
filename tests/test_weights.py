"""Random init, checkpoint save/load round trips, the Hugging Face name map, and bad checkpoints."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from mk.config import TINY_DENSE, TINY_MOE, to_hf_dict
from mk.params import param_specs
from mk.reference import prepare
from mk.sharding import make_mesh
from mk.weights import _small_random_params, device_params, load_checkpoint, random_params, save_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[1]


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def test_random_params_tree_and_determinism(tiny_cfg):
    p = random_params(tiny_cfg, seed=1)
    assert {k: v.shape for k, v in p.items()} == {s.path: s.shape for s in param_specs(tiny_cfg)}
    assert all(v.dtype == jnp.float32 for v in p.values())
    p["embed"] = None  # each call's dict is its own: the memo of a small model's arrays is not changed through it
    again = random_params(tiny_cfg, seed=1)
    assert again["embed"] is not None
    _small_random_params.cache_clear()  # drawn afresh: the same values
    p = random_params(tiny_cfg, seed=1)
    assert _equal(p, again)
    other = random_params(tiny_cfg, seed=2)
    assert not any(np.array_equal(p[k], other[k]) for k in p)
    norms = np.concatenate([np.asarray(v).ravel() for k, v in p.items() if "norm" in k or "scal" in k])
    assert 0.5 < norms.min() and norms.max() < 1.5 and norms.std() > 0.05  # near 1, not all equal
    assert random_params(tiny_cfg, seed=1, dtype=jnp.bfloat16)["embed"].dtype == jnp.bfloat16


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_save_load_round_trip_is_exact(tiny_cfg, tmp_path, dtype):
    p = random_params(tiny_cfg, seed=0, dtype=dtype)
    save_checkpoint(p, tiny_cfg, tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == ["config.json", "model.safetensors"]
    cfg, q = load_checkpoint(tmp_path / "ckpt")
    assert cfg == tiny_cfg.replace(name="ckpt")
    assert all(v.dtype == dtype for v in q.values())
    assert _equal(p, q)
    # Cast on the way: a bf16 checkpoint loads as f32 exactly (bf16 -> f32 is exact).
    _, q32 = load_checkpoint(tmp_path / "ckpt", cfg=tiny_cfg, dtype=jnp.float32)
    assert q32["embed"].dtype == jnp.float32 and np.array_equal(
        np.asarray(q32["embed"], np.float32), np.asarray(p["embed"], np.float32)
    )


@pytest.mark.parametrize("chips", [None, 8], ids=["one-device", "mesh-of-8"])
def test_device_params_are_random_params_in_the_decode_layout(chips):
    """Drawn and cast in one program on the device, or each chip its part over a mesh: random_params' values in
    prepare's layout, except for a few bf16 roundings (float32 rounding in a different fusion, then the cast).
    Over the mesh, an array split on an axis the chips divide, else held whole by every chip."""
    cfg = TINY_MOE
    where = jax.devices("cpu")[0] if chips is None else make_mesh(chips, jax.devices()[:chips])
    got = device_params(cfg, 0, jnp.bfloat16, where)
    want = prepare(random_params(cfg, 0, jnp.bfloat16), cfg)
    assert got.keys() == want.keys()
    for path in want:
        a, b = jax.tree.leaves(got[path]), jax.tree.leaves(want[path])
        assert len(a) == len(b), path
        for x, y in zip(a, b):
            assert x.shape == y.shape and x.dtype == y.dtype == jnp.bfloat16, path
            np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32), rtol=2**-7, err_msg=path)
            if chips is not None:
                shard = x.sharding.shard_shape(x.shape)
                split = any(n % chips == 0 for n in x.shape)
                assert len(x.sharding.device_set) == chips
                assert np.prod(shard) == (x.size // chips if split else x.size), (path, shard)


def test_saved_layout_is_hugging_face(tmp_path):
    """Names, [out, in] layouts and gate-rows-first gate_up_proj, as transformers' save_pretrained writes them."""
    cfg = TINY_MOE
    p = random_params(cfg, seed=0)
    save_checkpoint(p, cfg, tmp_path)
    t = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in t
    np.testing.assert_array_equal(t["model.layers.0.self_attn.q_proj.weight"], np.asarray(p["layers.0.q"]).T)
    gu = t["model.layers.1.experts.gate_up_proj"]
    assert gu.shape == (cfg.num_experts, 2 * cfg.expert_intermediate, cfg.hidden_size)
    np.testing.assert_array_equal(gu[3, : cfg.expert_intermediate], np.asarray(p["layers.1.expert_gate"][3]).T)
    np.testing.assert_array_equal(gu[3, cfg.expert_intermediate :], np.asarray(p["layers.1.expert_up"][3]).T)
    np.testing.assert_array_equal(t["model.layers.1.experts.down_proj"][5], np.asarray(p["layers.1.expert_down"][5]).T)
    assert "model.layers.2.self_attn.v_proj.weight" not in t  # K=V full layer
    assert t["model.layers.2.layer_scalar"].shape == (1,)


def test_loads_transformers_checkpoint(hf_checkpoint):
    folder, model = hf_checkpoint("tiny-moe")
    cfg, p = load_checkpoint(folder)
    sd = model.state_dict()
    np.testing.assert_array_equal(
        np.asarray(p["layers.0.mlp_down"]), sd["model.layers.0.mlp.down_proj.weight"].numpy().T
    )
    np.testing.assert_array_equal(
        np.asarray(p["layers.2.expert_scale"]), sd["model.layers.2.router.per_expert_scale"].numpy()
    )


def _rewrite(folder: Path, fn) -> None:
    """Apply ``fn`` to the {name: array} of a single-file checkpoint and write it back."""
    t = load_file(folder / "model.safetensors")
    save_file(fn(t), folder / "model.safetensors")


def test_sharded_multimodal_and_older_names(tmp_path):
    """Shards with an index (a vision-only shard absent), the ``model.language_model.`` prefix next to
    vision tensors and a tied ``lm_head.weight``, and the older ``.moe.`` expert names all load the same."""
    cfg = TINY_MOE
    p = random_params(cfg, seed=4)
    save_checkpoint(p, cfg, tmp_path)
    t = load_file(tmp_path / "model.safetensors")
    renamed = {}
    for k, v in t.items():
        k = k.replace("model.", "model.language_model.", 1)
        k = k.replace(".experts.", ".moe.").replace(".router.per_expert_scale", ".moe.per_expert_scale")
        renamed[k] = v
    renamed["lm_head.weight"] = t["model.embed_tokens.weight"]
    names = sorted(renamed)
    shards = {
        "model-00001-of-00003.safetensors": names[::2] + ["model.vision_tower.patch.weight"],
        "model-00002-of-00003.safetensors": names[1::2],
    }
    renamed["model.vision_tower.patch.weight"] = np.ones((4, 4), np.float32)
    (tmp_path / "model.safetensors").unlink()
    for f, ks in shards.items():
        save_file({k: renamed[k] for k in ks}, tmp_path / f)
    # A vision-only shard the index names but a text-only download left out.
    shards["model-00003-of-00003.safetensors"] = ["model.vision_tower.other.weight"]
    index = {"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    hf = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4", "text_config": hf}))
    _, q = load_checkpoint(tmp_path)
    assert _equal(p, q)


def test_load_from_hub_cache_offline(tmp_path):
    """A repo id resolves through huggingface_hub; with HF_HUB_OFFLINE it is served from the local cache."""
    snap = tmp_path / "hub" / "models--someone--tiny-gemma4" / "snapshots" / ("a" * 40)
    save_checkpoint(random_params(TINY_DENSE, seed=0), TINY_DENSE, snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("a" * 40)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(tmp_path / "hub"), JAX_PLATFORMS="cpu")
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mk",
            "generate",
            "--checkpoint",
            "someone/tiny-gemma4",
            "--prompt-ids",
            "5,6,7",
            "--new-tokens",
            "3",
            "--json",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["engine"] == "reference" and len(out["tokens"]) == 1 and len(out["tokens"][0]) == 3


# Bad checkpoints -----------------------------------------------------------------------------------
@pytest.fixture
def saved(tmp_path):
    save_checkpoint(random_params(TINY_MOE, seed=0), TINY_MOE, tmp_path)
    return tmp_path


def test_other_model_type_is_refused(saved):
    d = to_hf_dict(TINY_MOE) | {"model_type": "gpt_neox"}
    (saved / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="model_type is 'gpt_neox': mk runs gemma4_text, llama"):
        load_checkpoint(saved)


def test_a_gemma_checkpoint_under_another_familys_config_names_what_differs(saved):
    """A config.json that says llama over Gemma 4 weights: the Gemma fields a Llama has not are named; with them gone,
    every tensor that does not fit a Llama is."""
    d = to_hf_dict(TINY_MOE) | {"model_type": "llama", "hidden_act": "silu"}
    (saved / "config.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match=r"llama config field\(s\) \[.*'enable_moe_block'"):
        load_checkpoint(saved)
    llama = {k: v for k, v in d.items() if k in ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                                                "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                                "head_dim", "tie_word_embeddings")}  # fmt: skip
    (saved / "config.json").write_text(json.dumps(llama))
    with pytest.raises(ValueError, match=r"(?s)checkpoint does not match config .*unexpected tensors"):
        load_checkpoint(saved)


def test_every_tensor_problem_reported_at_once(saved):
    def damage(t):
        t["model.layers.0.self_attn.q_proj.weight"] = t["model.layers.0.self_attn.q_proj.weight"][:, :8]
        t["model.layers.1.mlp.up_proj.weight"] = t["model.layers.1.mlp.up_proj.weight"].astype(np.int32)
        del t["model.layers.2.router.scale"]
        t["model.layers.2.self_attn.v_proj.weight"] = t["model.layers.0.self_attn.v_proj.weight"]
        return t

    _rewrite(saved, damage)
    with pytest.raises(ValueError) as e:
        load_checkpoint(saved)
    msg = str(e.value)
    assert "4 problem(s)" in msg
    for part in (
        "layers.0.self_attn.q_proj.weight has shape [256, 8], expected [256, 128]",
        "layers.1.mlp.up_proj.weight has dtype I32",
        "missing model.layers.2.router.scale",
        "unexpected tensors ['model.layers.2.self_attn.v_proj.weight']",
    ):
        assert part in msg


def test_truncated_file_is_a_clear_error(saved):
    f = saved / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-1000])
    with pytest.raises(ValueError, match="truncated"):
        load_checkpoint(saved)


def test_missing_pieces_and_wrong_config(saved, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a hub repo id"):
        load_checkpoint(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="differs"):
        load_checkpoint(saved, cfg=TINY_DENSE)
    (saved / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        load_checkpoint(saved)
    (saved / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_checkpoint(saved)


def test_failed_save_leaves_nothing_half_written(tmp_path, monkeypatch):
    p = random_params(TINY_DENSE, seed=0)
    bad = dict(p)
    del bad["layers.1.q"]
    with pytest.raises(ValueError, match="missing layers.1.q"):
        save_checkpoint(bad, TINY_DENSE, tmp_path / "a")
    assert not (tmp_path / "a").exists() or not os.listdir(tmp_path / "a")

    import safetensors.numpy

    def crash(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.numpy, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(p, TINY_DENSE, tmp_path / "b")
    assert os.listdir(tmp_path / "b") == []
