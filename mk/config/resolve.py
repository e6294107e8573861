"""What ``--model`` takes, resolved into a ModelConfig: a preset, a ``config.json`` or the folder holding it, a folder
of data/configs by its name, or a hub id whose config is in the local Hugging Face cache (nothing is downloaded)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..paths import CONFIGS_DIR
from .hf import from_hf_dict
from .model import FULL, SLIDING, ModelConfig
from .presets import PRESETS


def get_config(model: str | Path | ModelConfig) -> ModelConfig:
    """A model as every part of mk takes it: a preset name (``python -m mk models``), a ``config.json`` or the folder
    holding it (a checkpoint), a folder of data/configs by its name, or a hub id whose config is in the local Hugging
    Face cache (nothing is downloaded); a config is returned as it is. An unknown name says what was looked for."""
    if isinstance(model, ModelConfig):
        return model
    if str(model) in PRESETS:
        return PRESETS[str(model)]
    found = _hf_config_of(model)
    if found is None:
        raise ValueError(_unknown_model(model))
    return from_hf_dict(*found)


# a model's first sliding and first full layer at full width: a context's cost on a model whose every layer is read,
# at the weights' real shapes
LAYER_PAIR = "sliding+full"


def with_layers(model: str | Path | ModelConfig, layers: int | str | None) -> ModelConfig:
    """``model`` (as :func:`get_config` takes it) whole (``layers`` None or ``"all"``), its first ``layers``, or its
    first sliding and first full layer (``LAYER_PAIR``)."""
    cfg = get_config(model)
    if layers is None or layers == "all":
        return cfg
    if layers == LAYER_PAIR:
        if SLIDING not in cfg.layer_types or FULL not in cfg.layer_types:
            raise ValueError(f"{cfg.name} has no sliding and full layer to pair; give a layer count")
        return cfg.replace(name=f"{cfg.name}[{LAYER_PAIR}]", layer_types=(SLIDING, FULL), dense_layers=())
    return cfg.truncated(int(layers))


def _unknown_model(model) -> str:
    folders = ", ".join(sorted(p.name for p in CONFIGS_DIR.iterdir() if p.is_dir()))
    return (
        f"unknown model {str(model)!r}: not a preset ({', '.join(PRESETS)}), not a config.json or a folder holding "
        f"one, not a folder of data/configs ({folders}), and not a hub id in the local Hugging Face cache (download "
        "it first, e.g. `hf download ID config.json`)"
    )


def _hf_config_of(model: str | Path) -> tuple[dict, str] | None:
    """The ``config.json`` of ``model`` and the model's name: a path to it or to the folder holding it (named after
    the folder), a folder of data/configs by its name (``llama-3.2-1b``), or a hub id (owner/name) whose config is in
    the local Hugging Face cache; None for none of these."""
    if Path(model).exists():
        return read_config_json(model)
    s = str(model)
    if s and (CONFIGS_DIR / s / "config.json").is_file():
        return read_config_json(CONFIGS_DIR / s)
    if is_hub_id(s) and not s.startswith("."):  # owner/name, not a relative path
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(s, "config.json")
        if isinstance(cached, str):
            return _config_object(Path(cached)), s
    return None


def read_config_json(path: str | Path) -> tuple[dict, str]:
    """``config.json`` (or the folder holding it) as a dict, and the name of its folder (the model's name)."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.exists():
        raise FileNotFoundError(f"no config.json at {p}")
    return _config_object(p), p.parent.name or "hf"


def _config_object(p: Path) -> dict:
    """The JSON object a config file holds; a file that holds none is refused in one line that names it."""
    expected = "expected a model's config.json, one JSON object of its fields (data/configs/*/config.json are some)"
    try:
        d = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{p} is not valid JSON ({e}): {expected}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{p} holds a JSON {type(d).__name__}, not an object: {expected}")
    return d


def is_hub_id(s: str) -> bool:
    """Whether ``s`` has the form of a Hugging Face hub repo id (owner/name)."""
    return re.fullmatch(r"[\w.-]+/[\w.-]+", s) is not None


def load_hf_config(path: str | Path) -> ModelConfig:
    """Read ``config.json`` (or the folder holding it)."""
    d, name = read_config_json(path)
    return from_hf_dict(d, name=name)
