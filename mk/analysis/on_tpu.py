"""What was measured on a real TPU (data/measured/tpu*.csv, ``python -m mk tpu-measure``), beside the timing model: the
chip's HBM read rate, the kernel's parity, every step with its modelled counterpart and error, and the write-up's
headline rebuilt from the measured per-chip work plus the modelled links.

The model of a measured step is mk.timing's for the same model (or truncation), chip, context, batch and data type:
the megakernel's for a megakernel row (one chip; or, for chip 0 of a v5e-8 stood in for by one chip, the v5e-8 step of
that setup with its exchanges as local copies in place of its links' time), with the row's share of a call's measured
fixed time (:func:`call_floor`), the general stack's for XLA's row. Errors are modelled / measured - 1 against the
device's time (steps back to back), the time the model predicts: a host that waits on every step adds its own latency
(``host_over_device``).

Every table here reads only rows taken on a TPU, as each row's ``device`` names it (:func:`chip_rows`: a CPU's
interpreted rows never stand for a chip's), and sets each against its own chip (a v6e's row against a v6e's model and
limit); of a cell measured more than once, the newest row of that device. Each step says whether it ran the megakernel's
code in this tree (``kernel_is_current``, mk.timing.scheduled.current_kernel: by the digest of mk/megakernel/ the chip
computed, or, for rows from before rows carried one, by the revision they record), so an older kernel's row is
told apart from the current kernel's."""

from __future__ import annotations

import math
import statistics

import pandas as pd

from ..chips import get_chip, measured_chip, measured_copy_latency, measured_limit, slice_of
from ..config import with_layers
from ..kernel_setup import SETUPS, WORKBOOK_KERNEL, KernelSetup
from ..paths import MEASURED_DIR, TPU_CSV, TPU_OPS_CSV
from ..published import published
from ..routing import expected_distinct_experts
from ..sol import kv_bytes_per_user, speed_of_light
from ..timing import DEFAULT_COSTS, MODELLED, GivenCosts, Prediction, predict
from ..timing.scheduled import current_kernel
from ..timing.work import named_plan

STAND_IN = "; loopback stand-in"  # how a stand-in row's setup ends (mk.measure.on_chip)
SLICE = "tpu-v5e-8"  # the write-up's slice, whose chip 0 a stand-in row is (mk.measure.on_chip.SLICE chips)
MISS = 0.15  # a row past this |error| is explained below or by a profile
UNEXPLAINED = "not explained yet"  # how a reason that is not (yet) one begins


def _shared_experts(row) -> str:
    """A many-user MoE row of XLA's: what reading one expert slice per (user, slot) costs over the distinct experts the
    model reads, at the measured limit."""
    cfg, B = measured_config(row), int(row["batch"])
    layers = sum(cfg.is_moe_layer(i) for i in range(cfg.num_layers))
    distinct = expected_distinct_experts(cfg.num_experts, cfg.top_k, B)
    extra = layers * (B * cfg.top_k - distinct) * 3 * cfg.hidden_size * cfg.expert_intermediate * 2  # bf16
    ms = extra / measured_limit(row["chip"]).bandwidth * 1e3
    return (
        f"{UNEXPLAINED}: of the {row['device_ms'] - row['modelled_ms']:.2f} ms XLA takes over the model, "
        f"{ms:.2f} ms is at most the experts read again for users who share one (XLA's program takes one slice per "
        f"(user, slot), {B * cfg.top_k} a layer, where the model reads the {distinct:.1f} distinct experts expected: "
        f"{extra / 1e9:.2f} GB more at the measured limit); {_uncharged(row)}"
    )


def _uncharged_ms(row) -> tuple[float, float] | None:
    """Milliseconds a row's op profile spends in while loops and waiting on copies (ops the model does not charge);
    None where the cell was not profiled."""
    ms = profile_categories(row)
    return None if ms is None else (ms.get("while", 0.0), ms.get("copy-done", 0.0))


def _uncharged(row) -> str:
    got = _uncharged_ms(row)
    if got is None:
        return f"this cell has no op profile ({TPU_OPS_CSV.name})"
    return f"its op profile on the chip: {got[0]:.2f} ms in while loops, {got[1]:.2f} ms waiting on copies"


def _cache_writes(row) -> str:
    """A many-user row of XLA's on a dense model: what its op profile on the chip spends on the users' cache writes,
    which the model's kernels do not charge, against the time the model misses by."""
    miss = row["device_ms"] - row["modelled_ms"]
    got = _uncharged_ms(row)
    if got is None:
        missing = f"this cell has no op profile ({TPU_OPS_CSV.name})"
        return f"{UNEXPLAINED}: XLA takes {miss:.2f} ms over the model; {missing}"
    loops, copies = got
    text = (
        f"XLA's op profile on the chip: {loops:.2f} ms in while loops and {copies:.2f} ms waiting on copies, which the "
        f"model's kernels do not charge: {loops + copies:.2f} ms against the {miss:.2f} ms it misses by (the weights' "
        "copies run beside them, so not all of it lengthens the step). Its "
        "program writes each user's new K and V (mk.reference.write_slots, a scatter) in a loop over the users, one a "
        "layer for K and one for V, with the layer's whole cache copied into the core's own memory for it and back "
        "(the step compiled for a v5e); one user's is a plain in-place update"
    )
    return text if loops + copies >= miss else f"{UNEXPLAINED}: {text}"


def _slow_cache_fusions(row) -> str:
    """XLA's long-context row of a model whose cache it reads far slower than llama-3.2-1b's: what is known, and where
    its op profile puts the time the longer context adds."""
    return (
        UNEXPLAINED + ": XLA's attention reads this model's cache far slower than llama-3.2-1b's, which holds the "
        "same bytes a position (8 layers of 8 KV heads x 128 against 16 of 8 x 64; section 4's cache read rates "
        "compute both from 8K to 32K), while XLA's own cost analysis of the step compiled for a v5e counts about the "
        "weights' and cache's bytes (within a few percent), and its cycle estimate of the probabilities-times-V fusion "
        "a cache byte is llama-3.2-1b's: a fusion that runs slower than XLA expects, not extra reads. A candidate: the "
        "step compiled for a v5e takes this model's cache with the head dim (128) on lanes and positions on sublanes, "
        "so its scores contract over lanes, where it takes llama-3.2-1b's (head dim 64) with positions on lanes (the "
        f"entry layouts of mk.megakernel.parity.reference_on_tpu's program); {_growth(row)}"
    )


def _growth(row) -> str:
    """Where a row's op profile puts the time its context adds over the same step's profile at the longest shorter
    context: the two op categories that grew most."""
    t = op_profiles()
    ms = profile_categories(row, t)
    shorter = t[_matching(t, row, ["engine", "model", "dtype", "setup", "batch"]) & (t.context < row["context"])]
    if ms is None or shorter.empty:
        return f"no op profile of this cell and of a shorter context ({TPU_OPS_CSV.name})"
    c0 = int(shorter.context.max())
    grown = ms.sub(profile_categories(dict(row, context=c0), t), fill_value=0.0).sort_values(ascending=False)
    return (f"its op profile on the chip, against {c0 // 1024}K positions': the step {grown.sum():+.2f} ms, "
            + ", ".join(f"{name} {v:+.2f} ms" for name, v in grown.head(2).items()))  # fmt: skip


# Rows the model misses by more than MISS, by (engine, model, context), (engine, model) or (engine, the model cut):
# why, in words, or a function of the row that says it.
KNOWN_MISSES = {
    ("reference", "gemma4-26b-a4b"): _shared_experts,
    ("reference", "qwen3-30b-a3b"): _shared_experts,
    ("reference", "llama-3.2-1b"): _cache_writes,
    ("reference", "qwen3-8b[:8]", 32768): _slow_cache_fusions,
    ("reference", "qwen3-8b[:8]", 131072): _slow_cache_fusions,
}
COLUMNS = [
    "engine", "what", "model", "base_model", "layers", "setup", "chip", "dtype", "context", "batch", "host_ms",
    "device_ms", "device_low_ms", "device_high_ms", "profiled_ms", "modelled_ms", "error", "host_over_device",
    "step_GB", "device_fraction_of_spec", "device_fraction_of_limit", "date", "device", "commit", "kernel_revision",
    "kernel_digest", "kernel_is_current",
]  # fmt: skip


def chip_rows(t: pd.DataFrame) -> pd.DataFrame:
    """The rows of a measured table ``t`` taken on a TPU, as each row's ``device`` names it (mk.chips.measured_chip, the
    one reading of a row's device): a CPU's interpreted rows and any other device's left out, a TPU kind mk does not
    know refused. Every reader of data/measured/'s TPU tables keeps these and no others."""
    if t.empty:
        return t
    return t[t["device"].map(measured_chip).notna()]


def stand_in_slice(chip: str) -> str:
    """The slice a stand-in row's chip 0 is of: :data:`SLICE`'s size of the row's own chip (``tpu-v5e`` or
    ``tpu-v5e-8`` -> ``tpu-v5e-8``)."""
    return slice_of(get_chip(chip).base, get_chip(SLICE).chips).name


def measured_config(r):
    """The model a measured row ran: its ``base_model`` cut to its ``layers`` (``all``, a count, or mk.config's
    LAYER_PAIR)."""
    layers = r["layers"]
    return with_layers(r["base_model"], None if layers == "all" else int(layers) if str(layers).isdigit() else layers)


def engine_bytes(r, engine: str | None = None) -> float:
    """The bytes a measured row's engine reads a step (mk.sol's count, no padding), the one count every fraction of a
    measured step is of: the row's data type for the megakernel, its float part for XLA's reference, which computes
    with the float tree of a quantized one ("bf16+int8-experts" -> "bf16"); for a stand-in (chip 0 of a slice on one
    chip), the slice's bytes over its chips."""
    engine = r["engine"] if engine is None else engine
    dtype = str(r["dtype"]) if engine == "megakernel" else str(r["dtype"]).split("+", 1)[0]
    cfg, context, batch = measured_config(r), int(r["context"]), int(r["batch"])
    if str(r["setup"]).endswith(STAND_IN):
        whole = stand_in_slice(r["chip"])
        return speed_of_light(cfg, whole, context, batch, dtype).bytes_per_token / get_chip(whole).chips
    return speed_of_light(cfg, r["chip"], context, batch, dtype).bytes_per_token


def fraction_of_limit(nbytes: float, seconds: float, chip: str) -> float:
    """``nbytes`` read in ``seconds`` as a fraction of ``chip``'s measured read limit (mk.chips.measured_limit, the
    best read rate observed on one such chip): every measured fraction of the limit the workbook shows is this; NaN
    where no such chip's limit was measured."""
    limit = measured_limit(chip)
    return math.nan if limit is None else nbytes / seconds / limit.bandwidth


def fraction_at_long_end(steps):
    """A measured step's fraction of the limit at its interval's long end (its bytes over its ``device_high_ms``):
    past 1 even there, a count or the limit is wrong, not noise. ``steps``: a :func:`tpu_steps` row or table."""
    return steps.device_fraction_of_limit * steps.device_ms / steps.device_high_ms


def stand_in_setup(label: str):
    name = label.removesuffix(STAND_IN)
    found = [s for s in SETUPS.values() if s.name == name]
    if not found:
        raise ValueError(f"a stand-in row names the setup {name!r}, which mk.kernel_setup.SETUPS does not have")
    return found[0]


def stand_in_bytes(r) -> dict[str, float]:
    """What chip 0 of a stand-in row's slice streams a step, by what a knock-out switches off (mk.params.KNOCKOUTS):
    its plan's weight bytes by component (the model's own, no padding: its share of a split component, the whole of one
    every chip reads, as the router), an attention type's with the KV cache chip 0 reads."""
    cfg, context, batch = measured_config(r), int(r["context"]), int(r["batch"])
    plan = named_plan(cfg, stand_in_slice(r["chip"]), context, batch, stand_in_setup(r["setup"]), r["dtype"])
    got = plan.bytes_by_component(payload=True)
    for op in plan.ops:
        if op.kind == "Attend":
            got[op.component] = got.get(op.component, 0.0) + plan.kv_payload(op)
    return {c: b for c, b in got.items() if b > 0}


def kernel_setup_of(r) -> tuple[str, KernelSetup]:
    """The chip and kernel setup the model times a measured megakernel row on: a stand-in's slice, chip 0 of it alone
    (a loopback setup: its exchanges local copies); else its own chip, the workbook's kernel."""
    if str(r["setup"]).endswith(STAND_IN):
        return stand_in_slice(r["chip"]), stand_in_setup(r["setup"]).replace(loopback=True)
    return r["chip"], WORKBOOK_KERNEL


def measured_prediction(r, costs: GivenCosts = DEFAULT_COSTS, knockout=frozenset()) -> Prediction:
    """The model's prediction of a measured row's step (the module's docstring); ``costs``: a sensitivity
    (mk.timing.GivenCosts); ``knockout``: components switched off (mk.timing.predict's)."""
    cfg, context, batch = measured_config(r), int(r["context"]), int(r["batch"])
    kw = dict(costs=costs, knockout=knockout)
    if r["engine"] != "megakernel":
        # mk.reference computes a quantized tree's float tree (dequantized once): XLA reads the float weights
        return predict(cfg, r["chip"], context, batch, "general", str(r["dtype"]).split("+", 1)[0], **kw)
    chip, setup = kernel_setup_of(r)
    return predict(cfg, chip, context, batch, "megakernel", r["dtype"], setup=setup, **kw)


def call_floor(chip: str) -> float:
    """A kernel call's fixed time on ``chip`` (mk.chips.CopyLatency.call_seconds: measured on one such chip), 0 where
    none was measured: a call of n steps pays it once, a step n-th of it."""
    m = measured_copy_latency(get_chip(chip).base)
    return 0.0 if m is None else m.call_seconds


def modelled_seconds(r, costs: GivenCosts = DEFAULT_COSTS) -> tuple[float, str]:
    """A measured row's modelled step and the setup it models: the kernel's step (:func:`measured_prediction`) and its
    share of the call's fixed time (:func:`call_floor` over the row's steps a call); XLA's step as the general stack's
    model gives it (its own fixed costs a kernel)."""
    p = measured_prediction(r, costs)
    if r["engine"] != "megakernel":
        return p.step_s, "general"
    stand_in = str(r["setup"]).endswith(STAND_IN)
    steps = r.get(STEPS, 1)
    steps = 1 if pd.isna(steps) else int(steps)
    return p.step_s + call_floor(r["chip"]) / steps, (
        p.setup + ", its exchanges local copies" if stand_in else "one chip"
    )


STEPS = "steps_a_call"  # tpu.csv's greedy decode steps a call (mk.measure.on_chip: a row's times are a step's)
CELL = ["engine", "model", "dtype", "setup", "chip", "context", "batch"]  # what one measured step is of
OP_CELL = ["device", "engine", "model", "dtype", "setup", "context", "batch"]  # what one op profile is of (tpu_ops.csv)


def remeasured(path=None) -> pd.DataFrame:
    """Every cell measured on a TPU more than once: its first and its newest device time, with their commits and the
    megakernel's revisions they ran (data/kernel_revisions.csv: what changed between them)."""
    path = TPU_CSV if path is None else path
    t = chip_rows(_one_step_a_call(pd.read_csv(path))).sort_values("date", kind="stable")
    rows = []
    for key, g in t.groupby(CELL, sort=False, dropna=False):
        if len(g) > 1:
            first, last = g.iloc[0], g.iloc[-1]
            rows.append(dict(
                zip(CELL, key), first_ms=first.device_step_ms, newest_ms=last.device_step_ms,
                first_over_newest=first.device_step_ms / last.device_step_ms,
                first_commit=first.commit.split(" ")[0], newest_commit=last.commit.split(" ")[0],
                first_revision=int(first.kernel_revision), newest_revision=int(last.kernel_revision),
            ))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, device time)")


def tpu_steps(path=None) -> pd.DataFrame:
    """Every step measured on a TPU (rows from a CPU left out; of a cell measured more than once, the newest), with
    the model's step and the error against the device's time, the bytes its engine reads (:func:`engine_bytes`) and
    its fractions of the data sheet's bandwidth and of the measured limit, computed now from those bytes (a row's own
    stored fractions used the limit and the count of their day), and whether it ran this tree's kernel
    (``kernel_is_current``; the module's docstring); empty, with its columns, where none was measured."""
    path = TPU_CSV if path is None else path
    if not path.exists():
        return pd.DataFrame(columns=COLUMNS)
    t = _newest(chip_rows(_one_step_a_call(pd.read_csv(path))), CELL)  # a cell measured again: its newest row
    t = t.assign(kernel_is_current=current_kernel(t))
    if "kernel_digest" not in t:  # a file from before rows carried it
        t = t.assign(kernel_digest=float("nan"))
    rows = []
    for _, r in t.iterrows():
        modelled, _ = modelled_seconds(r)
        nbytes, seconds = engine_bytes(r), r.device_step_ms / 1e3
        rows.append(dict(
            engine=r.engine, what=cell_words(r.model, r.setup, r["dtype"]), model=r.model, base_model=r.base_model,
            layers=r.layers, setup=r.setup,
            chip=r.chip, dtype=r["dtype"], context=int(r.context), batch=int(r.batch), host_ms=r.step_ms,
            device_ms=r.device_step_ms,
            device_low_ms=r.device_step_low_ms, device_high_ms=r.device_step_high_ms, profiled_ms=r.profiled_step_ms,
            modelled_ms=modelled * 1e3, error=modelled * 1e3 / r.device_step_ms - 1,
            host_over_device=r.step_ms / r.device_step_ms - 1, step_GB=nbytes / 1e9,
            device_fraction_of_spec=nbytes / seconds / get_chip(r.chip).hbm_bandwidth,
            device_fraction_of_limit=fraction_of_limit(nbytes, seconds, r.chip), date=r.date, device=r.device,
            commit=r.commit, kernel_revision=r.kernel_revision, kernel_digest=r.kernel_digest,
            kernel_is_current=r.kernel_is_current,
        ))  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS).assign(kind=f"measured (TPU, device time) vs {MODELLED}")


def megakernel_runs(path=None) -> pd.DataFrame:
    """What the megakernel itself ran on a TPU (data/measured/tpu.csv, the newest row of each cell; nothing modelled,
    so no prediction is made): one row a measured model (its stand-ins and data types apart), with the contexts and
    users measured, the device's step at the fastest and slowest cell, the kernel revisions, devices and dates."""
    path = TPU_CSV if path is None else path
    if not path.exists():
        return pd.DataFrame()
    t = _one_step_a_call(pd.read_csv(path))
    t = _newest(t[(t.backend == "tpu") & (t.engine == "megakernel")], CELL)
    t = t.assign(what=[cell_words(m, s, d) for m, s, d in zip(t.model, t.setup, t["dtype"])])
    rows = []
    for what, g in t.groupby("what", sort=False):
        rows.append(dict(
            what=what, cells=len(g), contexts=", ".join(map(str, sorted(set(g.context.astype(int))))),
            users=", ".join(map(str, sorted(set(g.batch.astype(int))))), fastest_device_ms=g.device_step_ms.min(),
            slowest_device_ms=g.device_step_ms.max(),
            kernel_revisions=", ".join(map(str, sorted(set(g.kernel_revision.astype(int))))),
            device=", ".join(sorted(set(g.device.dropna().astype(str)))), first_date=g.date.min()[:10],
            last_date=g.date.max()[:10],
        ))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, device time: steps back to back)")


def _one_step_a_call(t: pd.DataFrame) -> pd.DataFrame:
    """The rows of one decode step a call (those of several a call: :func:`steps_a_call`)."""
    return t[t[STEPS].fillna(1) == 1] if STEPS in t else t


def steps_a_call(path=None) -> pd.DataFrame:
    """Each engine's token with N greedy steps in one compiled call, timed in one run (the newest run of a cell): the
    host's time a token and the device's, and the host's over the device's; empty where none was measured."""
    path = TPU_CSV if path is None else path
    t = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=[*CELL, STEPS, "device"])
    t = chip_rows(t)
    t = t[t[STEPS].notna()]
    # the runs that timed a cell at several N (a run: its rows share a date), then of a cell's such runs the newest
    runs = t[t.groupby([*CELL, "date"], dropna=False)[STEPS].transform("nunique") > 1]
    runs = runs[runs.date == runs.groupby(["chip", "model", "context", "batch"]).date.transform("max")]
    out = runs.assign(
        steps_a_call=runs[STEPS].astype(int),
        host_token_ms=runs.step_ms,
        device_token_ms=runs.device_step_ms,
        host_over_device=runs.step_ms / runs.device_step_ms - 1,
    )
    cols = ["engine", "model", "dtype", "context", "batch", "steps_a_call", "host_token_ms", "device_token_ms",
            "host_over_device", "kernel_revision", "date", "commit"]  # fmt: skip
    return out[cols].sort_values(["batch", "engine", "steps_a_call"]).assign(kind="measured (TPU): host and device")


def cell_words(model: str, setup: str, dtype: str) -> str:
    """A measured cell's model in words: a stand-in's chip and setup, a data type other than bf16."""
    what = f"{model}, chip 0 of a v5e-8, setup {setup.split(' ')[0]}" if str(setup).endswith(STAND_IN) else model
    return what if dtype == "bf16" else f"{what}, {dtype}"


def known_miss(row) -> str | None:
    """Why the model misses ``row`` (a :func:`tpu_steps` row) by more than MISS, where known: by its model and
    context, its model, or the model it cuts."""
    keys = [
        (row["engine"], row["model"], row["context"]),
        (row["engine"], row["model"]),
        (row["engine"], row["base_model"]),
    ]
    reason = next((KNOWN_MISSES[k] for k in keys if k in KNOWN_MISSES), None)
    return reason(row) if callable(reason) else reason


def _explained(reason: str | None) -> bool:
    """A reason that explains its miss (not one that says what is known while it is not explained yet)."""
    return reason is not None and not reason.startswith(UNEXPLAINED)


def error_summary(steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per engine, and for the megakernel per kernel (this tree's, or an older revision's: ``kernel``): rows, the
    median and worst |error|, the rows past MISS and how many of them are explained. The model is of this tree's
    kernel, so its test is the current kernel's rows; an older kernel's rows say what that kernel measured."""
    s = tpu_steps() if steps is None else steps
    kernel = ["this tree's" if ok else f"revision {int(r)}" if r == r else "not recorded"
              for ok, r in zip(s.kernel_is_current.fillna(False), s.kernel_revision)]  # fmt: skip
    s = s.assign(kernel=[k if e == "megakernel" else "-" for e, k in zip(s.engine, kernel)])
    rows = []
    for (engine, which), g in s.groupby(["engine", "kernel"]):
        past = g[g.error.abs() > MISS]
        rows.append(dict(
            engine=engine, kernel=which, rows=len(g), median_abs_error=statistics.median(g.error.abs()),
            worst_error=g.error.loc[g.error.abs().idxmax()], past_miss=len(past),
            explained=sum(_explained(known_miss(r)) for _, r in past.iterrows()),
        ))  # fmt: skip
    return pd.DataFrame(rows).assign(kind=f"measured (TPU) vs {MODELLED}")


def misses(steps: pd.DataFrame | None = None) -> pd.DataFrame:
    """The rows the model misses by more than MISS, each with its reason."""
    s = tpu_steps() if steps is None else steps
    past = s[s.error.abs() > MISS].copy()
    past["reason"] = [known_miss(r) for _, r in past.iterrows()]
    return past[["engine", "model", "context", "batch", "device_ms", "modelled_ms", "error", "reason"]]


def cache_read_rates(steps: pd.DataFrame | None = None, short: int = 8192, long: int = 32768) -> pd.DataFrame:
    """Per engine, one-chip model and data type measured for one user at ``short`` and ``long`` positions: the cache
    bytes the longer context adds (as XLA reads them, unpadded) over the device time it adds: the rate each engine
    reads its cache at, apart from its weights."""
    s = tpu_steps() if steps is None else steps
    one = s[(s.batch == 1) & (s.setup == "one chip") & s.context.isin([short, long])]
    rows = []
    for (engine, model, dtype), g in one.groupby(["engine", "model", "dtype"]):
        if set(g.context) != {short, long}:
            continue
        ms = g.set_index("context").device_ms
        cfg = measured_config(g.iloc[0])
        added = _cache_bytes(cfg, long) - _cache_bytes(cfg, short)
        extra_ms = ms[long] - ms[short]
        rows.append(dict(engine=engine, model=model, dtype=dtype, added_cache_GB=added / 1e9, added_device_ms=extra_ms,
                         cache_read_GBps=added / extra_ms / 1e6))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, device time)")


def _cache_bytes(cfg, context: int, batch: int = 1) -> float:
    """The bf16 KV cache bytes a step reads at ``context`` (head dims as they are, as XLA reads them: mk.sol's)."""
    return batch * sum(kv_bytes_per_user(cfg, context).values())


def stand_in_headline(steps: pd.DataFrame | None = None, context: int = 1024) -> pd.DataFrame:
    """The write-up's 26B-A4B step on a v5e-8 rebuilt, for each stand-in setup measured: chip 0's step measured on one
    chip (its exchanges local copies) plus the links' time the model gives that setup (on one link: the long end), and
    chip 0's step alone (no link time: the short end), against the published step and the model's own whole step.
    Tokens/s and the fraction of the speed of light at the data sheet's bandwidth (the write-up's definition) and at the
    measured limit."""
    s = tpu_steps() if steps is None else steps
    s = s[s.setup.str.endswith(STAND_IN) & (s.chip == SLICE) & (s.context == context) & (s.batch == 1)]  # a v5e's
    sol = speed_of_light("gemma4-26b-a4b", SLICE, context, 1, "bf16")
    chip0_bytes = sol.bytes_per_token / get_chip(SLICE).chips
    rows = []
    for _, r in s.iterrows():
        setup = stand_in_setup(r.setup)
        p = predict("gemma4-26b-a4b", SLICE, context, 1, "megakernel", "bf16", setup=setup)
        step = r.device_ms / 1e3 + p.pacing.ici_s
        rows.append(dict(
            setup=setup.name, chip0_measured_ms=r.device_ms, chip0_tokens_per_s=1e3 / r.device_ms,
            chip0_fraction_of_limit=r.device_fraction_of_limit, links_modelled_ms=p.pacing.ici_s * 1e3,
            step_ms=step * 1e3, tokens_per_s=1 / step, fraction_of_sol=sol.step_s / step,
            fraction_of_limit=fraction_of_limit(chip0_bytes, step, SLICE), date=str(r.date)[:10],
            modelled_step_ms=p.step_s * 1e3, published_step_ms=published("mk_v5e8_moe_step") * 1e3,
            published_tokens_per_s=published("mk_v5e8_moe_tps"),
            published_fraction_of_sol=published("mk_v5e8_moe_sol_fraction"),
        ))  # fmt: skip
    kind = "measured (chip 0 on one TPU v5e) + modelled (links on one link, mk.timing)"
    return pd.DataFrame(rows).assign(kind=kind)


def op_profiles(path=None) -> pd.DataFrame:
    """Where each profiled step's device time went (data/measured/tpu_ops.csv; ``python -m mk tpu-measure`` writes it
    beside tpu.csv): each op category's total and the longest ops, microseconds a step, of a cell's newest profile."""
    path = TPU_OPS_CSV if path is None else path
    if not path.exists():
        return pd.DataFrame()
    t = chip_rows(pd.read_csv(path))
    newest = t.groupby(OP_CELL, dropna=False).date.transform("max")
    return t[t.date == newest].reset_index(drop=True).assign(kind="measured (TPU, profiler trace)")


def profile_categories(row, profiles: pd.DataFrame | None = None) -> pd.Series | None:
    """Milliseconds a step by op category in the newest op profile of ``row``'s cell (a :func:`tpu_steps` row); None
    where the cell was not profiled. A while loop's time holds the ops it runs (the profiler nests them)."""
    t = op_profiles() if profiles is None else profiles
    if t.empty:
        return None
    mine = t[(t.what == "category") & _matching(t, row, OP_CELL)]
    return None if mine.empty else mine.set_index("name").us / 1e3


def _matching(t: pd.DataFrame, row, columns: list[str]) -> pd.Series:
    """Which rows of ``t`` have ``row``'s values in ``columns``."""
    return (t[columns] == pd.Series({k: row[k] for k in columns})).all(axis=1)


# the op categories a step's time is split into (the rest: "other ops"), in words
PROFILE_PARTS = {"custom-call": "the Pallas kernel", "while": "while loops", "copy-done": "waiting on copies"}


def op_time(profiles: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each profiled step's device time (ms) in PROFILE_PARTS and the other ops, a row a part. The profiler nests a
    while loop's ops inside it, so the step is every category's time less the loops' (the parts add up to it)."""
    t = op_profiles() if profiles is None else profiles
    if t.empty:
        return pd.DataFrame()
    rows = []
    for key, g in t[t.what == "category"].groupby(OP_CELL, sort=False, dropna=False):
        ms = g.set_index("name").us / 1e3
        step = ms.sum() - ms.get("while", 0.0)
        parts = {w: ms.get(c, 0.0) for c, w in PROFILE_PARTS.items()}
        parts["other ops"] = step - sum(parts.values())
        cell = dict(zip(OP_CELL, key))
        what = cell_words(cell["model"], cell["setup"], cell["dtype"])
        rows += [dict(cell, what=what, part=p, ms=v, step_ms=step) for p, v in parts.items()]
    return pd.DataFrame(rows).assign(kind="measured (TPU, profiler trace)")


def op_time_by_part(parts: pd.DataFrame) -> pd.DataFrame:
    """:func:`op_time`'s rows as a table, a row a profiled step, a column a part's microseconds (a part can be a few
    nanoseconds of a step of milliseconds)."""
    index = ["device", "engine", "model", "context", "batch"]
    wide = parts.assign(us=parts.ms * 1e3).pivot_table(index=index, columns="part", values="us", sort=False)
    wide.columns = [f"{part.removeprefix('the ').replace(' ', '_').lower()}_us" for part in wide.columns]
    return wide.reset_index().assign(kind=parts.kind.iloc[0])


def read_rates(path=None) -> pd.DataFrame:
    """The chip's HBM read-rate probes (data/measured/tpu_hbm.csv), device and host, by method and size."""
    path = MEASURED_DIR / "tpu_hbm.csv" if path is None else path
    if not path.exists():
        return pd.DataFrame()
    t = chip_rows(pd.read_csv(path)).copy()
    t["GiB"] = t["bytes"] / 2**30
    t["how"] = t.method + [
        f" ({c / 2**20:g} MiB x {int(d)})" if c == c else "" for c, d in zip(t.chunk_bytes, t.in_flight)
    ]
    return t.assign(kind="measured (TPU, steps back to back)")


def marginal_rates(rates: pd.DataFrame) -> pd.DataFrame:
    """Per probe shape (``how``, :func:`read_rates`) read at two sizes or more: its best whole-call device rate, and the
    rate between its two largest sizes (the extra bytes over the extra device time: a call's fixed cost cancels, so
    this is what an ever longer read approaches; a size read in more than one run, its newest row), each GB/s."""
    rows = []
    for how, g in rates.groupby("how", sort=False):
        at = g.sort_values(["bytes", "date"], kind="stable").groupby("bytes").tail(1)
        if len(at) < 2:
            continue
        a, b = at.iloc[-2], at.iloc[-1]
        ta, tb = a.bytes / (a.device_GBps * 1e9), b.bytes / (b.device_GBps * 1e9)
        rows.append(dict(how=how, method=b.method, from_GiB=a.GiB, to_GiB=b.GiB, best_GBps=g.device_GBps.max(),
                         marginal_GBps=(b.bytes - a.bytes) / (tb - ta) / 1e9,
                         fixed_us=(ta - a.bytes * (tb - ta) / (b.bytes - a.bytes)) * 1e6))  # fmt: skip
    return pd.DataFrame(rows).assign(kind="measured (TPU, steps back to back): differences of medians")


def kernel_stream_rates(steps: pd.DataFrame, rows: int = 6) -> pd.DataFrame:
    """The megakernel's own stream in its fastest measured steps: each step's bytes (:func:`engine_bytes`) over its
    device time, as GB/s and as a fraction of the measured limit, with the fraction at its interval's long end."""
    mk = steps[steps.engine == "megakernel"].assign(GBps=lambda t: t.step_GB / t.device_ms * 1e3)
    mk = mk.assign(fraction_at_high_ms=fraction_at_long_end(mk))
    cols = ["what", "dtype", "context", "batch", "step_GB", "device_ms", "GBps", "device_fraction_of_limit",
            "fraction_at_high_ms", "date"]  # fmt: skip
    return mk.nlargest(rows, "GBps")[cols].reset_index(drop=True).assign(kind="measured (TPU, device time)")


def parity(path=None) -> pd.DataFrame:
    """The kernel's parity on the chip (data/measured/tpu_parity.csv), one row a check and chip: its newest run (a file
    keeps every run's rows, each with its date and commit)."""
    path = MEASURED_DIR / "tpu_parity.csv" if path is None else path
    if not path.exists():
        return pd.DataFrame()
    return _newest_parity(chip_rows(pd.read_csv(path))).assign(kind="measured (TPU)")


def _newest_parity(t: pd.DataFrame) -> pd.DataFrame:
    """Of a parity file's rows, each check's newest on each device."""
    return _newest(t, ["device", "model", "dtype", "quantize"]).reset_index(drop=True)


def _newest(t: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Of the rows alike in ``keys``, the one with the latest date, in the file's order."""
    return t.sort_values("date", kind="stable").drop_duplicates(keys, keep="last").sort_index()


def bf16_parity_chip_and_interpreter(chip_path=None, cpu_path=None) -> pd.DataFrame:
    """Each family's bf16 check on the chip beside the same check in the interpreter on a CPU
    (data/measured/cpu_parity.csv): the kernel's largest logit error and the kernel-rounding reference's on each, with
    routing as is and (a routed family, since that bound) fixed, so a near-tie the kernel settles alike on both machines
    and the chip's reference settles otherwise shows as such."""
    chip = parity(chip_path)
    cpu_path = MEASURED_DIR / "cpu_parity.csv" if cpu_path is None else cpu_path
    if chip.empty or not cpu_path.exists():
        return pd.DataFrame()
    cpu = pd.read_csv(cpu_path)
    cpu = _newest_parity(cpu[cpu.device.str.startswith("cpu:")])  # the interpreter's, on a CPU
    if cpu.empty:
        return pd.DataFrame()
    keep = ["model", "max_logit_diff", "kernel_rounding_logit_diff", "rounding_logit_diff", "fixed_routing_logit_diff",
            "fixed_routing_kernel_rounding_logit_diff", "held"]  # fmt: skip
    both = chip[chip.dtype == "bf16"][keep + ["device"]].merge(
        cpu[cpu.dtype == "bf16"][keep], on="model", suffixes=("_chip", "_cpu")
    )  # each chip's check (its device) beside the interpreter's
    chips = ", ".join(sorted({measured_chip(d) for d in chip.device}))
    return both.assign(kind=f"measured ({chips}; CPU, Pallas interpret mode)")
