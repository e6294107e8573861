"""Op-by-op dispatch: the primitives a step runs one by one, each its own small program, without ``jit``."""

from __future__ import annotations

from typing import Callable

import jax


def _sub_jaxprs(eqn) -> list:
    out = []
    for v in eqn.params.values():
        for x in v if isinstance(v, (tuple, list)) else (v,):
            j = getattr(x, "jaxpr", x)
            if hasattr(j, "eqns"):
                out.append(j)
    return out


def _count_eqns(jaxpr) -> int:
    n = 0
    for eqn in jaxpr.eqns:
        subs = _sub_jaxprs(eqn)
        if not subs:
            n += 1
        elif eqn.primitive.name == "scan":
            n += eqn.params["length"] * sum(_count_eqns(s) for s in subs)
        elif eqn.primitive.name == "cond":
            n += max(_count_eqns(s) for s in subs)
        else:  # jit, custom_jvp/vjp calls, while (body and condition once: trip count unknown)
            n += sum(_count_eqns(s) for s in subs)
    return n


def count_eager_ops(fn: Callable, *args, **kwargs) -> int:
    """Primitives ``fn`` dispatches one by one when run without ``jit`` (each its own small program)."""
    return _count_eqns(jax.make_jaxpr(fn)(*args, **kwargs).jaxpr)
