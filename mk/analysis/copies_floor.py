"""What a measured kernel step takes past its own copies: each cell's kernel beside its copies alone on the chip
(mk.measure.copies_alone: every weight tile and KV tile the step moves, started and waited where the kernel does, no
compute; both timed interleaved on the same weights, rows in data/measured/tpu_copies.csv).

- **The copies past the bytes** (``copies_past_bytes_us``): the copies' time less the step's bytes (mk.sol's, those its
  fraction of the limit is of) at the measured limit: what streaming these tiles costs the chip on top of the bytes
  (the layout's padding, what chip 0 of a slice reads whole where the slice splits the rest, a call's fixed time over
  its steps). ``copies_fraction``: the copies' own fraction of the limit, the best a kernel streaming these tiles in
  this order can reach.
- **The core past the copies** (``core_us``): the kernel's time less its copies': what its core adds (compute, the
  route, waits no copy needs), the part a schedule could still hide.
- **By component** (:func:`core_by_component`): each component knocked out in the kernel and in its copies alike, in
  one run; the core's time that component holds past its own copies is the kernel's shrink less the copies'.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..measure.copies_alone import COPIES
from ..measure.on_chip import tiles_words
from ..paths import TPU_COPIES_CSV, TPU_CSV
from ..plan import Tiles
from .on_tpu import cell_words, chip_rows

KIND = "measured (TPU, device time a token: the kernel beside its copies alone, interleaved)"
COLUMNS = ["cell", "model", "setup", "steps_a_call", "kernel_ms", "copies_ms", "bytes_ms", "copies_past_bytes_us",
           "core_us", "kernel_fraction", "copies_fraction", "kernel_revision", "date"]  # fmt: skip
KEYS = ["model", "setup", "steps_a_call", "date"]  # one run of a cell: its kernel and copies, interleaved


def copies_rows(path=None) -> pd.DataFrame:
    """data/measured/tpu_copies.csv (or ``path``), a TPU's rows, the knock-out column's blanks as "" (the whole
    step); empty where there is none."""
    path = Path(path or TPU_COPIES_CSV)
    rows = chip_rows(pd.read_csv(path)) if path.exists() else pd.DataFrame()
    return rows.assign(knockout=rows.knockout.fillna("")) if not rows.empty else rows


def _pairs(rows: pd.DataFrame) -> pd.DataFrame:
    """Each run's kernel and copies side by side: one row a (model, setup, steps a call, date, knock-out)."""
    wide = rows.pivot_table(index=[*KEYS, "knockout"], columns="engine", values="device_step_ms", aggfunc="first")
    meta = rows[rows.engine != COPIES].set_index([*KEYS, "knockout"])[["kernel_revision", "device_fraction_of_limit"]]
    return wide.rename(columns={"megakernel": "kernel_ms", COPIES: "copies_ms"}).join(meta).reset_index()


def copies_floor(rows: pd.DataFrame) -> pd.DataFrame:
    """Each cell's newest whole-step run (the module's docstring): its kernel's and its copies' time a token, the step's
    bytes at the measured limit, what the copies take past those bytes and what the kernel takes past its copies
    (microseconds), and the two fractions of the limit."""
    whole = _pairs(rows[rows.knockout == ""]).sort_values("date").groupby(["model", "setup", "steps_a_call"]).tail(1)
    bytes_ms = whole.device_fraction_of_limit * whole.kernel_ms
    out = whole.assign(
        cell=[
            cell_words(r.model, r.setup, "bf16")
            + "".join(f";{w}" for w in r.setup.split(";")[1:] if "stand-in" not in w)
            for r in whole.itertuples()
        ],  # fmt: skip
        bytes_ms=bytes_ms,
        copies_past_bytes_us=(whole.copies_ms - bytes_ms) * 1e3,
        core_us=(whole.kernel_ms - whole.copies_ms) * 1e3,
        kernel_fraction=whole.device_fraction_of_limit,
        copies_fraction=bytes_ms / whole.copies_ms,
    )
    return out[COLUMNS].sort_values("core_us", ascending=False).reset_index(drop=True).assign(kind=KIND)


BY_COMPONENT = ["model", "setup", "component", "part", "kernel_shrink_us", "copies_shrink_us", "core_us", "date"]
# a knock-out in words: what it switches off (mk.params.knocked_out: the route's wait goes with the router)
PART_WORDS = {"route_wait": "the router and the route's wait"}


def core_by_component(rows: pd.DataFrame) -> pd.DataFrame:
    """Each knocked-out component's run against the whole step of the same run: the kernel's shrink, the copies'
    shrink, and the core's time the component holds past its copies (the first less the second), microseconds a
    token."""
    pairs = _pairs(rows).set_index(KEYS)
    out = []
    for key, g in pairs.groupby(level=KEYS):
        whole = g[g.knockout == ""]
        if whole.empty:
            continue
        w = whole.iloc[0]
        for r in g[g.knockout != ""].itertuples():
            kernel, copies = (w.kernel_ms - r.kernel_ms) * 1e3, (w.copies_ms - r.copies_ms) * 1e3
            part = PART_WORDS.get(r.knockout, r.knockout.replace("_", " "))
            out.append(dict(model=key[0], setup=key[1], component=r.knockout, part=part, kernel_shrink_us=kernel,
                            copies_shrink_us=copies, core_us=kernel - copies, date=key[3]))  # fmt: skip
    table = pd.DataFrame(out, columns=BY_COMPONENT)
    return table.sort_values(["model", "core_us"], ascending=[True, False]).reset_index(drop=True).assign(kind=KIND)


# the kernel's switches as mk.measure.on_chip.tiles_words says each one on (a row's setup names it so)
SWITCHES = tuple(
    tiles_words(t).removeprefix("; ")
    for t in (Tiles(kv_ahead=True), Tiles(expert_bias_ahead=True), Tiles(weight_priority=1))
)


def switch_effect(words: str | tuple[str, ...] = SWITCHES, path=None) -> pd.DataFrame:
    """Kernel rows of data/measured/tpu.csv (or ``path``) whose setup holds the part ``; {words}`` (a kernel switch,
    as mk.measure.on_chip.tiles_words says it; a tuple: each switch in turn) against the row of the same run whose
    setup is the same but for that part (the default kernel, or the kernel with the other switches alone): each
    one's time a token, the change in microseconds and its fraction of the limit each way."""
    if not isinstance(words, str):
        return pd.concat([switch_effect(w, path) for w in words], ignore_index=True)
    path = Path(path or TPU_CSV)
    k = chip_rows(pd.read_csv(path)) if path.exists() else pd.DataFrame(columns=["engine", "setup"])
    k = k[k.engine == "megakernel"]
    out = []
    for r in k.itertuples():
        parts = [p.strip() for p in r.setup.split(";")]
        if words not in parts[1:]:
            continue
        without = "; ".join(p for p in parts if p != words)
        base = k[(k.setup == without) & (k.model == r.model) & (k.date == r.date) & (k.context == r.context)
                 & (k.batch == r.batch) & (k.steps_a_call == r.steps_a_call)]  # fmt: skip
        for b in base.itertuples():
            out.append(dict(model=r.model, setup=b.setup, context=r.context, batch=r.batch, steps_a_call=r.steps_a_call,
                            default_ms=b.device_step_ms, switched_ms=r.device_step_ms,
                            change_us=(r.device_step_ms - b.device_step_ms) * 1e3,
                            fraction_was=b.device_fraction_of_limit, fraction_is=r.device_fraction_of_limit,
                            kernel_revision=r.kernel_revision, date=r.date))  # fmt: skip
    return pd.DataFrame(out).assign(switch=words, kind=f"measured (TPU): the kernel with {words} against without")


def floor_sentence(table: pd.DataFrame, components: pd.DataFrame, switched: pd.DataFrame | None = None) -> str:
    """What the copies alone say, computed from :func:`copies_floor`, :func:`core_by_component` and a switch's
    :func:`switch_effect`."""
    if table.empty:
        return "No cell's kernel has been timed beside its copies alone (python -m mk tpu-measure --parts copies)."
    cells = "; ".join(
        f"{r.cell}: its copies {r.copies_fraction:.3f} of the limit ({r.copies_past_bytes_us:+.1f} us past "
        f"its bytes), the kernel {r.kernel_fraction:.3f} ({r.core_us:.1f} us past its copies)"
        for r in table.itertuples()
    )
    past, core = table.copies_past_bytes_us, table.core_us
    text = (
        f"Measured on one TPU v5e at {', '.join(str(int(n)) for n in sorted(set(table.steps_a_call)))} steps a call, "
        f"each cell's kernel beside its copies alone: {cells}. What stands between each kernel and its copies "
        f"({core.min():.1f}-{core.max():.1f} us a token) is its core's time not hidden behind them, which a schedule "
        f"can still remove; what stands between the copies and the bytes ({past.min():.1f}-{past.max():.1f} us: the "
        f"layout's padding, what chip 0 of a slice reads whole, a call's fixed time over its steps) no kernel "
        f"streaming these tiles in this layout removes."
    )
    for model, g in components.groupby("model"):
        parts = ", ".join(f"{r.part} {r.core_us:.1f}" for r in g.itertuples())
        text += f" Of {model}'s, each component's past its own copies (us a token): {parts}."
    if switched is not None and not switched.empty:
        text += " " + switch_sentence(switched)
    return text


def switch_sentence(switched: pd.DataFrame) -> str:
    """What each switch of :func:`switch_effect` did: in how many of the cells it was timed on the kernel was faster,
    the range of the change, and the cell it changed most."""
    out = []
    for switch, g in switched.groupby("switch", sort=False):
        most = g.loc[g.change_us.idxmin()]
        users = f"{int(most.batch)} user{'s' if most.batch > 1 else ''} at {int(most.context):,}"
        calls = f"{'/'.join(str(int(n)) for n in sorted(set(g.steps_a_call)))} steps a call"
        change = f"{g.change_us.min():+.1f} to {g.change_us.max():+.1f}" if len(g) > 1 else f"{most.change_us:+.1f}"
        out.append(
            f"With {switch}, the kernel was faster in {int((g.change_us < 0).sum())} of the {len(g)} cell"
            f"{'s' if len(g) > 1 else ''} timed against it without ({change} us a token, {calls}); most in "
            f"{most.model} ({most.setup}, {users}): {most.default_ms:.4g} -> {most.switched_ms:.4g} ms, "
            f"{most.fraction_was:.3f} -> {most.fraction_is:.3f} of the limit."
        )
    return " ".join(out)
