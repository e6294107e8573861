"""Model configurations: one description of every decoder mk reads (mk.config.model: ModelConfig and its records),
the presets (mk.config.presets), a Hugging Face ``config.json`` read by one adapter per ``model_type`` and written
back for the families mk runs (mk.config.hf), and what ``--model`` takes resolved into a config (mk.config.resolve).

The reference, the step plan and the kernel, mk.sol's bytes and the parameter counts all read this one description;
what the reference or the kernel does not run, it refuses by name (ModelConfig.check_runnable)."""

from .hf import from_hf_dict, to_hf_dict
from .model import (
    ACTIVATIONS,
    CONFIG_FAMILIES,
    ENGINES,
    FFN_LAYOUTS,
    FULL,
    GATED_IN,
    GATED_OUT,
    GEMMA4,
    LAYER_TYPES,
    PLANNED_FAMILIES,
    PRE_NORM_FAMILIES,
    ROUTERS,
    RUNNABLE_FAMILIES,
    SLIDING,
    LatentAttention,
    LayerType,
    ModelConfig,
    RopeScaling,
    YarnScaling,
)
from .presets import (
    CPU_MOE,
    GEMMA4_26B_A4B,
    GEMMA4_31B,
    PRESETS,
    TINY_DENSE,
    TINY_LLAMA,
    TINY_MOE,
    TINY_QWEN3_MOE,
)
from .resolve import get_config, is_hub_id, load_hf_config, read_config_json

__all__ = [
    "ACTIVATIONS",
    "CONFIG_FAMILIES",
    "CPU_MOE",
    "ENGINES",
    "FFN_LAYOUTS",
    "FULL",
    "GATED_IN",
    "GATED_OUT",
    "GEMMA4",
    "GEMMA4_26B_A4B",
    "GEMMA4_31B",
    "LAYER_TYPES",
    "PLANNED_FAMILIES",
    "PRESETS",
    "PRE_NORM_FAMILIES",
    "ROUTERS",
    "RUNNABLE_FAMILIES",
    "SLIDING",
    "TINY_DENSE",
    "TINY_LLAMA",
    "TINY_MOE",
    "TINY_QWEN3_MOE",
    "LatentAttention",
    "LayerType",
    "ModelConfig",
    "RopeScaling",
    "YarnScaling",
    "from_hf_dict",
    "get_config",
    "is_hub_id",
    "load_hf_config",
    "read_config_json",
    "to_hf_dict",
]
