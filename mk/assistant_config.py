"""Gemma 4's assistant (the drafter transformers calls ``Gemma4AssistantForCausalLM``) as a description, no JAX: its
config read from config.json, the tensors it has, the bytes a draft step reads, and whether it drafts for a target.
mk.assistant runs it; mk.weights loads its checkpoint; mk.timing prices its drafts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig, from_hf_dict, read_config_json
from .params import param_specs

MODEL_TYPE = "gemma4_assistant"
# the attention weights a query-only layer has: no k/v projections, no k norm
_QUERY_ONLY_SKIP = ("k", "v", "k_norm")


@dataclass(frozen=True)
class AssistantConfig:
    """An assistant: its decoder (a Gemma 4 text config) and the hidden width of the target it was trained for."""

    decoder: ModelConfig
    backbone_hidden_size: int

    @property
    def name(self) -> str:
        return self.decoder.name

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """mk's tree of an assistant: the decoder's tree less every layer's k/v projections and k norm, plus the two
        projections (``[in, out]``, as mk stores matrices); ``embed`` is also the head."""
        out = {}
        for s in param_specs(self.decoder):
            if s.path.startswith("layers.") and s.path.rsplit(".", 1)[1] in _QUERY_ONLY_SKIP:
                continue
            out[s.path] = s.shape
        h, hb = self.decoder.hidden_size, self.backbone_hidden_size
        out["pre_projection"] = (2 * hb, h)
        out["post_projection"] = (h, hb)
        return out

    def weight_bytes(self, itemsize: int = 2) -> int:
        """Bytes of the weights one draft step reads: every tensor of :meth:`param_shapes`, the embedding table whole
        (it is the tied head)."""
        return sum(int(np.prod(s)) for s in self.param_shapes().values()) * itemsize


def assistant_config(d: dict, name: str = "assistant") -> AssistantConfig:
    """An :class:`AssistantConfig` from a ``gemma4_assistant`` config.json dict."""
    if d.get("model_type") != MODEL_TYPE:
        raise ValueError(
            f"config model_type is {d.get('model_type')!r}, not {MODEL_TYPE!r}: --assistant takes a Gemma 4 assistant "
            "checkpoint (Gemma4AssistantForCausalLM)"
        )
    if d.get("use_ordered_embeddings"):
        raise ValueError(
            f"assistant {name!r} uses ordered embeddings (a centroid-masked head), which mk does not implement: "
            "use an assistant with use_ordered_embeddings false"
        )
    if "text_config" not in d or "backbone_hidden_size" not in d:
        raise ValueError(f"assistant config {name!r} needs text_config and backbone_hidden_size")
    tc = dict(d["text_config"])
    shared = tc.pop("num_kv_shared_layers", tc.get("num_hidden_layers"))
    if shared != tc.get("num_hidden_layers"):
        raise ValueError(
            f"assistant {name!r}: num_kv_shared_layers={shared} but an assistant's every layer reads the target's K/V "
            f"(num_hidden_layers={tc.get('num_hidden_layers')})"
        )
    return AssistantConfig(from_hf_dict(tc, name=name), int(d["backbone_hidden_size"]))


def source_layers(target: ModelConfig) -> dict[str, int]:
    """The target's layer whose K/V the assistant reads, for each attention type: the last of that type."""
    return {t: max(i for i, u in enumerate(target.layer_types) if u == t) for t in set(target.layer_types)}


def check_pair(a: AssistantConfig, target: ModelConfig) -> None:
    """That ``a`` drafts for ``target``: the target's hidden width, vocabulary, and K/V shapes of every attention
    type the assistant has."""
    problems = []
    if a.backbone_hidden_size != target.hidden_size:
        problems.append(
            f"its backbone_hidden_size is {a.backbone_hidden_size}, the target's hidden size {target.hidden_size}"
        )
    if a.decoder.vocab_size != target.vocab_size:
        problems.append(f"its vocabulary has {a.decoder.vocab_size} tokens, the target's {target.vocab_size}")
    for t in sorted(set(a.decoder.layer_types)):
        if t not in target.layer_types:
            problems.append(f"it has {t} layers, the target none to read K/V from")
            continue
        mine, theirs = (a.decoder.kv_heads(t), a.decoder.head_dim(t)), (target.kv_heads(t), target.head_dim(t))
        if mine != theirs:
            problems.append(
                f"its {t} layers read {mine[0]} KV heads of {mine[1]}, the target has {theirs[0]} of {theirs[1]}"
            )
    if problems:
        raise ValueError(
            f"assistant {a.name!r} does not draft for {target.name!r}: "
            + "; ".join(problems)
            + ". Use the assistant released with this target"
        )


def read_assistant_config(path) -> AssistantConfig:
    """An assistant's config from its folder (or config.json), no weights."""
    d, name = read_config_json(path)
    return assistant_config(d, name=name)
