"""The decode engines by name: each a ``make_step(cfg, **options)`` and the slot multiple it reads caches in.

mk.generate registers the reference and runs any engine; an engine living elsewhere (the megakernel) registers itself
when its module is imported, and the modules in ``ENGINE_MODULES`` are imported (when present) before the registry
is read, so the registry sits below every engine and none imports another's module.
"""

from __future__ import annotations

import importlib
from typing import Callable

from .config import ModelConfig
from .units import positive_int

Step = Callable[..., tuple]
_ENGINES: dict[str, tuple[Callable[[ModelConfig], Step], int]] = {}
# Modules that register engines when imported (the reference: mk.generate; the megakernel): both live above it.
ENGINE_MODULES = ("mk.generate", "mk.megakernel")


def register_engine(name: str, make_step: Callable[[ModelConfig], Step], cache_multiple: int = 1) -> None:
    """Make ``name`` usable as ``generate(engine=name)`` and ``python -m mk generate --engine name``.

    ``cache_multiple``: the engine reads caches in blocks of this many slots, so generate rounds every
    layer's slot count up to a multiple of it (full layers: the positions; sliding layers: the window;
    the extra slots are masked: results do not change).
    """
    positive_int("cache_multiple", cache_multiple)
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


def cache_multiple(engine: str) -> int:
    """The slot multiple the engine reads caches in (``register_engine``)."""
    return _ENGINES[check_engine(engine)][1]


def get_step(engine: str, cfg: ModelConfig, **options) -> Step:
    """The engine's step for ``cfg``; ``options`` go to its ``make_step`` (e.g. the megakernel's kv_tile)."""
    return _ENGINES[check_engine(engine)][0](cfg, **options)


def unregister_engine(name: str) -> None:
    """Forget ``name`` (an engine a test registered)."""
    _ENGINES.pop(name, None)
