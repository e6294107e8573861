"""How the megakernel is set up: one record, :class:`KernelSetup`, and the named setups the workbook compares.

A setup is everything about the kernel that is not the model, the batch or the chip: how many chips it is cut
over and how (where the routed experts live, how attention is split), the in-kernel all-reduce's switches, how the
gated MLPs are laid out, and how many drafted tokens a step verifies. The plan builder (mk.plan.build_plan), the
kernel (mk.megakernel), the timing model (mk.timing.predict), the command line and every table of fixes take it
whole, and every modelled megakernel number names its setup.

Quantization is not a switch here: it is the weights' data type (mk.dtypes.DTYPES: ``int8-experts``, ``int8``), the
one vocabulary the speed of light, the general stack and the kernel share.

The named setups, in the order the write-up took them (each fix a ``dataclasses.replace`` of the one before):

- (a) :data:`BEFORE_FIXES`: whole experts per chip, the all-reduce not overlapped, f32 payload (3.46 ms published);
- (b) split experts, (c) the overlap, (d) a bf16 payload: :data:`WRITE_UP_KERNEL`, the kernel as published
  (1.56 ms);
- then the workbook's own: (e) reduce-scatter, (f) the MLPs' intermediate on rows, (g) attention split by positions
  over the chips sharing a KV head: :data:`WORKBOOK_KERNEL`, every fix on, what ``predict`` models unless told
  otherwise; (h) :data:`USERS_SPLIT`, (f) with attention split by users instead, for batches the chips divide.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum

from .config import FFN_LAYOUTS
from .units import positive_int

# Up to this many chips each peer of a cross-chip op has its own DMA semaphores (the kernel whose compiler schedules
# data/schedule stores); past it the peers share one a direction and a round waits on it once a peer: libtpu gives a
# chip 2 KiB of semaphore flags, which one semaphore a peer overran at 32 chips ("Ran out of memory in memory space
# sflag", libtpu 0.0.42.1).
PEER_SEMAPHORE_CHIPS = 16


class Placement(StrEnum):
    """Where the routed experts live."""

    WHOLE = "whole"  # E/C whole experts per chip
    SPLIT = "split"  # every expert's intermediate split over all chips
    # past one host: the chips in groups of ``KernelSetup.host_chips`` (a host's), E/G whole experts
    # per group of the G groups, each split over its group's chips (mk.sharding.pods)
    HOSTS = "hosts"


class AttentionSplit(StrEnum):
    """How attention over the KV cache is cut over the chips (the projections around it are always cut by head)."""

    # each chip attends for its query heads over their KV heads' caches: a KV head read by the query heads of
    # several chips (fewer KV heads than chips) is kept, and read whole, on each of them
    HEADS = "heads"
    # as HEADS, but the g = C / kv chips whose query heads read one KV head each hold, and attend over, every g-th
    # block of its positions for all g chips' query heads (mk.sharding.position_share); the partial softmax states
    # are merged
    POSITIONS = "positions"
    # chip c owns users c * B/C .. (c + 1) * B/C - 1 and their caches of every KV head; the chips' q, k, v heads go
    # to each user's owner, which attends over its users' caches, and the outputs come back to the heads' chips
    USERS = "users"


@dataclass(frozen=True)
class Collective:
    """The in-kernel all-reduce's switches (mk.sharding.links prices them, mk.megakernel.collective runs them)."""

    overlap: bool = True  # the next weight tiles' DMAs stay in flight across it (False: issued after it)
    bf16_payload: bool = False  # partial sums travel in bf16 (half the bytes; the sum is in f32)
    reduce_scatter: bool = False  # reduce-scatter then all-gather, instead of all to all

    @property
    def rounds(self) -> int:
        """Rounds of remote DMAs one all-reduce waits for (each pays the link latency once)."""
        return 2 if self.reduce_scatter else 1

    def payload_itemsize(self) -> int:
        return 2 if self.bf16_payload else 4


LATENT_DOWN = ("split", "whole")  # MLA's down-projections over a slice's chips (KernelSetup.latent_down)


@dataclass(frozen=True)
class KernelSetup:
    """The megakernel's setup over ``chips`` chips (mesh axis ``axis``). ``KernelSetup()`` is one chip: nothing is
    split or communicated. ``name`` says which setup it is wherever a number it gives is shown; ``published``: the
    key of data/published.csv that timed it, if any."""

    chips: int = 1
    placement: Placement = Placement.SPLIT
    collective: Collective = field(default_factory=Collective)
    attention_split: AttentionSplit = AttentionSplit.HEADS
    ffn_layout: str = "sublanes"
    draft_tokens: int = 0  # drafted tokens per user a step verifies (speculative decoding; 0: plain decode)
    name: str = "custom setup"
    published: str | None = None
    axis: str = "x"
    # past one host (mk.sharding.pods.pod_setup): the slice's torus, each dimension's (chips, wraps around), whose
    # all-reduce the plan charges dimension by dimension (mk.sharding.links.torus_all_reduce); () for any chip
    # reaching any over one link (one host, today's model)
    # (out of the repr, so a one-host plan's code fingerprint, mk.plan.StepPlan.code_fingerprint, stays what it was)
    torus: tuple[tuple[int, bool], ...] = field(default=(), repr=False)
    host_chips: int = field(default=0, repr=False)  # chips an expert is split over with placement HOSTS (a host's)
    # past one host: heads that do not divide the chips split over the most chips D that take whole ones, each head's
    # chips repeated C / D times (mk.sharding.attention_chips), the repeats' output projections zero
    # (mk.sharding.repeated_copy)
    repeat_heads: bool = field(default=False, repr=False)
    # each chip's slice of a split routed expert's intermediate rounded up to a multiple of this many rows, the experts
    # zero-padded (mk.sharding.chip_config): a 4-bit format's group (32) where an even cut would split its groups
    # (mk.sharding.pods.pod_setup); out of the repr, as the chip's config says the width
    expert_rows: int = field(default=1, repr=False)
    # run, not timed: chip 0 of the slice alone on one device, each cross-chip exchange a local copy of the same bytes
    # into the same buffers (mk.megakernel.collective), so one real chip runs a chip-of-C step's own work; what it
    # receives is its own partial, not the other chips' (its values are not the slice's)
    loopback: bool = field(default=False, repr=False)
    # MLA's down-projections (q_a, kv_a): "split" by rows over the chips where that reads fewer bytes a chip
    # (mk.sharding.latent_down_rows: their partial sums add an all-reduce a layer), or "whole" on every chip
    latent_down: str = field(default="split", repr=False)

    def __post_init__(self):
        positive_int("chips", self.chips)
        for attr, kind, what in (
            ("placement", Placement, "expert placement"),
            ("attention_split", AttentionSplit, "attention split"),
        ):
            try:
                object.__setattr__(self, attr, kind(getattr(self, attr)))
            except ValueError:
                raise ValueError(
                    f"unknown {what} {getattr(self, attr)!r}; use one of {[str(p) for p in kind]}"
                ) from None
        if self.ffn_layout not in FFN_LAYOUTS:
            raise ValueError(f"unknown ffn_layout {self.ffn_layout!r}; use one of {list(FFN_LAYOUTS)}")
        if self.placement == Placement.HOSTS and (self.host_chips < 1 or self.chips % self.host_chips):
            raise ValueError(
                f"placement 'hosts' needs host_chips dividing the {self.chips} chips, not {self.host_chips}"
            )
        if self.loopback and (self.chips == 1 or self.attention_split == AttentionSplit.USERS or self.torus):
            raise ValueError(
                "loopback stands one chip in for the chips of one host: it needs chips > 1, no torus, and attention "
                "split by heads or positions (a users split's chip holds its users' caches alone)"
            )
        if self.latent_down not in LATENT_DOWN:
            raise ValueError(f"unknown latent_down {self.latent_down!r}; use one of {list(LATENT_DOWN)}")
        if self.draft_tokens < 0:
            raise ValueError(f"draft_tokens={self.draft_tokens}: drafted tokens per user must be 0 or more")

    @property
    def sharded(self) -> bool:
        return self.chips > 1

    @property
    def peer_semaphores(self) -> int:
        """The DMA semaphores a cross-chip op keeps a direction: one a chip, or one shared past
        :data:`PEER_SEMAPHORE_CHIPS` chips (mk.megakernel.collective._sem indexes them)."""
        return self.chips if self.chips <= PEER_SEMAPHORE_CHIPS else 1

    @property
    def torus_groups(self) -> tuple[tuple[int, int], ...]:
        """Each torus dimension of more than one chip as (its chips g, their stride): along it, this chip's group is
        the g chips ``stride`` apart, the first dimension's consecutive (mk.sharding.mesh.torus_order numbers the
        chips so); () off a torus."""
        groups, stride = [], 1
        for n, _ in self.torus:
            if n > 1:
                groups.append((n, stride))
            stride *= n
        return tuple(groups)

    @property
    def users_split(self) -> bool:
        """Whether chips own users' caches and attend for them (AttentionSplit.USERS) over several chips."""
        return self.sharded and self.attention_split == AttentionSplit.USERS

    @property
    def switches(self) -> str:
        """What this setup switches on, in words (its name says which setup it is)."""
        c = self.collective
        return (
            f"{self.chips} chip{'s' if self.chips > 1 else ''}, {self.placement} experts, all-reduce "
            f"{'overlapped' if c.overlap else 'not overlapped'}, {'bf16' if c.bf16_payload else 'f32'} payload "
            f"{'by reduce-scatter' if c.reduce_scatter else 'all to all'}, attention split by {self.attention_split}, "
            f"MLP intermediate on {'rows' if self.ffn_layout == 'sublanes' else 'lanes'}"
            + (f", {self.draft_tokens} drafts verified a step" if self.draft_tokens else "")
            + (f", {self.host_chips} chips a host" if self.placement == Placement.HOSTS else "")
            + (f", all-reduce over the {'x'.join(str(n) for n, _ in self.torus)} torus" if self.torus else "")
        )

    def replace(self, **changes) -> KernelSetup:
        return dataclasses.replace(self, **changes)

    def but(self, **changes) -> KernelSetup:
        """This setup with ``changes`` (fields of KernelSetup), its name saying what changed, so a number it gives is
        never shown under the name of the setup it came from."""
        said = []
        for key, value in changes.items():
            if getattr(self, key) == value:
                continue
            if key == "collective":
                value = ", ".join(k.replace("_", " ") for k, on in dataclasses.asdict(value).items() if on) or "none"
                said.append(f"all-reduce switches: {value}")
            elif key == "repeat_heads":
                said.append("heads repeated over groups of chips" if value else "heads on every chip or split")
            elif key == "torus":
                said.append(f"all-reduce over the {'x'.join(str(n) for n, _ in value)} torus" if value else "one link")
            else:
                said.append(_CHANGE_WORDS.get(key, key + " {}").format(value))
        out = self.replace(**changes)
        return out.replace(name=f"{self.name}; {', '.join(said)}") if said else out

    def on(self, chips: int) -> KernelSetup:
        """This setup over ``chips`` chips (a slice it is modelled or run on), its name kept."""
        return self if chips == self.chips else self.replace(chips=chips)

    def laid_out(self, cfg):
        """``cfg`` (mk.config.ModelConfig) with this setup's layout of the gated MLPs, which the plan, the packing
        and every chip's slice read from the config."""
        return cfg if cfg.ffn_layout == self.ffn_layout else cfg.replace(ffn_layout=self.ffn_layout)


_CHANGE_WORDS = {
    "chips": "{} chips",
    "placement": "{} experts",
    "attention_split": "attention split by {}",
    "latent_down": "MLA's down-projections {}",
    "ffn_layout": "MLPs on {}",
    "draft_tokens": "{} drafts verified a step",
    "host_chips": "{} chips a host",
    "expert_rows": "experts cut in whole groups of {} rows",
}

ONE_CHIP = KernelSetup(name="one chip")

_WRITE_UP_SLICE = 8  # the write-up's kernel ran on a TPU v5e-8
BEFORE_FIXES = KernelSetup(
    _WRITE_UP_SLICE,
    Placement.WHOLE,
    Collective(overlap=False),
    ffn_layout="lanes",
    name="(a) the write-up's kernel before its fixes",
    published="mk_v5e8_moe_step_before",
)
SPLIT_EXPERTS = BEFORE_FIXES.replace(placement=Placement.SPLIT, name="(b) (a) + split experts", published=None)
OVERLAP = SPLIT_EXPERTS.replace(collective=Collective(), name="(c) (b) + overlap")
WRITE_UP_KERNEL = OVERLAP.replace(
    collective=Collective(bf16_payload=True), name="(d) the write-up's kernel: (c) + bf16 payload",
    published="mk_v5e8_moe_step",
)  # fmt: skip
REDUCE_SCATTER = WRITE_UP_KERNEL.replace(
    collective=Collective(bf16_payload=True, reduce_scatter=True), name="(e) (d) + reduce-scatter", published=None
)
MLPS_ON_ROWS = REDUCE_SCATTER.replace(ffn_layout="sublanes", name="(f) (e) + MLPs on rows")
WORKBOOK_KERNEL = MLPS_ON_ROWS.replace(
    attention_split=AttentionSplit.POSITIONS, name="(g) the workbook's kernel: (f) + positions split"
)
FIXES = (BEFORE_FIXES, SPLIT_EXPERTS, OVERLAP, WRITE_UP_KERNEL, REDUCE_SCATTER, MLPS_ON_ROWS, WORKBOOK_KERNEL)
# The kernel verifies drafts with attention split by heads only: speculative decoding is modelled and run on (f), the
# workbook's kernel but for the positions split, with ``draft_tokens`` set.
VERIFYING_KERNEL = MLPS_ON_ROWS
# (f) with the users split instead of the positions: the other way past (f), for a batch the chips divide, so not a
# step of FIXES (whose case is the write-up's one user)
USERS_SPLIT = MLPS_ON_ROWS.replace(attention_split=AttentionSplit.USERS, name="(h) (f) + users split")
# by the names the command line takes (--setup)
SETUPS = dict(
    zip(("before-fixes", "split-experts", "overlap", "write-up", "reduce-scatter", "mlps-on-rows", "workbook"), FIXES),
    **{"users-split": USERS_SPLIT},
)
