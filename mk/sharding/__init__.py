"""The step over several chips: meshes (``mesh``), what slice of the model each chip holds
(``placement``), the in-kernel all-reduce's configuration (``collective``), and the straggler expert
of a whole-expert placement (``straggler``).

The package itself holds only what the step plans read (pure records and index math, no JAX at import):
importing it imports nothing of mk above its ground layer. ``straggler`` is imported by name."""

from .links import (
    Exchange,
    chunk_width,
    flat_ring_all_reduce,
    one_link_all_reduce,
    peers,
    ring_hops,
    sent_bytes,
    torus_all_reduce,
    torus_best,
)
from .mesh import gspmd_sharding, make_mesh, simulate_chips, torus_order
from .placement import (
    attention_chips,
    cache_split_axis,
    chip_cache,
    chip_config,
    chip_params,
    expert_group_member,
    expert_groups,
    experts_per_chip,
    first_kv_head,
    heads_split,
    kv_replication,
    kv_replication_bytes,
    latent_down_rows,
    position_share,
    repeated_copy,
    split_axis,
    users_per_chip,
    vectors_split,
    vocab_per_chip,
)

__all__ = [
    "Exchange",
    "attention_chips",
    "cache_split_axis",
    "chip_cache",
    "chip_config",
    "chip_params",
    "chunk_width",
    "expert_group_member",
    "expert_groups",
    "experts_per_chip",
    "flat_ring_all_reduce",
    "first_kv_head",
    "gspmd_sharding",
    "heads_split",
    "kv_replication",
    "position_share",
    "kv_replication_bytes",
    "latent_down_rows",
    "make_mesh",
    "torus_order",
    "one_link_all_reduce",
    "peers",
    "repeated_copy",
    "ring_hops",
    "sent_bytes",
    "simulate_chips",
    "split_axis",
    "torus_best",
    "torus_all_reduce",
    "users_per_chip",
    "vectors_split",
    "vocab_per_chip",
]
