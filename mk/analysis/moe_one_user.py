"""The write-up's subject on the chip: a mixture-of-experts model decoding for one user, where the kernel stood
furthest from the chip's read limit. Each MoE cell at one user and 1K positions (bf16) measured at one and at several
greedy steps a call (mk.measure.on_chip.Case.steps_a_call), each engine's device time a token and its fraction of the
measured limit, and what a step takes past its bytes at the limit.

A step a call pays, on top of the kernel's own step, what the chip does between programs and the host's first
dispatch spread over the steps timed back to back; 16 steps a call spread that over 16 tokens, so a row at 16 steps is
close to the kernel's (or XLA's) own step. What is left past the bytes at 16 steps is the kernel's own: two cuts of
one model (its first n layers and its sliding+full pair) give it per layer, the bytes each cut reads at the limit taken
out.
"""

from __future__ import annotations

import pandas as pd

from ..chips import measured_limit
from ..config import LAYER_PAIR, with_layers
from ..measure.on_chip import is_variant
from ..paths import TPU_CSV
from ..units import significant
from .answer import value_range
from .on_tpu import STEPS, chip_rows, engine_bytes, fraction_of_limit, measured_config, modelled_seconds

KIND = "measured (TPU, device time a token; fractions of the measured limit from mk.sol's bytes)"
SEVERAL = 16  # the steps a call the several-step rows were timed at
COLUMNS = ["model", "setup", "engine", "steps_a_call", "device_ms", "device_low_ms", "device_high_ms", "step_GB",
           "fraction_of_limit", "past_bytes_us", "modelled_ms", "error", "date", "kernel_revision",
           "program_digest", "base_model", "layers"]  # fmt: skip


def moe_one_user_rows(path=None) -> pd.DataFrame:
    """Every MoE cell's newest row at one user, 1K, bf16, per engine, setup, steps a call (one or :data:`SEVERAL`)
    and kernel revision (what the gap was under an earlier kernel stays beside what it is): its device time a token
    with its interval, the bytes its engine reads, its fraction of the measured limit, the microseconds it takes past
    those bytes at the limit, and the timing model's step (mk.analysis.on_tpu.modelled_seconds: a step and its share
    of the call's fixed time) with its error against the row."""
    path = TPU_CSV if path is None else path
    t = chip_rows(pd.read_csv(path)) if path.exists() else pd.DataFrame()
    if not t.empty:  # the default kernel's rows: a variant's stand beside it in mk.analysis.copies_floor.switch_effect
        t = t[[not is_variant(s) for s in t.setup]]
    if t.empty or STEPS not in t:
        return pd.DataFrame(columns=COLUMNS)
    t = t.assign(steps_a_call=t[STEPS].fillna(1).astype(int))
    t = t[(t.batch == 1) & (t.context == 1024) & (t["dtype"] == "bf16") & t.steps_a_call.isin([1, SEVERAL])]
    t = t[[measured_config(r).num_experts > 0 for _, r in t.iterrows()]]
    t = t.sort_values("date", kind="stable").groupby(["model", "setup", "engine", "steps_a_call", "kernel_revision"])
    t = t.tail(1)
    rows = []
    for _, r in t.iterrows():
        nbytes, seconds = engine_bytes(r), r.device_step_ms / 1e3
        limit, (modelled, _) = measured_limit(r.chip), modelled_seconds(r)
        rows.append(dict(
            model=r.model, setup=r.setup, engine=r.engine, steps_a_call=r.steps_a_call, device_ms=r.device_step_ms,
            device_low_ms=r.device_step_low_ms, device_high_ms=r.device_step_high_ms, step_GB=nbytes / 1e9,
            fraction_of_limit=fraction_of_limit(nbytes, seconds, r.chip),
            past_bytes_us=(seconds - nbytes / limit.bandwidth) * 1e6 if limit else float("nan"),
            modelled_ms=modelled * 1e3, error=modelled / seconds - 1, date=str(r.date)[:10],
            kernel_revision=int(r.kernel_revision), program_digest=r.program_digest, base_model=r.base_model,
            layers=str(r.layers),
        ))  # fmt: skip
    out = pd.DataFrame(rows, columns=COLUMNS).sort_values(["setup", "model", "engine", "steps_a_call", "date"])
    # to the figures an exported table keeps (mk.units.SIGNIFICANT): one sentence from the rows or from the export
    floats = ["step_GB", "fraction_of_limit", "past_bytes_us", "modelled_ms", "error"]  # (the times as measured)
    out = out.assign(**{c: out[c].map(significant) for c in floats})
    return out.reset_index(drop=True).assign(kind=KIND)


def newest_rows(rows: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Of :func:`moe_one_user_rows`' rows, the newest of each ``keys``: their dates are days, and within one a later
    kernel revision is the newer row (revisions only grow)."""
    return rows.sort_values(["date", "kernel_revision"], kind="stable").groupby(keys).tail(1)


def moe_one_user(rows: pd.DataFrame) -> pd.DataFrame:
    """One row a cell measured at both one and :data:`SEVERAL` steps a call: each engine's fraction of the limit at
    each (NaN where an engine was not measured), the kernel's speed-up over XLA at each, and what one step a call adds
    to the kernel's token where both were timed in one run (same date; NaN where the newest rows are of two runs).
    Each engine's newest row at each steps a call stands for the cell (:func:`moe_one_user_rows` keeps older
    revisions' too)."""
    out = []
    newest = newest_rows(rows, ["model", "setup", "engine", "steps_a_call"])
    for (model, setup), g in newest.groupby(["model", "setup"], sort=False):
        at = {(r.engine, r.steps_a_call): r for r in g.itertuples()}
        if ("megakernel", 1) not in at or ("megakernel", SEVERAL) not in at:
            continue

        def get(engine, n, col):
            r = at.get((engine, n))
            return float("nan") if r is None else getattr(r, col)

        out.append(dict(
            model=model, setup=setup,
            **{f"{e}_fraction_{n}": get(e, n, "fraction_of_limit") for e in ("megakernel", "reference")
               for n in (1, SEVERAL)},
            megakernel_call_us=(get("megakernel", 1, "device_ms") - get("megakernel", SEVERAL, "device_ms")) * 1e3
            if get("megakernel", 1, "date") == get("megakernel", SEVERAL, "date") else float("nan"),
            megakernel_past_bytes_us=get("megakernel", SEVERAL, "past_bytes_us"),
            **{f"model_error_{n}": get("megakernel", n, "error") for n in (1, SEVERAL)},
            **{f"speedup_{n}": get("reference", n, "device_ms") / get("megakernel", n, "device_ms")
               for n in (1, SEVERAL)},
        ))  # fmt: skip
    return pd.DataFrame(out).assign(kind=KIND)


# Two cuts of each model whose difference is whole MoE layers (mk.config.with_layers): (the shorter, the longer), a
# count of layers or the sliding+full pair (26B-A4B's first 7 are 5 sliding layers more).
CUTS = {"gemma4-26b-a4b": (LAYER_PAIR, 7), "qwen3-30b-a3b": (3, 8)}
LAYER_COLUMNS = ["model", "cuts", "steps_a_call", "layers", "us_a_layer", "kernel_revision", "dates"]


def layers_past_bytes(rows: pd.DataFrame) -> pd.DataFrame:
    """What each MoE layer takes past its bytes at the limit in the kernel's step: for each model of :data:`CUTS` and
    steps a call, from the newest kernel revision that timed both its cuts on one chip, (the longer cut's time past its
    bytes - the shorter's) / (the layers between them). What a call adds to a step, and the head, cancel."""
    k = rows[(rows.engine == "megakernel") & (rows.setup == "one chip")]
    out = []
    for base, (short, long) in CUTS.items():
        cuts = [with_layers(base, c) for c in (short, long)]
        for n in (1, SEVERAL):
            a, b = (k[(k.model == cut.name) & (k.steps_a_call == n)] for cut in cuts)
            both = sorted(set(a.kernel_revision) & set(b.kernel_revision))
            if not both:
                continue
            a, b = (x[x.kernel_revision == both[-1]].tail(1) for x in (a, b))
            layers = cuts[1].num_layers - cuts[0].num_layers
            out.append(dict(
                model=base, cuts=f"{short} -> {long}", steps_a_call=n, layers=layers,
                us_a_layer=(b.past_bytes_us.iloc[0] - a.past_bytes_us.iloc[0]) / layers,
                kernel_revision=int(a.kernel_revision.iloc[0]), dates=", ".join(sorted({*a.date, *b.date})),
            ))  # fmt: skip
    return pd.DataFrame(out, columns=LAYER_COLUMNS).assign(kind=KIND)


CHANGE_COLUMNS = ["model", "steps_a_call", "revision_was", "fraction_was", "date_was", "revision_is", "fraction_is",
                  "date_is", "timed_under"]  # fmt: skip


def revision_changes(rows: pd.DataFrame) -> pd.DataFrame:
    """What the gap was and is: each one-chip cell whose kernel was timed at :data:`SEVERAL` steps a call in more than
    one program, its newest program's newest row beside the newest row of the program before (rows of two runs), each
    program named by the revision that first built it (``revision_was``, ``revision_is``); ``timed_under``: the
    revision the newest row ran under. A revision that left a cell's program as it was (its ``program_digest`` the
    same) changed nothing there: its rows are that program's again, not a change."""
    k = rows[(rows.engine == "megakernel") & (rows.setup == "one chip") & (rows.steps_a_call == SEVERAL)]
    out = []
    for model, g in k.groupby("model", sort=False):
        g = g.sort_values(["kernel_revision", "date"])
        program = g.program_digest.fillna(g.kernel_revision.astype(str))
        g = g.assign(built_by=g.groupby(program).kernel_revision.transform("min"))
        g = g.groupby(program, sort=False).tail(1)
        if len(g) < 2:
            continue
        was, now = g.iloc[-2], g.iloc[-1]
        out.append(dict(
            model=model, steps_a_call=SEVERAL, revision_was=int(was.built_by), fraction_was=was.fraction_of_limit,
            date_was=was.date, revision_is=int(now.built_by), fraction_is=now.fraction_of_limit, date_is=now.date,
            timed_under=int(now.kernel_revision),
        ))  # fmt: skip
    return pd.DataFrame(out, columns=CHANGE_COLUMNS).assign(kind=KIND)


def moe_sentence(table: pd.DataFrame, layers: pd.DataFrame, changes: pd.DataFrame | None = None) -> str:
    """The MoE one-user gap in one sentence, from :func:`moe_one_user`'s rows (one chip),
    :func:`layers_past_bytes`'s (each model's at the most steps a call it has) and :func:`revision_changes`'s."""
    one = table[table.setup == "one chip"]
    if one.empty:
        return "No MoE cell at one user has been measured at one and several steps a call on a TPU yet."
    k1, k16 = (
        value_range(one[c].min(), one[c].max(), ".3f") for c in ("megakernel_fraction_1", "megakernel_fraction_16")
    )
    both = one.dropna(subset=["speedup_1", "speedup_16"])
    s1, s16 = (value_range(both[c].min(), both[c].max(), ".2f", "x") for c in ("speedup_1", "speedup_16"))
    text = (f"On MoE models at one user and 1K ({len(one)} cells, one chip), the kernel reads {k1} of the measured "
            f"limit at one step a call and {k16} at {SEVERAL} steps a call; its speed-up over XLA's compiled step is "
            f"{s1} at one step and {s16} at {SEVERAL} ({len(both)} cells with both engines)")  # fmt: skip
    e1, e16 = (f"{100 * one[c].min():+.1f}% to {100 * one[c].max():+.1f}%" for c in ("model_error_1", "model_error_16"))
    text += (
        f"; the timing model (a step and its share of the call's measured fixed time) misses the kernel's rows by {e1} "
        "at one step a call and "
        f"{e16} at {SEVERAL}"
    )
    newest = layers.sort_values("steps_a_call").groupby("model").tail(1)
    said = [f"{r.model}'s {r.us_a_layer:.1f} us ({r.layers} layers, {r.steps_a_call} step{'s' * (r.steps_a_call > 1)} "
            "a call)" for r in newest.itertuples()]  # fmt: skip
    if said:
        text += "; each MoE layer takes past its bytes at the limit " + " and ".join(said)
    moved = [] if changes is None else [
        f"{r.model} from {r.fraction_was:.3f} (revision {r.revision_was}) to {r.fraction_is:.3f} (revision "
        f"{r.revision_is}{'' if r.timed_under == r.revision_is else f', timed again under {r.timed_under}'})"
        for r in changes.itertuples()
    ]  # fmt: skip
    if moved:
        text += f"; at {SEVERAL} steps a call the kernel's newest revision moved " + " and ".join(moved)
    return text + "."
