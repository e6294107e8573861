"""The megakernel's engine: ``make_step(cfg)`` for mk.generate. It packs a parameter tree into the kernel's layout
once (on each chip its slice, over a mesh), lays the cache out as the kernel reads it, and compiles one kernel
(mk.megakernel.kernel.build_call) per batch, cache length, data types, knock-out and outputs asked."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ..chips import compile_target
from ..config import ModelConfig
from ..format_trees import FSCALE_SUFFIX, scheme_of_scales
from ..kernel_setup import ONE_CHIP, KernelSetup
from ..params import check_knockout
from ..plan import (
    LANE,
    StepPlan,
    Tiles,
    build_plan,
)
from ..quant import SCALE_SUFFIX
from ..sharding import (
    cache_split_axis,
    chip_config,
    chip_params,
    make_mesh,
    position_share,
    split_axis,
    torus_order,
    vectors_split,
)
from ..tpu import host_device, interpret_params
from .kernel import (
    axis_spec,
    build_call,
    check_heads_split,
)
from .pack import adopt_cache_chips, pack, reference_cache_chips
from .refs import (
    POSITION,
    TOKEN,
    Outputs,
)


def packed_scheme(weights: dict) -> str:
    """The mk.quant scheme of the kernel's packed weights: which matrices came with INT8 scales; or the shipped
    format (mk.format_trees) its block scales and codes are in."""
    for n, a in weights.items():
        if n.endswith(FSCALE_SUFFIX):
            return scheme_of_scales(a.dtype, weights[n.removesuffix(FSCALE_SUFFIX)].dtype)
    scaled = [n.removesuffix(SCALE_SUFFIX).split(".", 1)[1] for n in weights if n.endswith(SCALE_SUFFIX)]
    if not scaled:
        return "none"
    return "int8-experts" if all(n.startswith("expert_") for n in scaled) else "int8"


def users_block(plan: StepPlan, tokens, positions):
    """The users block a step reads: row b holds user b's token (lane 0) and position (lane 1)."""
    B = plan.batch
    users = jnp.zeros((plan.rows, LANE), jnp.int32)
    users = users.at[:B, TOKEN].set(jnp.asarray(tokens, jnp.int32).reshape(B))
    return users.at[:B, POSITION].set(jnp.broadcast_to(jnp.asarray(positions, jnp.int32), (B,)))


@dataclass(frozen=True)
class StepRequest:
    """What one compiled step is made for, read off the arrays a call passes (:meth:`MegakernelEngine.run`): users and
    cache length, the weights' and cache's element types (mk.dtypes.ARRAY_DTYPES) and scheme, what is knocked out,
    the drafts a user verifies, and the outputs asked for."""

    batch: int
    max_len: int
    weight_dtype: str
    kv_dtype: str
    quantize: str
    knockout: frozenset
    draft_tokens: int
    with_logits: bool
    count_dmas: bool


@dataclass
class _Compiled:
    plan: StepPlan
    fn: object  # jitted: (packed, cache, tokens, pos) -> Outputs
    call: object  # the kernel's call, not jitted: (packed, cache, users block) -> Outputs


class MegakernelEngine:
    """``make_step(cfg)`` for mk.generate: a step with decode_step's signature (logits out) and
    ``greedy`` (token ids out, no logits written), packing the parameters once per parameter tree and
    compiling one kernel per (batch, cache length, dtypes, knock-out, logits or not)."""

    def __init__(
        self,
        cfg: ModelConfig,
        tiles: Tiles = Tiles(),
        detect_races: bool = False,
        setup: KernelSetup = ONE_CHIP,
        mesh=None,
    ):
        cfg.check_runnable("megakernel")
        cfg = setup.laid_out(cfg)  # the packing and the plan read the setup's layout of the gated MLPs from cfg
        self.cfg, self.tiles, self.detect_races, self.setup = cfg, tiles, detect_races, setup
        check_heads_split(cfg, setup)
        self.sharded = setup.sharded and not setup.loopback  # a mesh of chips (loopback: one chip alone)
        if setup.sharded:
            chip_config(cfg, setup)  # refuses a placement the model cannot take, before any weights move
        if self.sharded:
            devices = jax.devices()[: setup.chips]
            self.mesh = (
                mesh
                if mesh is not None
                else make_mesh(setup.chips, torus_order(devices) if setup.torus else devices, setup.axis)
            )
        self.chip = compile_target(self.mesh.devices.flat[0] if self.sharded else jax.devices()[0])
        self._packed_key, self._packed = None, None
        self._steps: dict = {}
        self._loops: dict = {}  # (StepRequest, steps) -> the jitted loop of that many greedy steps

    def _place_cache(self, cache: dict) -> dict:
        """Over several chips: each array of the kernel's ``cache`` split over the mesh on its split axis (a step's
        inputs must carry the sharding its shard_map names)."""
        if not self.sharded:
            return cache
        out = {}
        for name, a in cache.items():
            spec = axis_spec(a.ndim, cache_split_axis(self.cfg, self.setup), self.setup.axis)
            out[name] = jax.device_put(a, NamedSharding(self.mesh, spec))
        return out

    def prepare(self, params: dict, cfg: ModelConfig) -> dict:
        """The kernel's layout of ``params`` (``pack``), made once: a step given it reads it as it is
        (mk.measure times the step on it, so the timed program holds no re-layout)."""
        return self.packed(params)

    def packed(self, params: dict) -> dict:
        if "weights" in params and "vectors" in params:  # packed already
            return params
        key = tuple(id(v) for v in params.values())
        if key != self._packed_key:
            if self.sharded:
                self._packed = self._pack_on_chips(params)
            elif self.setup.loopback:  # chip 0's slice, on the one chip standing in for the slice
                host = {path: np.asarray(a) for path, a in params.items()}
                self._packed = pack(chip_params(host, self.cfg, self.setup, 0), chip_config(self.cfg, self.setup))
            else:
                self._packed = pack(params, self.cfg)
            self._packed_key = key
        return self._packed

    def _pack_on_chips(self, params: dict) -> dict:
        """``pack`` over the chips: chip c's slice (mk.sharding.chip_params) packed on the host's CPU device (where
        there is one; else on chip c), and each weight one array over the mesh made of those slices, split on its
        ``split_axis``. No chip holds more than its share at any time: a full-size model packed on one chip, then
        split, would not fit one chip of a slice. One device packs every slice, so the packing programs compile
        once, not once a chip."""
        host = {path: np.asarray(a) for path, a in params.items()}  # chip_params cuts on the host
        local, cpu = chip_config(self.cfg, self.setup), host_device()
        parts = {}
        for c, dev in enumerate(self.mesh.devices.flat):
            if dev.process_index == jax.process_index():  # a pod slice's other hosts pack their own chips
                with jax.default_device(cpu or dev):
                    parts[dev] = pack(chip_params(host, self.cfg, self.setup, c), local)
        return self.over_mesh(parts)

    def over_mesh(self, parts: dict) -> dict:
        """The packed step inputs over the mesh from each chip's packed part (``parts``: device -> ``pack``'s output
        for that chip's slice, this host's chips): each weight one array split on its ``split_axis``, the vectors
        split on their rows where each chip's are its own (mk.sharding.vectors_split), else replicated as the
        frequencies are (the same on every chip)."""
        first = next(iter(parts.values()))
        weights = {n: self._joined(parts, lambda p, n=n: p["weights"][n], split_axis(self.cfg, self.setup, n))
                   for n in first["weights"]}  # fmt: skip
        vectors = self._joined(parts, lambda p: p["vectors"], 0 if vectors_split(self.cfg, self.setup) else None)
        rest = {k: v for k, v in first.items() if k not in ("weights", "vectors")}  # the frequencies: on every chip
        return dict(jax.device_put(rest, NamedSharding(self.mesh, P())), weights=weights, vectors=vectors)

    def _joined(self, parts: dict, part, axis: int | None):
        """One array over the mesh of each chip's ``part(its packed inputs)``, split on ``axis`` (None: replicated)."""
        a = part(next(iter(parts.values())))
        shape = tuple(n * self.setup.chips if i == axis else n for i, n in enumerate(a.shape))
        sharding = NamedSharding(self.mesh, axis_spec(a.ndim, axis, self.setup.axis))
        slices = [jax.device_put(part(p), dev) for dev, p in parts.items()]
        return jax.make_array_from_single_device_arrays(shape, sharding, slices)

    def compiled(self, request: StepRequest) -> _Compiled:
        """The step made for ``request``, built and jitted once."""
        if request not in self._steps:
            plan = build_plan(
                self.cfg,
                request.batch,
                request.max_len,
                weight_dtype=request.weight_dtype,
                kv_dtype=request.kv_dtype,
                tiles=self.tiles,
                knockout=request.knockout,
                setup=self.setup.replace(draft_tokens=request.draft_tokens),
                quantize=request.quantize,
            )
            fn = build_call(
                plan,
                self.chip,
                interpret_params(self.detect_races),
                with_logits=request.with_logits,
                count_dmas=request.count_dmas,
                mesh=self.mesh if self.sharded else None,
            )

            def run(packed, cache, tokens, pos, plan=plan, fn=fn):
                return fn(packed, cache, users_block(plan, tokens, pos))

            self._steps[request] = _Compiled(plan, jax.jit(run, donate_argnums=(1,)), fn)
        return self._steps[request]

    def adopt_cache(self, cache: dict) -> dict:
        """The kernel's cache from the reference's (mk.megakernel.pack): once, after prefill (mk.generate)."""
        return self._place_cache(adopt_cache_chips(self.cfg, cache, self.setup))

    def reference_cache(self, cache: dict) -> dict:
        """The reference's cache layout from the kernel's (to compare them)."""
        return reference_cache_chips(self.cfg, cache, self.setup)

    def run(
        self, params, cfg, cache, tokens, pos, knockout=frozenset(), with_logits=True, count_dmas=False, draft_tokens=0
    ) -> Outputs:
        """One step on the kernel's cache layout (``adopt_cache``): the kernel's Outputs (users block,
        cache, and logits / DMA counts on request). ``draft_tokens`` = K: ``tokens`` and ``pos`` are each user's
        1 + K rows in turn (speculative verification)."""
        request, packed = self._request(params, cfg, cache, knockout, with_logits, count_dmas, draft_tokens)
        return self.compiled(request).fn(packed, cache, tokens, pos)

    def _request(self, params, cfg, cache, knockout, with_logits, count_dmas=False, draft_tokens=0):
        """(the StepRequest a call with these arrays makes, the packed weights); refuses another model's call or a
        reference cache."""
        if self.setup.laid_out(cfg) != self.cfg:
            raise ValueError(f"this megakernel step was made for {self.cfg.name}, called with {cfg.name}")
        if "layers.0.k" in cache:
            raise ValueError(
                "the megakernel reads its own cache layout: convert a reference cache once with "
                "adopt_cache(cache) (mk.generate does)"
            )
        knockout = check_knockout(knockout)
        t0, first = cfg.layer_types[0], "latent" if cfg.latent_attention is not None else "k"
        batch, kv_dtype = cache[f"{t0}.{first}"].shape[1], jnp.dtype(cache[f"{t0}.{first}"].dtype).name
        # a chip's full-layer slots, times the chips sharing each KV head's positions (mk.sharding.position_share)
        max_len = (
            cache[f"full.{first}"].shape[3] * position_share(cfg, "full", self.setup)
            if cfg.full_layers
            else cfg.sliding_window
        )
        packed = self.packed(params)
        weight_dtype = jnp.dtype(packed["weights"]["embed"].dtype).name
        quantize = packed_scheme(packed["weights"])
        request = StepRequest(
            batch, max_len, weight_dtype, kv_dtype, quantize, knockout, draft_tokens, with_logits, count_dmas
        )
        return request, packed

    def __call__(self, params, cfg, cache, tokens, pos, knockout=frozenset()):
        out = self.run(params, cfg, cache, tokens, pos, knockout)
        return out.logits, out.cache

    def greedy(self, params, cfg, cache, tokens, pos, knockout=frozenset()):
        """(each user's greedy token [B], the cache): the kernel picks them; no logits are written."""
        out = self.run(params, cfg, cache, tokens, pos, knockout, with_logits=False)
        return out.users[: jnp.shape(tokens)[0], TOKEN], out.cache

    def greedy_steps(self, params, cfg, cache, tokens, pos, steps: int, knockout=frozenset()):
        """``steps`` greedy steps in one compiled call, each step's tokens fed to the next on the chip, every user at
        its own position: (the tokens [steps, B], the cache), exactly those of ``steps`` calls of :meth:`greedy`. The
        host waits once for ``steps`` tokens."""
        if steps < 1:
            raise ValueError(f"steps must be at least 1, got {steps}")
        request, packed = self._request(params, cfg, cache, knockout, with_logits=False)
        if (request, steps) not in self._loops:
            c = self.compiled(request)
            loop = partial(greedy_loop, c.plan, c.call, steps)
            self._loops[request, steps] = jax.jit(loop, donate_argnums=(1,))
        return self._loops[request, steps](packed, cache, tokens, pos)

    def verify(self, params, cfg, cache, tokens, pos):
        """Speculative verification (mk.reference.verify_step's contract): ``tokens [B, T]`` (each user's last token
        and its T - 1 drafts) at positions ``pos[b] + j``, one kernel call: (the kernel's greedy pick after each row
        [B, T], each row's final-normed hidden state [B, T, H], the cache)."""
        B, T = jnp.shape(tokens)
        rows = (jnp.asarray(pos, jnp.int32)[:, None] + jnp.arange(T, dtype=jnp.int32)).reshape(-1)
        out = self.run(params, cfg, cache, jnp.reshape(tokens, -1), rows, with_logits=False, draft_tokens=T - 1)
        picks = out.users[: B * T, TOKEN].reshape(B, T)
        return picks, out.hidden[: B * T, : cfg.hidden_size].reshape(B, T, -1), out.cache


def greedy_loop(plan: StepPlan, call, steps: int, packed, cache, tokens, pos):
    """``steps`` calls of the kernel (``call``: packed, cache, users block -> Outputs) in a loop on the chip, each
    call's users block out (each user's pick and next position, mk.megakernel.head) the next call's in: (the picks
    [steps, B], the cache)."""
    B = plan.batch

    def body(i, carry):
        cache, users, picks = carry
        out = call(packed, cache, users)
        return out.cache, out.users, picks.at[i].set(out.users[:B, TOKEN])

    init = (cache, users_block(plan, tokens, pos), jnp.zeros((steps, B), jnp.int32))
    cache, _, picks = jax.lax.fori_loop(0, steps, body, init)
    return picks, cache


def make_step(
    cfg: ModelConfig,
    setup: KernelSetup = ONE_CHIP,
    tiles: Tiles = Tiles(),
    detect_races: bool = False,
    kv_tile: int | None = None,
) -> MegakernelEngine:
    """The megakernel engine for mk.generate, set up as ``setup`` says (mk.kernel_setup.KernelSetup: the chips it
    runs over, the first ``setup.chips`` devices, where the experts live, the all-reduce's switches, how attention is
    cut, the gated MLPs' layout); ``kv_tile``: KV positions per tile (overrides ``tiles``)."""
    if kv_tile is not None:
        tiles = replace(tiles, kv_tile=kv_tile)
    return MegakernelEngine(cfg, tiles, detect_races, setup)
