"""Predictions: a model's decode step on a chip or slice for an engine (the megakernel as a kernel setup says, or
the general stack), beside the speed of light, with every constant it used and where it came from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache

from ..assistant_config import check_pair, source_layers
from ..chips import Chip, check_one_device, get_chip
from ..config import SLIDING, ModelConfig, get_config
from ..dtypes import get_dtype
from ..kernel_setup import WORKBOOK_KERNEL, AttentionSplit, KernelSetup, Placement
from ..sol import speed_of_light
from ..units import ms_entry, positive_int
from .bandwidth import Latency, ReadRate, copy_latency, read_rate
from .constants import MODELLED, assumed_costs, assumed_label, chip_constant, constant, fitted_costs
from .general_stack import GENERAL_STACK, general_step_of, kernel_cost, kernels_per_plan_kernel
from .pace import Pace, op_costs, pace
from .scheduled import KIND
from .work import check_speculation, link_latency, step_plan

ENGINES = ("megakernel", "general")


@dataclass(frozen=True)
class GivenCosts:
    """What a prediction is given in place of its defaults, to see how it moves (a sensitivity); None keeps the
    default. The megakernel's ``op_overhead_s`` and ``dma_issue_s`` (default: the compiler's schedule of the kernel's
    ``revision`` where data/schedule keeps the plan's, else data/timing.csv's assumed costs; on GPUs the cost per op
    fitted to a published megakernel step, mk.timing.fitted); ``kernel_s``, the general stack's cost per kernel
    (default: fitted; 0 gives its kernels' work alone); ``revision``, the kernel revision (data/kernel_revisions.csv)
    whose schedule gives the megakernel's op costs (default: this tree's kernel); ``hbm_read_Bps``, the HBM read rate
    a chip is charged, bytes/s (default: its measured limit, else an assumed fraction of its spec:
    mk.timing.bandwidth.read_rate); ``stalls``, the schedule's bundles that wait on a unit's result at the chip's
    measured issue rate (default; False: every bundle one cycle of its clock, the schedule's own time)."""

    op_overhead_s: float | None = None
    dma_issue_s: float | None = None
    kernel_s: float | None = None
    revision: int | None = None
    hbm_read_Bps: float | None = None
    stalls: bool = True

    @classmethod
    def assumed(cls, kind: str) -> GivenCosts:
        """data/timing.csv's assumed op costs for ``kind`` chips (``tpu``, ``gpu``), given: the model as it was before
        the compiler's schedule, for a like-for-like comparison where a schedule is kept for some plans only."""
        return cls(**assumed_costs(kind))

    def op_costs(self) -> dict[str, float | None]:
        """The megakernel's per-op costs as given (mk.timing.constants.ASSUMED's names)."""
        return dict(op_overhead_s=self.op_overhead_s, dma_issue_s=self.dma_issue_s)


DEFAULT_COSTS = GivenCosts()


@dataclass(frozen=True)
class Prediction:
    """A modelled decode step beside the speed of light: ``step_s`` emits ``tokens_per_round`` tokens per user (1;
    with speculation, the mean of the drafted tokens accepted, plus the target's own)."""

    model: str
    chip: str
    context: int
    batch: int
    dtype: str
    engine: str
    placement: str
    setup: str  # the kernel setup it models (mk.kernel_setup), by name; the general stack's for engine "general"
    step_s: float
    sol_step_s: float
    kernels_per_step: float
    models: str  # what is modelled, in words
    fits_in_hbm: bool
    components: dict[str, float] = field(default_factory=dict)  # seconds by component (general: kernel time)
    constants: dict[str, str] = field(default_factory=dict)  # constant -> value and kind
    pacing: Pace | None = None  # megakernel: the step of the chip that sets the pace, its bytes and floors
    draft_tokens: int = 0  # tokens drafted per user and verified in the step
    tokens_per_round: float = 1.0
    drafter_s: float = 0.0  # a round's drafting outside the step (Gemma 4's assistant: one program per draft)
    # megakernel: where the core's costs come from: the compiler's schedule (mk.timing.scheduled) or data/timing.csv's
    # assumed costs (none where the engine is the general stack)
    op_costs: str = ""
    op_cost_words: str = ""  # the same in words, with the schedule's libtpu and code or the assumed values

    @property
    def fit_note(self) -> str:
        """Whether the weights and the users' caches fit the slice's HBM in the prediction's data type, in words."""
        if self.fits_in_hbm:
            return f"the weights and caches fit {self.chip}'s HBM in {self.dtype}"
        return f"the weights and caches do not fit {self.chip}'s HBM in {self.dtype}; the time assumes they did"

    @property
    def round_s(self) -> float:
        """A round: the drafter's programs, then the step that verifies their drafts."""
        return self.step_s + self.drafter_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_round / self.round_s

    @property
    def tokens_per_s_total(self) -> float:
        return self.batch * self.tokens_per_s

    @property
    def fraction_of_sol(self) -> float:
        """The speed of light's step over the time per emitted token."""
        return self.sol_step_s * self.tokens_per_round / self.round_s

    def to_dict(self) -> dict:
        return dict(
            model=self.model,
            chip=self.chip,
            context=self.context,
            batch=self.batch,
            dtype=self.dtype,
            engine=self.engine,
            placement=self.placement,
            setup=self.setup,
            step_ms=self.step_s * 1e3,
            draft_tokens=self.draft_tokens,
            tokens_per_round=self.tokens_per_round,
            drafter_ms=self.drafter_s * 1e3,
            round_ms=self.round_s * 1e3,
            tokens_per_s=self.tokens_per_s,
            tokens_per_s_total=self.tokens_per_s_total,
            fraction_of_sol=self.fraction_of_sol,
            sol_tokens_per_s=1.0 / self.sol_step_s,
            kernels_per_step=self.kernels_per_step,
            op_costs=self.op_costs,
            op_cost_words=self.op_cost_words,
            fits_in_hbm=self.fits_in_hbm,
            fit_note=self.fit_note,
            models=self.models,
            components_ms={k: v * 1e3 for k, v in self.components.items()},
            constants=dict(self.constants),
            pacing={} if self.pacing is None else dict(ms_entry(k, v) for k, v in asdict(self.pacing).items()),
            kind=MODELLED,
        )


def _check(model, chip, context: int, batch: int, engine: str) -> tuple[ModelConfig, Chip]:
    cfg = get_config(model)
    chip = get_chip(chip)
    positive_int("context", context)
    positive_int("batch", batch)
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if engine == "megakernel":
        check_one_device(chip)
    return cfg, chip


def _general_fields(plan, chip: Chip, dtype: str, kernel_s: float | None, hbm_read_Bps: float | None) -> dict:
    """The general stack's step (:class:`Prediction`'s fields but the speed of light's): the plan's kernels scaled to
    the published count, each at ``kernel_s``."""
    kernel_s = kernel_cost(chip.kind) if kernel_s is None else kernel_s
    work = general_step_of(plan, chip, dtype)
    components = work.seconds(chip, kernel_s, hbm_read_Bps)
    where = f"chip 0 of {chip.chips}, tensor-parallel" if chip.chips > 1 else "one chip"
    return dict(
        engine="general", placement="split" if chip.chips > 1 else "-", setup="general stack",
        step_s=sum(components.values()), kernels_per_step=work.kernels_per_step, components=components,
        models=f"general stack on {chip.name} ({where}): {len(work.kernels)} kernels of the plan's work x "
        f"{work.scale:.2f} (the published count's ratio), {kernel_s * 1e6:.2f} us each, nothing in flight across "
        "them",
        constants=_general_constants(chip, kernel_s, hbm_read_Bps),
    )  # fmt: skip


def _megakernel_fields(plan, setup: KernelSetup, chip: Chip, dtype: str, costs: GivenCosts) -> dict:
    """The megakernel's step (:class:`Prediction`'s fields but the speed of light's): the chip that sets the pace,
    its core's costs from the compiler's schedule of the kernel's ``costs.revision`` where data/schedule keeps the
    plan's and no op cost is given, else data/timing.csv's assumed (or fitted) costs."""
    setup = plan.setup or setup  # past one host: mk.sharding.pods.pod_setup's (the torus, whole experts over hosts)
    models = _megakernel_words(plan, chip, setup)
    given, revision, rate = costs.op_costs(), costs.revision, costs.hbm_read_Bps
    scheduled = op_costs(plan, chip, revision, costs.stalls, **given)
    assumed = assumed_costs(chip.kind, **given)
    fitted = fitted_costs(chip.kind, **given)  # GPUs' per op, where not given
    cost_words = scheduled["source"] if scheduled else assumed_label(assumed, fitted)
    constants = _megakernel_constants(chip, None if scheduled else assumed, cost_words, fitted, rate)
    paced = pace(plan, chip, dtype, revision=revision, bandwidth=rate, stalls=costs.stalls,
                 **({} if scheduled else assumed))  # fmt: skip
    return dict(
        engine="megakernel", placement=str(setup.placement) if chip.chips > 1 else "-", setup=setup.name,
        step_s=paced.step_s, kernels_per_step=1, models=models, pacing=paced, constants=constants,
        op_costs=KIND if scheduled else "assumed", op_cost_words=cost_words,
    )  # fmt: skip


def _megakernel_words(plan, chip: Chip, setup: KernelSetup) -> str:
    """What the megakernel's prediction models: its chips, its setup, and which chip sets the pace."""
    if chip.chips == 1:
        return "megakernel on one chip"
    who = "every chip"
    if plan.experts_held < plan.model.num_experts:
        who = (
            f"the busiest of {plan.expert_groups} hosts (whole experts over them, split within each)"
            if setup.placement == Placement.HOSTS
            else "the busiest chip (whole experts)"
        )
    return f"megakernel on {chip.chips} chips, {setup.name}, paced by {who}"


def _check_drafts(setup: KernelSetup, chip: Chip, engine: str, assistant) -> None:
    if setup.draft_tokens and engine == "general":
        raise ValueError("drafted tokens: verification is modelled for the megakernel (engine='megakernel') only")
    if setup.draft_tokens and chip.chips > 1 and setup.attention_split != AttentionSplit.HEADS:
        raise ValueError(
            f"{setup.name}: the megakernel verifies drafts with attention split by heads only, not by "
            f"{setup.attention_split}; model mk.kernel_setup.VERIFYING_KERNEL, or setup.but(attention_split='heads')"
        )
    if assistant is not None and not setup.draft_tokens:
        raise ValueError("assistant: a drafter's cost is modelled with a setup that verifies K drafted tokens")


def predict(
    model: ModelConfig | str,
    chip: Chip | str,
    context: int,
    batch: int = 1,
    engine: str = "megakernel",
    dtype: str = "bf16",
    *,
    setup: KernelSetup = WORKBOOK_KERNEL,
    knockout=frozenset(),
    costs: GivenCosts = DEFAULT_COSTS,
    acceptance: float | None = None,
    assistant=None,
) -> Prediction:
    """The modelled decode step of ``model`` on ``chip`` (a chip or a slice: ``tpu-v5e-8``) at ``context``
    positions for ``batch`` users. ``setup`` (mk.kernel_setup.KernelSetup, default the workbook's kernel): the
    megakernel's setup, over the slice's chips; ``knockout``: components switched off (mk.params.KNOCKOUTS);
    ``costs`` (:class:`GivenCosts`): op costs, the general stack's cost per kernel, the schedule's kernel revision
    or the HBM read rate given in place of the defaults (a sensitivity). With
    ``setup.draft_tokens`` = K the megakernel verifies K drafted tokens per user in each step (a drafter that costs
    no weight reads: n-gram prompt lookup), emitting ``acceptance`` tokens per user on average
    (``check_speculation``); tokens/s and the fraction of the speed of light count emitted tokens. ``assistant``
    (mk.assistant_config.AssistantConfig): the drafts come from Gemma 4's assistant, whose K programs a round cost
    :func:`drafter_seconds` (default: a drafter that reads nothing). A round is the drafter's time plus the step's.

    The last predictions made are kept and handed out again (the tables of a notebook, and the claims table, ask for
    the same steps many times, a model named by its preset or given as its config alike): a prediction is a function
    of its arguments, of data read once a process, and of the chip's HBM read rate and copy latency, read again at
    every call (a limit or latency measured in this process, data/measured/tpu_hbm.csv or tpu_dma.csv, makes new
    predictions)."""
    cfg, chip = _check(model, chip, context, batch, engine)
    args = (cfg, chip, context, batch, engine, dtype, setup, frozenset(knockout), costs, acceptance, assistant)
    args += (_charged_rate(chip), copy_latency(chip))
    try:
        hash(args)
    except TypeError:  # an argument that cannot be a key (an assistant of one's own making): made afresh
        return _prediction.__wrapped__(*args)
    return _prediction(*args)


def _charged_rate(chip: Chip) -> ReadRate | None:
    """The HBM read rate ``chip`` is charged now (None where there is none: the prediction says why)."""
    try:
        return read_rate(chip)
    except ValueError:
        return None


@lru_cache(maxsize=1024)
def _prediction(
    cfg: ModelConfig,
    chip: Chip,
    context: int,
    batch: int,
    engine: str,
    dtype: str,
    setup: KernelSetup,
    knockout: frozenset,
    costs: GivenCosts,
    acceptance: float | None,
    assistant,
    rate: ReadRate | None,
    latency: Latency,
) -> Prediction:
    """:func:`predict` of a checked config and chip, ``rate`` the read rate and ``latency`` the copy latency it is
    charged (keys: the step reads them itself). A Prediction is frozen, and nothing changes its fields' dicts."""
    per_round = check_speculation(setup.draft_tokens, acceptance)
    _check_drafts(setup, chip, engine, assistant)
    k = setup.draft_tokens
    drafter_s = 0.0 if assistant is None else drafter_seconds(assistant, cfg, chip, context, batch, dtype, k)
    plan = step_plan(cfg, chip, context, batch, dtype, setup if engine == "megakernel" else GENERAL_STACK,
                     frozenset(knockout))  # fmt: skip
    if engine == "general":
        fields = _general_fields(plan, chip, dtype, costs.kernel_s, costs.hbm_read_Bps)
    else:
        fields = _megakernel_fields(plan, setup, chip, dtype, costs)
    if k:
        fields["models"] += f"; {k} drafted tokens verified per user a round, {per_round:g} emitted (given)"
    if assistant is not None:
        fields["models"] += f"; drafts by {assistant.name}, {k} programs of its own"
    if engine == "megakernel":
        fields["models"] += f"; {fields['op_cost_words']}"
    sol = speed_of_light(cfg, chip, context, batch, dtype)
    return Prediction(
        cfg.name, chip.name, context, batch, dtype, **fields, sol_step_s=sol.step_s, fits_in_hbm=sol.fits_in_hbm,
        draft_tokens=k, tokens_per_round=per_round, drafter_s=drafter_s,
    )  # fmt: skip


def drafter_seconds(assistant, cfg: ModelConfig, chip: Chip, context: int, batch: int, dtype: str, k: int) -> float:
    """A round of Gemma 4's assistant drafting ``k`` tokens for ``batch`` users, outside the verification kernel:
    ``k`` programs, each reading the assistant's weights and the target's K/V it attends to (the last layer of each
    attention type: up to ``context`` positions, a sliding layer's window and one more), spread evenly over the
    slice's chips at their bandwidth, plus one general-stack kernel's cost (fitted, data/timing.csv) for its launch.
    A lower bound of a separate drafter: every byte once, one launch a draft. Refuses an assistant that is not
    ``cfg``'s (mk.assistant_config.check_pair)."""
    check_pair(assistant, cfg)
    pol = get_dtype(dtype)
    weights = assistant.weight_bytes(pol.matrix)
    kv = 0
    for t in source_layers(cfg):
        seen = min(context, cfg.sliding_window + 1) if t == SLIDING else context
        kv += 2 * batch * cfg.kv_heads(t) * seen * cfg.head_dim(t) * pol.kv
    per_draft = (weights + kv) / chip.chips / read_rate(chip).per_chip + kernel_cost(chip.kind)
    return k * per_draft


def _shared_constants(chip: Chip, hbm_read_Bps: float | None) -> dict[str, str]:
    used = {
        "hbm_read_Bps": read_rate(chip).label
        if hbm_read_Bps is None
        else f"{hbm_read_Bps / 1e9:.4g} GB/s a chip (given)",
    }
    if chip.chips > 1:
        used["ici_hop_latency_s"] = f"{link_latency(chip):g} (cited)"
    return used


def _general_constants(chip: Chip, kernel_s: float, hbm_read_Bps: float | None) -> dict[str, str]:
    fitted = kernel_s == kernel_cost(chip.kind)
    return _shared_constants(chip, hbm_read_Bps) | {
        "matmul_rows": f"{chip_constant('matmul_rows', chip).value:g} (cited)",
        "kernel_s": f"{kernel_s:.3g} "
        + (f"(fitted to {constant('kernel_s', chip.kind).fit_to})" if fitted else "(given)"),
        "kernels_per_plan_kernel": f"{kernels_per_plan_kernel():.3f} (published count / plan count)",
    }


def _megakernel_constants(
    chip: Chip,
    assumed: dict | None,  # the core's costs where no schedule gives them, else None
    cost_words: str,
    fitted: dict[str, str],  # the costs that are data/timing.csv's fitted defaults, and their points
    hbm_read_Bps: float | None,
) -> dict[str, str]:
    used = _shared_constants(chip, hbm_read_Bps) | {"dma_latency_s": copy_latency(chip).label}
    if assumed is None:  # the core's time is the compiler's bundles, not FLOPs at a padded rate
        return used | {"op_costs": cost_words}
    used["matmul_rows"] = f"{chip_constant('matmul_rows', chip).value:g} (cited)"
    for name, value in assumed.items():
        if name in fitted:  # not compared with the fit: the fit itself predicts with the cost given
            used[name] = f"{value:.3g} (fitted to {fitted[name]})"
            continue
        default = value == constant(name, chip.kind).value
        used[name] = f"{value:g} ({'assumed, data/timing.csv' if default else 'given'})"
    return used


def step_breakdown(model, chip, context: int, batch: int = 1, dtype: str = "bf16", **kw) -> dict:
    """The megakernel's modelled step on ``chip`` in parts, per chip that sets the pace: the weight bytes
    its DMAs move (padding and INT8 scale blocks included) and the real ones, the scale blocks' share, the
    KV cache, the HBM floor those bytes set, and the time beyond it (serial reads, the link, compute),
    beside the speed of light. Seconds and bytes. ``kw``: :func:`predict`'s keywords."""
    p = predict(model, chip, context, batch, "megakernel", dtype, **kw)
    cfg, chip = _check(model, chip, context, batch, "megakernel")
    plan = step_plan(cfg, chip, context, batch, dtype, kw.get("setup", WORKBOOK_KERNEL))
    scales = sum(ld.scale_bytes * plan.fetch_probability(ld) for ld in plan.loads)
    return dict(
        model=p.model,
        chip=p.chip,
        dtype=dtype,
        placement=p.placement,
        setup=p.setup,
        step_s=p.step_s,
        sol_step_s=p.sol_step_s,
        fraction_of_sol=p.fraction_of_sol,
        weights_moved_bytes=p.pacing.weight_bytes,
        weights_real_bytes=p.pacing.weight_payload_bytes,
        scale_blocks_bytes=scales,
        kv_bytes=p.pacing.kv_bytes,
        hbm_floor_s=p.pacing.hbm_floor_s,
        beyond_floor_s=p.step_s - p.pacing.hbm_floor_s,
    )
