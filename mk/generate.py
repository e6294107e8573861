"""Greedy generation with a pluggable decode engine.

An engine is a name and a ``make_step(cfg)`` returning a step with ``mk.reference.decode_step``'s
signature: ``step(params, cfg, cache, tokens[B], pos, knockout) -> (logits[B, V], cache)``; a step may
offer ``step.prepare(params, cfg)``, the parameter layout it runs on, made once per tree (mk.bench
times the step on it). The prompt is always prefilled by the reference (engines are decode engines);
the engine then decodes every new token after the first. Engines living in other modules register themselves on import; the modules
listed in ``ENGINE_MODULES`` are imported (when present) before the registry is read.
"""

from __future__ import annotations

import importlib
from typing import Callable

import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from .config import Gemma4Config
from .params import check_knockout
from .reference import check_tokens, decode_step, init_cache, prefill

Step = Callable[..., tuple]
_ENGINES: dict[str, tuple[Callable[[Gemma4Config], Step], int]] = {}
# Modules that register engines when imported (the megakernel lives outside this module on purpose).
ENGINE_MODULES = ("mk.megakernel",)


def register_engine(name: str, make_step: Callable[[Gemma4Config], Step], cache_multiple: int = 1) -> None:
    """Make ``name`` usable as ``generate(engine=name)`` and ``python -m mk generate --engine name``.

    ``cache_multiple``: the engine reads full-layer caches in blocks of this many positions, so generate
    rounds the cache length up to a multiple of it (the extra slots are masked: results do not change).
    """
    if not isinstance(cache_multiple, int) or cache_multiple <= 0:
        raise ValueError(f"cache_multiple must be a positive integer, got {cache_multiple!r}")
    _ENGINES[name] = (make_step, cache_multiple)


def engine_names() -> tuple[str, ...]:
    """Every registered engine, after importing the modules that register engines."""
    for mod in ENGINE_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:
            if e.name is None or not mod.startswith(e.name):
                raise  # the module exists but something it imports does not: a real error
    return tuple(_ENGINES)


def check_engine(engine: str) -> str:
    names = engine_names()
    if engine not in names:
        raise ValueError(f"unknown engine {engine!r}; registered engines: {', '.join(names)}")
    return engine


def get_step(engine: str, cfg: Gemma4Config) -> Step:
    return _ENGINES[check_engine(engine)][0](cfg)


register_engine("reference", lambda cfg: decode_step)


def generate(params: dict, cfg: Gemma4Config, prompt, new_tokens: int, engine: str = "reference",
             knockout=frozenset(), max_len: int | None = None, cache_dtype=jnp.float32,
             return_logits: bool = False, progress: bool = False):
    """Greedy-decode ``new_tokens`` tokens for each user after ``prompt [B, T]`` (every user its own prompt).

    Returns the new token ids ``np.ndarray [B, new_tokens]`` int32, and with ``return_logits`` also the
    logits that chose them, ``[B, new_tokens, V]`` float32. The cache holds ``max_len`` positions
    (default: prompt plus new tokens), rounded up to the engine's ``cache_multiple``. ``knockout``
    applies to the decode steps only.
    """
    ko = check_knockout(knockout)
    prompt = check_tokens(cfg, prompt)
    if prompt.ndim != 2 or prompt.shape[0] == 0 or prompt.shape[1] == 0:
        raise ValueError(f"prompt must be [batch >= 1, length >= 1] token ids, got shape {prompt.shape}")
    if not isinstance(new_tokens, (int, np.integer)) or new_tokens <= 0:
        raise ValueError(f"new_tokens must be a positive integer, got {new_tokens!r}")
    B, T = prompt.shape
    need = T + new_tokens - 1  # positions written: the prompt, then every new token but the last
    max_len = need if max_len is None else max_len
    if cfg.full_layers and max_len < need:
        raise ValueError(f"a prompt of {T} plus {new_tokens} new tokens needs {need} cache positions, "
                         f"the cache holds {max_len}")
    step = get_step(engine, cfg)
    multiple = _ENGINES[engine][1]
    cache = init_cache(cfg, B, -(-max_len // multiple) * multiple, cache_dtype)
    logits, cache = prefill(params, cfg, prompt, cache)
    tokens, all_logits = [], []
    for n in tqdm(range(new_tokens), desc=f"generate ({engine})", disable=not progress):
        if n:
            logits, cache = step(params, cfg, cache, tok, T + n - 1, ko)
        tok = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        tokens.append(tok)
        if return_logits:
            all_logits.append(logits)
    out = np.stack([np.asarray(t) for t in tokens], axis=1)
    if return_logits:
        return out, np.stack([np.asarray(x) for x in all_logits], axis=1)
    return out
