"""A decode step as a call to time: one engine's step at the last position of a zero cache, the cache threaded
from call to call; the same step as one jitted program, or dispatched op by op.

The step is timed at position ``context - 1`` of a cache sized to ``context``, so it reads the KV cache
``mk.sol`` counts for that context. Decode time does not depend on what the cache holds (the shapes are fixed
and masked), so the cache is left zero rather than filled by a prefill. It does depend on the tokens where experts
are routed: each user decodes a token of its own (users all given one token would all route to the same experts,
and a kernel that fetches each distinct expert once would read less than ``mk.sol`` counts).

Each call carries ``program_digest()``: the digest of the program it runs (:func:`traced_digest`), for its rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

from ..config import ModelConfig
from ..files import text_digest
from ..reference import decode_step, init_cache, prepare
from ..sharding.mesh import gspmd_sharding
from .harness import array_dtype


def decode_call(
    step,
    params: dict,
    cfg: ModelConfig,
    context: int,
    batch: int,
    dtype: str,
    knockout=frozenset(),
    program: bool = False,
    cache_multiple: int = 1,
) -> Callable[[], jax.Array]:
    """A no-argument call that runs one decode step of ``batch`` users at position ``context - 1``
    of a zero cache of ``context`` positions (slots rounded up to ``cache_multiple``, in the engine's own
    layout when its step has ``adopt_cache``), threading the (donated) cache from call to call.

    ``program=True`` runs the step as :func:`step_program`, kept as ``call.program``: the program
    ``compiled_kernels(call.program, *call.args())`` counts (compiled once, shared with the calls),
    and whose instruction names a profiler trace of the call shows. ``call.program_digest()``: the digest of the
    step's program (:func:`traced_digest`).
    """
    params, tokens, cache = _inputs(step, params, cfg, context, batch, dtype, cache_multiple)
    prog = step_program(step, cfg, knockout) if program else None
    if program:

        def step(p, _cfg, cache, t, i, _knockout):
            return prog(p, cache, t, i)

    pos = jnp.asarray(context - 1, jnp.int32)
    state = {"cache": cache}

    def call():
        logits, state["cache"] = step(params, cfg, state["cache"], tokens, pos, knockout)
        return logits

    call.args = lambda: (params, state["cache"], tokens, pos)  # for compiling the same step
    call.program = prog
    call.program_digest = lambda: traced_digest(lambda p, c, t, i: step(p, cfg, c, t, i, knockout), *call.args())
    return call


def traced_digest(fn: Callable, *args) -> str:
    """The digest of the program ``fn`` runs on ``args``: ``fn`` traced as one program at their shapes and its jaxpr
    printed (every kernel's body and a Pallas call's parameters in it, no source locations; mk.files.text_digest), the
    way mk.megakernel.aot.program_digest digests a kernel traced for a topology. Nothing runs and nothing compiles; an
    engine's jitted step is traced again from JAX's cache (tiny-llama's kernel step: 0.06 s; printing gemma4-26b-a4b's
    whole kernel, 1.4 MB of text, 0.9 s). Two rows with one digest ran one program (code and shapes alike; a step that
    lays out its weights on its first call, as plain mk.reference.decode_step does, has that layout traced in too); the
    machine is in it (a kernel interpreted on a CPU has interpreter parameters a chip's lacks)."""
    return text_digest(str(jax.jit(fn).trace(*args).jaxpr))


def _inputs(step, params: dict, cfg: ModelConfig, context: int, batch: int, dtype: str, cache_multiple: int):
    """(the step's parameters in its own layout, each user's token, a zero cache of ``context`` positions in the step's
    layout), made once outside the timed (and jitted) calls."""
    prepare, adopt = getattr(step, "prepare", None), getattr(step, "adopt_cache", None)
    if prepare is not None:
        params = prepare(params, cfg)
    # each user its own token: a routed model's users pick their own experts (the same token would route all alike)
    tokens = (jnp.arange(batch, dtype=jnp.int32) * 7919 + 11) % cfg.vocab_size
    dt = array_dtype(dtype)
    if adopt is None:
        return params, tokens, init_cache(cfg, batch, context, dt, multiple=cache_multiple)
    return params, tokens, _zero_cache(adopt, cfg, batch, context, dt, cache_multiple)


def greedy_steps_call(
    step,
    params: dict,
    cfg: ModelConfig,
    context: int,
    batch: int,
    dtype: str,
    steps: int,
    cache_multiple: int = 1,
    knockout=frozenset(),
) -> Callable[[], jax.Array]:
    """A no-argument call that runs ``steps`` greedy decode steps of ``batch`` users in one compiled call, from
    position ``context - steps`` of a zero cache of ``context`` positions, each step's picks the next one's tokens on
    the device (the cache threaded from call to call); it returns the picks [steps, batch]. The megakernel runs them
    as its ``greedy_steps``; any other step in a ``jax.lax.fori_loop`` of its steps (:func:`looped_greedy`).
    ``knockout``: components switched off in every step (mk.params.KNOCKOUTS), the megakernel's steps alone."""
    params, tokens, cache = _inputs(step, params, cfg, context, batch, dtype, cache_multiple)
    pos = jnp.full((batch,), context - steps, jnp.int32)
    run = getattr(step, "greedy_steps", None)
    if run is None:
        if knockout:
            raise ValueError(
                "knock-outs run one step a call on XLA's reference; several steps a call: the megakernel's"
            )
        run = partial(looped_greedy, step)
    elif knockout:
        run = partial(run, knockout=frozenset(knockout))
    state = {"cache": cache}

    def call():
        picks, state["cache"] = run(params, cfg, state["cache"], tokens, pos, steps)
        return picks

    call.program_digest = lambda: traced_digest(
        lambda p, c, t, i: run(p, cfg, c, t, i, steps), params, state["cache"], tokens, pos
    )
    return call


@partial(jax.jit, static_argnums=(0, 2, 6), donate_argnums=(3,))
def looped_greedy(step, params: dict, cfg: ModelConfig, cache: dict, tokens, pos, steps: int):
    """``steps`` greedy steps of ``step`` (decode_step's signature, logits out) in one program: (the picks [steps, B],
    the cache)."""

    def body(i, carry):
        cache, tokens, picks = carry
        logits, cache = step(params, cfg, cache, tokens, pos + i)
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return cache, tokens, picks.at[i].set(tokens)

    init = (cache, tokens, jnp.zeros((steps, tokens.shape[0]), jnp.int32))
    cache, _, picks = jax.lax.fori_loop(0, steps, body, init)
    return picks, cache


@partial(jax.jit, static_argnums=(0, 1, 2, 3, 4, 5))
def _zero_cache(adopt, cfg: ModelConfig, batch: int, context: int, dtype, multiple: int) -> dict:
    """A zero cache in the engine's layout (``adopt`` of the reference's), made in one program: the device never holds
    the reference's layout beside it (a v5e ran out of memory adopting llama-3.2-1b's at 32K x4); compiled once per
    engine and shape."""
    return adopt(init_cache(cfg, batch, context, dtype, multiple=multiple))


def settled(call: Callable[[], jax.Array]) -> Callable[[], jax.Array]:
    """``call`` run twice and waited on (its compile, and any a second call needs: that one takes the cache the step
    returned, which may be placed otherwise than the one it was given), so a timing loop after it compiles nothing."""
    for _ in range(2):
        jax.block_until_ready(call())
    return call


def op_by_op(call: Callable[[], jax.Array]) -> Callable[[], jax.Array]:
    """``call`` with every primitive dispatched as its own program (``jax.disable_jit``), as an eager
    framework runs it: to time beside the compiled step, interleaved."""

    def eager():
        with jax.disable_jit():
            return jax.block_until_ready(call())

    return eager


def step_program(step, cfg: ModelConfig, knockout=frozenset()) -> StepProgram:
    """The decode step as one jitted program with the cache donated, as an engine runs it: ``program(params, cache,
    tokens, pos)``, and ``program.lower(...)`` for the same program ahead of time."""
    return StepProgram(step, cfg, frozenset(knockout))


@partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=(4,))
def _step_program(step, cfg: ModelConfig, knockout: frozenset, params, cache, tokens, pos):
    return step(params, cfg, cache, tokens, pos, knockout)


@dataclass(frozen=True)
class StepProgram:
    """``step`` for ``cfg`` with ``knockout``'s components off, as one program: every StepProgram of the same step,
    model and knock-out is the same jitted program, compiled once a process for its shapes (a bench's step, a
    notebook's call counting its kernels and the knock-outs' whole step: one compile, not one each)."""

    step: Callable
    cfg: ModelConfig
    knockout: frozenset

    def __call__(self, params, cache, tokens, pos):
        return _step_program(self.step, self.cfg, self.knockout, params, cache, tokens, pos)

    def lower(self, params, cache, tokens, pos):
        return _step_program.lower(self.step, self.cfg, self.knockout, params, cache, tokens, pos)


def reference_step(mesh):
    """``mk.reference.decode_step`` with its cache split over ``mesh`` (gspmd_sharding) once made, as
    ``mk.measure.steps.decode_call`` adopts an engine's cache; its parameters come split already."""

    def step(params, cfg, cache, tokens, pos, knockout=frozenset()):
        return decode_step(params, cfg, cache, tokens, pos, knockout)

    step.prepare = prepare  # a prepared tree is used as it is

    def adopt_cache(cache):
        # one chip: the placement the step returns (a split over one chip is the same bytes, but keys another compile)
        def placed(a):
            return NamedSharding(mesh, PartitionSpec()) if mesh.size == 1 else gspmd_sharding(mesh, a.shape)

        return {k: jax.device_put(a, placed(a)) for k, a in cache.items()}

    step.adopt_cache = adopt_cache
    return step
