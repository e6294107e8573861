"""Weights for mk's parameter tree: seeded random initialisation, and loading and saving checkpoints
in the Hugging Face layout of each family mk runs (Gemma 4, Llama 3, Qwen3, Qwen3-MoE, Mixtral, gpt-oss; DeepSeek-V3
and Kimi K2), and in the formats big models ship in (mk.checkpoint_formats: decoded to float on load).

Each family's names and layouts are mk.hf_layout's (``hf_tensor_map``, the one place the two are tied together,
used both ways, so a save and a load round-trip exactly).

Loading is lazy: ``safe_open`` memory-maps each file and one tensor at a time is read, transposed and
cast, so a 52 GB checkpoint never needs twice its size in RAM.

INT8 trees (mk.quant) are saved and loaded too. The codes take the float weight's place, under its Hugging
Face name and layout, as ``I8``; the scales of the tensor ``N`` are ``N + "_qscale"`` (F32), as mk.quant keeps
them: ``[out]`` for a Linear ``[out, in]``, ``[E, 2I]`` for ``gate_up_proj`` (the gate's scales first, as its
rows), and one per input channel for a down projection: ``[I]`` for a Linear, ``[E, I]`` for ``down_proj``.
config.json names the scheme:
``"quantization_config": {"quant_method": "mk-int8", "scheme": "int8-experts", "scale_suffix": "_qscale"}``.
A load gives back the quantized tree exactly (codes and scales bit for bit). transformers cannot run such a
checkpoint (it is mk's format, not one of transformers' quantization methods).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from .assistant_config import AssistantConfig, check_pair, read_assistant_config
from .checkpoint_formats import FORMATS, CheckpointFormat, DecodedCheckpoint
from .config import ModelConfig, from_hf_dict, is_hub_id, read_config_json, to_hf_dict
from .files import write_atomic
from .format_trees import format_of, format_paths, fscale_path, get_format
from .hf_layout import from_hf_layout, hf_scale_shape, hf_shape, hf_tensor_map, interleaved, scale_from_hf
from .params import NORMS, ROUTER, count_params, param_specs, scales_inputs
from .progress import tqdm
from .quant import SCALE_SUFFIX, SCHEMES, quantized_paths, scale_path, scheme_of
from .reference import expert_layout, prepare
from .sharding.mesh import gspmd_sharding

# Prefixes of the text model: a Gemma4ForConditionalGeneration export, then a text-only Gemma4ForCausalLM.
TEXT_PREFIXES = ("model.language_model.", "model.")
# Tensors of a multimodal export that a text decoder never reads.
_NON_TEXT = re.compile(r"^(model\.)?(vision_tower|audio_tower|embed_vision|embed_audio|multi_modal_projector)\.")
# Files a text-only download needs; the shards are narrowed further by the index (see _hub_snapshot).
_HUB_META = ["config.json", "model.safetensors.index.json"]


# Random initialisation -------------------------------------------------------------------------
EMBED_STD = 0.25  # times hidden^-0.5; see random_params
NORM_STD = 0.1  # spread of norm weights and scales around 1


def random_params(cfg: ModelConfig, seed: int, dtype=jnp.float32) -> dict[str, jax.Array]:
    """The full parameter tree of ``cfg``, seeded and deterministic (a new dict each call; a small model's arrays
    drawn once a process, see :data:`_MEMO_ELEMENTS`).

    Matrices are N(0, 1/fan_in) so every projection keeps its input's scale. The embedding is
    N(0, EMBED_STD^2/hidden): with a tied head, a larger embedding makes each token's own row win the
    argmax (greedy output repeats its input); at this scale the layers steer the next token and the
    logits spread over about +-0.25 (N(0, EMBED_STD)). Norm weights, ``layer_scalar``, ``router_scale``
    and ``expert_scale`` are 1 + N(0, 0.1): near 1 as in a trained model, but not all equal, so a
    wrong wiring shows. Biases and attention sinks (:func:`is_offset`) are N(0, 0.1): small, not zero.
    """
    if count_params(cfg) <= _MEMO_ELEMENTS:
        return dict(_small_random_params(cfg, seed, jnp.dtype(dtype)))
    return _draw_params(cfg, seed, dtype)


# A tiny model's tree is drawn again and again by the tests and notebooks in one process (one eager op a tensor:
# 1-3 s for a 12-layer tiny MoE); its arrays are immutable, so each call gets a new dict of the same arrays.
# A real model's (a gigabyte or more) is never kept.
_MEMO_ELEMENTS = 2**24


@functools.lru_cache(maxsize=16)
def _small_random_params(cfg: ModelConfig, seed: int, dtype) -> dict[str, jax.Array]:
    return _draw_params(cfg, seed, dtype)


def _draw_params(cfg: ModelConfig, seed: int, dtype) -> dict[str, jax.Array]:
    key = jax.random.key(seed)
    out = {}
    for idx, s in enumerate(param_specs(cfg)):
        k = jax.random.fold_in(key, idx)
        if s.path == "embed":
            x = jax.random.normal(k, s.shape, jnp.float32) * (EMBED_STD * s.shape[1] ** -0.5)
        elif s.path == "head":  # an untied head [V, H]: fan-in H
            x = jax.random.normal(k, s.shape, jnp.float32) * s.shape[1] ** -0.5
        elif s.matrix:
            fan_in = s.shape[-2]
            x = jax.random.normal(k, s.shape, jnp.float32) * fan_in**-0.5
        elif is_offset(s.path):
            x = NORM_STD * jax.random.normal(k, s.shape, jnp.float32)
        elif s.component in (NORMS, ROUTER):
            x = 1.0 + NORM_STD * jax.random.normal(k, s.shape, jnp.float32)
        else:
            raise AssertionError(f"no initialiser for {s.path} ({s.component})")
        out[s.path] = x.astype(dtype)
    return out


def is_offset(path: str) -> bool:
    """Whether tensor ``path`` is added rather than multiplied: a bias or an attention sink (drawn around 0)."""
    return path.endswith(("_bias", "sinks"))


# The same weights drawn where they are used, one tensor at a time ------------------------------------
def _draw(key, shape: tuple[int, ...], kind: str, scale: float, dtype, sharding):
    z = jax.random.normal(key, shape, jnp.float32)
    x = (1.0 + scale * z if kind == "vector" else z * scale).astype(dtype)
    # over a mesh each chip draws only its own part (JAX's threefry generator is partitionable)
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


_draw_jit = jax.jit(_draw, static_argnames=("shape", "kind", "scale", "dtype", "sharding"))


def random_tensors(cfg: ModelConfig, seed: int = 0, dtype=jnp.bfloat16, device=None, log=None):
    """``random_params``' tensors one at a time, as ``(path, array)``: each drawn (the same distributions and
    keys) and cast in one jitted program on ``device`` (a JAX device, default the first), or over a
    ``jax.sharding.Mesh``, each tensor split as ``mk.sharding.mesh.gspmd_sharding`` says: no float32 copy of
    the model is made, nor a whole model held by one chip of a mesh. The values are ``random_params``'
    but for a few bf16 roundings (float32 rounding in a different fusion, then the cast). ``log``: a line
    every fifth of the layers."""
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    mesh = device if isinstance(device, Mesh) else None
    place = NamedSharding(mesh, P()) if mesh is not None else (device or jax.devices()[0])
    key = jax.device_put(jax.random.key(seed), place)
    layer = -1
    for idx, s in enumerate(param_specs(cfg)):
        if s.path == "embed":
            kind, scale = "matrix", EMBED_STD * s.shape[1] ** -0.5
        elif s.path == "head":
            kind, scale = "matrix", s.shape[1] ** -0.5
        elif s.matrix:
            kind, scale = "matrix", s.shape[-2] ** -0.5
        elif is_offset(s.path):
            kind, scale = "matrix", NORM_STD
        else:
            kind, scale = "vector", NORM_STD
        sharding = None if mesh is None else gspmd_sharding(mesh, s.shape)
        k = jax.random.fold_in(key, idx)
        yield s.path, _draw_jit(k, shape=s.shape, kind=kind, scale=scale, dtype=jnp.dtype(dtype), sharding=sharding)
        if log is not None and s.path.startswith("layers."):
            i = int(s.path.split(".")[1])
            if i != layer and (i + 1) % max(1, cfg.num_layers // 5) == 0:
                log(f"weights: layer {i + 1}/{cfg.num_layers} drawn")
            layer = i


def device_params(cfg: ModelConfig, seed: int = 0, dtype=jnp.bfloat16, device=None, log=None) -> dict:
    """``mk.reference.prepare(random_params(cfg, seed, dtype))`` built on ``device`` (or over a mesh) from
    ``random_tensors``, each tensor laid out for the decode step as it comes, so the device (each chip of the
    mesh) never holds more than the model (its share) plus one tensor's two copies, and the host holds none of
    it. Over a mesh every array of the layout is split as ``mk.sharding.mesh.gspmd_sharding`` says."""
    from jax.sharding import Mesh

    mesh = device if isinstance(device, Mesh) else None
    first = mesh.devices.flat[0] if mesh is not None else device
    experts = expert_layout(None if first is None else first.platform)  # the layout of the device it is made on
    out: dict = {}
    for path, x in random_tensors(cfg, seed, dtype, device, log):
        laid = prepare({path: x}, cfg, experts)  # the decode layout, one tensor at a time
        if mesh is not None:  # a transposed or split tensor keeps to the rule (a no-op where it already does)
            laid = jax.tree.map(lambda a: jax.device_put(a, gspmd_sharding(mesh, a.shape)), laid)
        out.update(laid)
        del x
    return out


# Quantization in config.json --------------------------------------------------------------------
QUANT_METHOD = "mk-int8"


def quantization_config(scheme: str) -> dict | None:
    """What config.json says about a tree quantized with ``scheme`` (None for a float tree)."""
    if scheme == "none":
        return None
    return {"quant_method": QUANT_METHOD, "scheme": scheme, "scale_suffix": SCALE_SUFFIX}


def _read_quantization(hf: dict, cfg_file: Path) -> tuple[str, str, CheckpointFormat | None]:
    """(scheme, scale suffix, shipped format) of a checkpoint's config.json: ("none", ..., None) without a
    quantization_config; a format big models ship in (mk.checkpoint_formats: FP8 blocks, INT4 groups, MXFP4) loads
    decoded to float (scheme "none")."""
    q = hf.get("quantization_config") or (hf.get("text_config") or {}).get("quantization_config")
    if not q:
        return "none", SCALE_SUFFIX, None
    if isinstance(q, dict) and q.get("quant_method") in FORMATS:
        return "none", SCALE_SUFFIX, CheckpointFormat.from_config(q, str(cfg_file))
    if not isinstance(q, dict) or q.get("quant_method") != QUANT_METHOD:
        method = q.get("quant_method") if isinstance(q, dict) else q
        raise ValueError(
            f"{cfg_file} has a quantization_config with quant_method {method!r}: mk reads float checkpoints, "
            f"its own INT8 ones ({QUANT_METHOD!r}) and the formats {', '.join(FORMATS)}, not this one"
        )
    scheme = q.get("scheme")
    if scheme not in SCHEMES[1:]:
        raise ValueError(f"{cfg_file}: quantization_config scheme {scheme!r} is not one of {', '.join(SCHEMES[1:])}")
    suffix = q.get("scale_suffix", SCALE_SUFFIX)
    if not isinstance(suffix, str) or not suffix:
        raise ValueError(f"{cfg_file}: quantization_config scale_suffix must be a non-empty string, got {suffix!r}")
    return scheme, suffix, None


# Loading ------------------------------------------------------------------------------------------
_FLOAT_DTYPES = ("F32", "BF16", "F16", "F64")
_CODE_DTYPE, _SCALE_DTYPE = "I8", "F32"


def _text_shards(index: Path) -> list[str]:
    """The shard files an index names for text tensors (a text-only download leaves vision/audio shards out)."""
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError) as e:
        raise ValueError(f"{index} is not a safetensors index (needs a 'weight_map'): {e}") from None
    return sorted({f for n, f in weight_map.items() if not _NON_TEXT.match(n)})


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a checkpoint folder: the text shards its index names, else its *.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = [folder / f for f in _text_shards(index)]
    else:
        files = sorted(folder.glob("*.safetensors"))
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint shard(s) missing: {missing}; download the whole checkpoint again")
    if not files:
        raise FileNotFoundError(
            f"no *.safetensors file in {folder}; expected model.safetensors or shards with model.safetensors.index.json"
        )
    return files


class SafetensorsCheckpoint:
    """Lazy view of a set of safetensors files: name -> (file, shape, dtype), tensors read on demand."""

    def __init__(self, files: list[Path]):
        from safetensors import SafetensorError, safe_open

        self._handles = {}
        self._headers: dict[Path, tuple[int, dict]] = {}  # a file's data start and header, once it is read raw
        self.where: dict[str, Path] = {}
        self.info: dict[str, tuple[tuple[int, ...], str]] = {}
        for f in files:
            try:
                h = safe_open(str(f), framework="np")
            except SafetensorError as e:
                raise ValueError(
                    f"{f} is not a readable safetensors file ({e}); it may be truncated or "
                    "corrupt: download or save it again"
                ) from None
            self._handles[f] = h
            for name in h.keys():
                sl = h.get_slice(name)
                self.where[name] = f
                self.info[name] = (tuple(sl.get_shape()), sl.get_dtype())

    def read(self, name: str) -> np.ndarray:
        shape, dtype = self.info[name]
        if dtype in _RAW_DTYPES:  # safetensors' NumPy reader has no FP8 type: the bytes, viewed as ml_dtypes' own
            return self._raw_bytes(name).view(_RAW_DTYPES[dtype]).reshape(shape)
        return self._handles[self.where[name]].get_tensor(name)

    def _raw_bytes(self, name: str) -> np.ndarray:
        """A tensor's bytes, by its file's header offsets (an 8-byte length, the JSON header, the data); each file's
        header is parsed once (a real checkpoint's names thousands of tensors)."""
        file = self.where[name]
        with open(file, "rb") as f:
            if file not in self._headers:
                n = int.from_bytes(f.read(8), "little")
                self._headers[file] = (8 + n, json.loads(f.read(n)))
            data, header = self._headers[file]
            start, end = header[name]["data_offsets"]
            f.seek(data + start)
            return np.frombuffer(f.read(end - start), np.uint8)


_RAW_DTYPES = {"F8_E4M3": ml_dtypes.float8_e4m3fn, "F8_E5M2": ml_dtypes.float8_e5m2}


def _text_prefix(names) -> str:
    for p in TEXT_PREFIXES:
        if any(n.startswith(p + "embed_tokens.") or n.startswith(p + "layers.") for n in names):
            return p
    return TEXT_PREFIXES[-1]


def _plan_load(
    cfg: ModelConfig, ckpt: SafetensorsCheckpoint, scheme: str = "none", suffix: str = SCALE_SUFFIX
) -> dict[str, list[tuple[str, str, str | None]]]:
    """Resolve each mk path to its checkpoint tensor(s) and check presence, shape and dtype of all of them
    (under ``scheme``, its matrices as I8 codes with their F32 scales under ``name + suffix``).

    Returns ``{mk_path: [(checkpoint_name, kind, scale_name or None), ...]}``: one part, or one per expert for a
    tensor stored expert by expert (kind ``experts``: each part a ``linear``); or raises one error listing every
    problem.
    """
    prefix = _text_prefix(ckpt.info)
    plan, problems, used = {}, [], set()
    shapes = {s.path: s.shape for s in param_specs(cfg)}
    int8 = set(quantized_paths(cfg, scheme))

    def check(path: str, found: str, kind: str, shape: tuple[int, ...]) -> str | None:
        """Problems of one stored tensor (each checked once); its scale's name under INT8."""
        first = found not in used  # gate_up_proj holds two mk tensors: check it once
        used.add(found)
        stored, dtype = ckpt.info[found]
        want = hf_shape(kind, shape)
        if first and stored != want:
            problems.append(f"{found} has shape {list(stored)}, expected {list(want)} for this config")
        if path not in int8:
            if first and dtype not in _FLOAT_DTYPES:
                hint = (
                    " (INT8 weights load only with the quantization_config mk writes in config.json)"
                    if dtype == _CODE_DTYPE and scheme == "none"
                    else f" (quantization scheme {scheme} keeps it in float)"
                    if dtype == _CODE_DTYPE
                    else ""
                )
                problems.append(f"{found} has dtype {dtype}, expected one of {_FLOAT_DTYPES}{hint}")
            return None
        scale = found + suffix
        if first and dtype != _CODE_DTYPE:
            problems.append(f"{found} has dtype {dtype}, expected {_CODE_DTYPE} (quantization scheme {scheme})")
        if first and scale not in ckpt.info:
            problems.append(f"missing {scale} (the scales of {found}, quantization scheme {scheme})")
        elif first:
            s_shape, s_dtype = ckpt.info[scale]
            s_want = hf_scale_shape(path, kind, shape)
            if s_shape != s_want:
                per = "input column" if scales_inputs(path) else "output row"
                problems.append(
                    f"{scale} has shape {list(s_shape)}, expected {list(s_want)} (one scale per {per} of {found})"
                )
            if s_dtype != _SCALE_DTYPE:
                problems.append(f"{scale} has dtype {s_dtype}, expected {_SCALE_DTYPE}")
        used.add(scale)
        return scale

    for path, t in hf_tensor_map(cfg).items():
        at = prefix if t.in_text_model else ""
        if t.kind == "experts":  # one Linear per expert
            parts = [(e, at + t.names[0].format(e=e)) for e in range(shapes[path][0])]
            absent = [n for _, n in parts if n not in ckpt.info]
            if absent:
                problems.append(f"missing {absent[0]}" + (f" and {len(absent) - 1} more" if len(absent) > 1 else "")
                                + f" (for {path})")  # fmt: skip
                continue
            plan[path] = [(n, "linear", check(path, n, "linear", shapes[path][1:])) for _, n in parts]
            continue
        found = next((at + n for n in t.names if at + n in ckpt.info), None)
        if found is None:
            problems.append(f"missing {at + t.names[0]} (for {path})")
            continue
        plan[path] = [(found, t.kind, check(path, found, t.kind, shapes[path]))]
    # Tied embeddings: an lm_head.weight, if saved, is the embedding again and is not read.
    tied_head = "lm_head.weight" if cfg.tied_embeddings else None
    extra = sorted(n for n in ckpt.info if n not in used and not _NON_TEXT.match(n) and n != tied_head)
    if extra:
        more = f" (and {len(extra) - 8} more)" if len(extra) > 8 else ""
        problems.append(f"unexpected tensors {extra[:8]}{more}: the checkpoint has parts this config does not")
    if problems:
        raise ValueError(
            f"checkpoint does not match config {cfg.name!r} ({len(problems)} problem(s)):\n  " + "\n  ".join(problems)
        )
    return plan


def _hub_snapshot(repo_id: str) -> Path:
    """Download (or find in the local cache when HF_HUB_OFFLINE is set) the text weights of a hub repo."""
    from huggingface_hub import snapshot_download

    folder = Path(snapshot_download(repo_id, allow_patterns=_HUB_META))
    index = folder / "model.safetensors.index.json"
    shards = _text_shards(index) if index.exists() else ["model.safetensors"]
    return Path(snapshot_download(repo_id, allow_patterns=_HUB_META + shards))


def checkpoint_folder(path_or_repo_id: str | os.PathLike) -> Path:
    p = Path(path_or_repo_id)
    if p.exists():
        if not p.is_dir():
            raise ValueError(f"{p} is a file; pass the checkpoint folder (with config.json and *.safetensors)")
        return p
    s = str(path_or_repo_id)
    if is_hub_id(s):
        return _hub_snapshot(s)
    raise FileNotFoundError(f"no checkpoint folder {s!r}, and it is not a hub repo id (owner/name)")


def load_checkpoint(
    path_or_repo_id, cfg: ModelConfig | None = None, dtype=None, codes: bool = False
) -> tuple[ModelConfig, dict[str, jax.Array]]:
    """Load a Gemma 4 text checkpoint (folder, sharded folder, or hub repo id) into mk's parameter tree.

    ``cfg`` defaults to the checkpoint's ``config.json``; when given, it must describe the same model.
    ``dtype`` casts every float tensor on the way (default: keep the stored dtype). Every tensor's presence,
    shape and dtype is checked before any is read, and all problems are reported in one error.

    A checkpoint whose config.json has mk's ``quantization_config`` loads as the quantized tree it was saved
    from (mk.quant): INT8 codes and float32 scales exactly as stored (``dtype`` does not touch them), the
    scales after the other tensors, in ``mk.quant.quantized_paths`` order, as ``mk.quant.quantize`` makes them.
    A checkpoint in a format big models ship in (FP8 blocks, packed INT4 groups, MXFP4: mk.checkpoint_formats) loads as
    the float tree those weights stand for, each encoded tensor decoded to float32 (then cast to ``dtype``); with
    ``codes``, as the format's tree (mk.format_trees: codes and scales as stored, for the megakernel to stream; a float
    checkpoint loads as it always does).
    """
    folder = checkpoint_folder(path_or_repo_id)
    cfg_file = folder / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"no config.json in {folder}: not a Hugging Face checkpoint folder")
    hf, _ = read_config_json(cfg_file)
    file_cfg = from_hf_dict(hf, name=folder.name or "hf")
    if cfg is None:
        cfg = file_cfg
    elif cfg.replace(name=file_cfg.name) != file_cfg:
        diff = {
            k: (v, getattr(file_cfg, k)) for k, v in cfg.to_dict().items() if k != "name" and getattr(file_cfg, k) != v
        }
        raise ValueError(f"config {cfg.name!r} differs from {cfg_file} in {{field: (given, file)}} {diff}")
    scheme, suffix, shipped = _read_quantization(hf, cfg_file)
    ckpt = SafetensorsCheckpoint(safetensors_files(folder))
    if shipped is not None:
        ckpt = DecodedCheckpoint(ckpt, shipped)
    plan = _plan_load(cfg, ckpt, scheme, suffix)
    fmt = _codes_format(ckpt) if codes else None
    params, scales, cache = {}, {}, {}

    def read(name: str, kind: str) -> np.ndarray:
        # gate_up_proj feeds two mk tensors: keep it until its second half is taken.
        a = cache.pop(name, None)
        if a is None:
            a = ckpt.read(name)
            if kind in ("gate", "up", "gate_i", "up_i"):
                cache[name] = a
        return from_hf_layout(kind, a)

    layouts = hf_tensor_map(cfg)
    for path, parts in tqdm(plan.items(), desc=f"loading {folder.name}", leave=False):
        stacked = layouts[path].kind == "experts"  # experts stored one by one
        if fmt is not None and ckpt.encoded(parts[0][0]):  # the format's codes and scales, laid out as the float's
            pairs = [ckpt.read_codes(name) for name, _, _ in parts]
            for out, i in ((path, 0), (fscale_path(path), 1)):
                a = [from_hf_layout(kind, p[i]) for p, (_, kind, _) in zip(pairs, parts)]
                params[out] = jnp.asarray(np.ascontiguousarray(np.stack(a) if stacked else a[0]))
            continue
        arrays = [read(name, kind) for name, kind, _ in parts]
        a = np.stack(arrays) if stacked else arrays[0]
        if parts[0][2] is None:
            params[path] = jnp.asarray(np.ascontiguousarray(a, dtype=dtype or a.dtype))
        else:  # INT8 codes and their scales, as stored
            params[path] = jnp.asarray(np.ascontiguousarray(a))
            s_parts = [scale_from_hf(kind, ckpt.read(scale)) for _, kind, scale in parts]
            scales[scale_path(path)] = jnp.asarray(np.ascontiguousarray(np.stack(s_parts) if stacked else s_parts[0]))
    params.update((scale_path(p), scales[scale_path(p)]) for p in quantized_paths(cfg, scheme))
    if fmt is not None:
        encoded, want = sorted(p for p in plan if fscale_path(p) in params), sorted(format_paths(cfg, fmt))
        if encoded != want:
            raise ValueError(
                f"the checkpoint's encoded matrices ({len(encoded)}) are not those mk's {fmt} streams ({len(want)}; "
                f"e.g. {sorted(set(encoded) ^ set(want))[:3]}): load it decoded (codes=False)"
            )
    return cfg, params


def _codes_format(ckpt) -> str | None:
    """The mk.format_trees scheme a shipped format's checkpoint loads its codes as (None: a float checkpoint); refused
    by name if its blocks are not the scheme's."""
    if not isinstance(ckpt, DecodedCheckpoint):
        return None
    method = ckpt.format.method
    fmt = get_format({"fp8": "fp8-block", "compressed-tensors": "int4", "mxfp4": "mxfp4"}[method])
    block = {"fp8": ckpt.format.block[::-1], "compressed-tensors": (ckpt.format.group, 1)}.get(method, fmt.block)
    if tuple(block) != fmt.block:
        raise ValueError(
            f"the checkpoint's {method} blocks are {block} (in, out); mk's {fmt.name} streams {fmt.block}: load it "
            "decoded (codes=False)"
        )
    return fmt.name


# Saving -------------------------------------------------------------------------------------------
def save_checkpoint(params: dict[str, jax.Array], cfg: ModelConfig, folder) -> Path:
    """Write ``params`` as a Hugging Face checkpoint of its family (config.json + model.safetensors), as its
    transformers class (Gemma4ForCausalLM, LlamaForCausalLM, ...) saves one.

    A quantized tree (mk.quant) is written as its INT8 codes and float32 scales (see the module's
    docstring) with a ``quantization_config`` naming its scheme; :func:`load_checkpoint` reads it back
    exactly. Each file is written under a temporary name and renamed, so a crash never leaves a
    half-written file under the real name. Returns the folder.
    """
    from safetensors.numpy import save_file

    if format_of(params) is not None:
        raise ValueError(
            f"a {format_of(params)} tree (mk.format_trees) is not saved here: save its float tree, or write the "
            "format's tensors with mk.checkpoint_formats' encoders"
        )
    check_params(params, cfg)
    scheme = scheme_of(params, cfg)
    int8 = set(quantized_paths(cfg, scheme))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    dtypes = {str(params[s.path].dtype) for s in param_specs(cfg) if s.path not in int8}
    tensors = {}
    for path, t in hf_tensor_map(cfg).items():
        name = (TEXT_PREFIXES[-1] if t.in_text_model else "") + t.names[0]
        if t.kind in ("up", "up_i"):
            continue  # written with its gate half
        a = np.asarray(params[path])
        scale = np.asarray(params[scale_path(path)]) if path in int8 else None
        if t.kind == "gate":
            up_path = path.replace("expert_gate", "expert_up")
            up = np.asarray(params[up_path])
            tensors[name] = np.concatenate([a, up], axis=2).transpose(0, 2, 1)
            if scale is not None:
                scale = np.concatenate([scale, np.asarray(params[scale_path(up_path)])], axis=-1)
        elif t.kind == "gate_i":
            up_path = path.replace("expert_gate", "expert_up")
            tensors[name] = interleaved(a, np.asarray(params[up_path]))
            if scale is not None:
                scale = interleaved(scale, np.asarray(params[scale_path(up_path)]))
        elif t.kind == "gate_up_bias_i":
            tensors[name] = interleaved(*np.split(a, 2, axis=-1))
        elif t.kind == "experts":  # one Linear [out, in] per expert
            for e in range(a.shape[0]):
                tensors[name.format(e=e)] = a[e].T
                if scale is not None:
                    tensors[name.format(e=e) + SCALE_SUFFIX] = scale[e]
            continue
        elif t.kind == "linear":
            tensors[name] = a.T
        elif t.kind == "down":
            tensors[name] = a.transpose(0, 2, 1)
        else:
            tensors[name] = a
        if scale is not None:
            tensors[name + SCALE_SUFFIX] = scale
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    hf = to_hf_dict(cfg)
    hf["dtype"] = dtypes.pop() if len(dtypes) == 1 else "float32"
    if scheme != "none":
        hf["quantization_config"] = quantization_config(scheme)
    write_atomic(folder / "model.safetensors", lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    write_atomic(folder / "config.json", lambda tmp: tmp.write_text(json.dumps(hf, indent=2) + "\n"))
    return folder


def check_params(params: dict, cfg: ModelConfig) -> None:
    """Raise one error listing every missing, unexpected or wrongly shaped tensor of ``params``; in a
    quantized tree (mk.quant), also INT8 matrices outside every scheme and missing, misshapen or
    non-float32 scales."""
    specs = {s.path: s.shape for s in param_specs(cfg)}
    int8 = [p for p in specs if p in params and params[p].dtype == jnp.int8]
    scheme = next((sc for sc in SCHEMES if set(quantized_paths(cfg, sc)) == set(int8)), None)
    scales = {scale_path(p): specs[p][:-1] if scales_inputs(p) else specs[p][:-2] + specs[p][-1:] for p in int8}
    problems = [f"missing {p}" for p in specs if p not in params]
    problems += [f"unexpected {p}" for p in params if p not in specs and p not in scales]
    problems += [
        f"{p} has shape {list(params[p].shape)}, expected {list(s)}"
        for p, s in specs.items()
        if p in params and tuple(params[p].shape) != s
    ]
    if scheme is None:
        problems.append(
            f"the INT8 matrices ({len(int8)}) match no quantization scheme ({', '.join(SCHEMES[1:])}); "
            "quantize the float tree with mk.quant.quantize"
        )
    for p, s in scales.items():
        if p not in params:
            problems.append(f"missing {p} (the scales of INT8 {p.removesuffix(SCALE_SUFFIX)})")
        elif tuple(params[p].shape) != s:
            problems.append(f"{p} has shape {list(params[p].shape)}, expected {list(s)} (mk.quant's scales)")
        elif params[p].dtype != jnp.float32:
            problems.append(f"{p} has dtype {params[p].dtype}, expected float32")
    if problems:
        raise ValueError(f"parameters do not match config {cfg.name!r}: " + "; ".join(problems))


def load_assistant(path, target: ModelConfig, dtype=None) -> tuple[AssistantConfig, dict[str, jax.Array]]:
    """Load a Gemma 4 assistant checkpoint folder (or hub repo id) for ``target``: its config (checked against the
    target, mk.assistant_config.check_pair), then every tensor, each checked for presence and shape before any is
    read (all problems in one error), as mk's loader checks a target."""
    folder = checkpoint_folder(path)
    a = read_assistant_config(folder)
    check_pair(a, target)
    ckpt = SafetensorsCheckpoint(safetensors_files(folder))
    shapes = a.param_shapes()
    where = {p: ("model." + t.names[0], t.kind) for p, t in hf_tensor_map(a.decoder).items() if p in shapes}
    where.update(
        pre_projection=("pre_projection.weight", "linear"), post_projection=("post_projection.weight", "linear")
    )
    problems = []
    for path_, (name, kind) in where.items():
        if name not in ckpt.info:
            problems.append(f"missing {name} (for {path_})")
            continue
        stored = ckpt.info[name][0]
        want = tuple(reversed(shapes[path_])) if kind == "linear" else shapes[path_]
        if stored != want:
            problems.append(f"{name} has shape {list(stored)}, expected {list(want)} for this config")
    extra = sorted(set(ckpt.info) - {n for n, _ in where.values()} - {"lm_head.weight"})
    if extra:
        problems.append(f"unexpected tensors {extra[:8]}: the checkpoint has parts an assistant does not")
    if problems:
        raise ValueError(f"assistant checkpoint {folder} does not match its config ({len(problems)} problem(s)):\n  "
                         + "\n  ".join(problems))  # fmt: skip
    params = {}
    for path_, (name, kind) in tqdm(where.items(), desc=f"loading {folder.name}", leave=False):
        x = from_hf_layout(kind, ckpt.read(name))
        params[path_] = jnp.asarray(np.ascontiguousarray(x, dtype=dtype or x.dtype))
    return a, params
