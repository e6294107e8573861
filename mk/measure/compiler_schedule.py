"""The megakernel's step as libtpu's compiler schedules it: ``python -m mk schedule``.

A plan's kernel is compiled ahead of time twice in child processes (mk.measure.bundles): as it runs, and with its
named scopes kept as trace marks (each item's code is a scope, mk.plan.item_scope). Both compiles have the same loops
and skippable stretches in the same order; the scoped one says what each is:

- a loop whose bound is a constant runs that many times; a loop inside an ``Attend.<type>`` scope whose bound is not
  (a user's loop over the KV tiles its position reaches) runs ``kv_tiles.<type>`` times, which mk.timing.scheduled
  evaluates at the plan's context; any other loop without a constant bound is refused;
- code inside a ``Routed`` scope that a branch can skip (an expert slot's work) runs the ``routed`` share of the
  time; other skippable code is counted as run.

The rows (mk.timing.scheduled.COLUMNS) go to data/schedule/ under the plan's code fingerprint, the kernel's revision
(data/kernel_revisions.csv) and libtpu's version.
"""

from __future__ import annotations

import datetime
import pickle
import tempfile
import time
from pathlib import Path

import pandas as pd

from ..chips import get_chip
from ..config import LAYER_PAIR, with_layers
from ..files import git_commit
from ..format_trees import FORMAT_SCHEMES
from ..kernel_setup import SETUPS
from ..megakernel.aot import program_digest
from ..megakernel.kernel import kernel_name
from ..params import KNOCKOUTS, SHARED_MLP
from ..plan import ROUTED, StepPlan
from ..timing import named_plan, scheduled_pace
from ..timing.scheduled import (
    COLUMNS,
    KV_TILES,
    OTHER,
    PLAIN,
    SCOPED,
    STEP,
    kernel_revision,
    schedule_file,
    stored_rows,
)
from ..tpu import libtpu_version
from .bundles import Bundle, final_bundles, find_loops, find_skips, issued, parse_bundles, scope_stacks

_COMPILE = """
import pickle
from mk.megakernel.aot import compile_plan
with open({path!r}, "rb") as f:
    plan = pickle.load(f)
compile_plan(plan, {chip!r})
"""


def _flat(loops) -> list:
    out = []
    for lp in loops:
        out.append(lp)
        out.extend(_flat(lp.inner))
    return out


def _factors(scoped: list[Bundle]) -> tuple[list, list]:
    """For each loop of the scoped compile (in order): its constant bound or the factor it runs by; for each
    skippable stretch: None (counted as run) or the factor it runs by."""
    stacks = scope_stacks(scoped)
    trips = []
    for lp in _flat(find_loops(scoped)):
        if lp.trips is not None:
            trips.append(lp.trips)
            continue
        attend = [s for s in stacks[lp.start] if s.startswith("Attend.")]
        if not attend:
            raise ValueError(
                f"a loop without a constant bound at bundle {scoped[lp.start].address:#x} in scopes "
                f"{stacks[lp.start]}: only a user's loop over KV tiles (in an Attend scope) is known"
            )
        trips.append(KV_TILES + attend[-1].split(".", 1)[1])
    shares = [ROUTED if ROUTED in stacks[sk.branch] else None for sk in find_skips(scoped)]
    return trips, shares


def _counts(bundles: list[Bundle], trips: list, shares: list, what: str) -> list:
    loops, skips = _flat(find_loops(bundles)), find_skips(bundles)
    if len(loops) != len(trips) or len(skips) != len(shares):
        raise ValueError(
            f"the {what} compile has {len(loops)} loops and {len(skips)} skippable stretches, the scoped one "
            f"{len(trips)} and {len(shares)}: they cannot be matched"
        )
    for lp, t in zip(loops, trips):
        if isinstance(t, int) and lp.trips != t:
            raise ValueError(f"the {what} compile's loop at bundle {bundles[lp.start].address:#x} runs {lp.trips} "
                             f"times, the scoped one's {t}: they cannot be matched")  # fmt: skip
    by_loop = {lp.start: t for lp, t in zip(loops, trips)}
    by_skip = {sk.branch: s for sk, s in zip(skips, shares)}
    return issued(bundles, lambda lp: by_loop[lp.start], lambda sk: by_skip[sk.branch])


def _rows(counts, scopes, compile_: str) -> list[dict]:
    agg: dict[tuple[str, str], float] = {}
    for (c, factors), scope in zip(counts, scopes):
        if c:
            key = (scope, "*".join(factors))
            agg[key] = agg.get(key, 0.0) + c
    return [dict(compile=compile_, scope=s, factors=f, bundles=b) for (s, f), b in sorted(agg.items())]


def compile_schedule(plan: StepPlan, chip: str, plain: bool = True) -> pd.DataFrame:
    """The rows of ``plan``'s schedule on ``chip`` (a chip, or the slice its setup splits the step over), compiled now
    in two child processes (a whole model takes a minute or two); ``plain=False``: the scoped compile's rows only."""
    with tempfile.TemporaryDirectory(prefix="mk-plan-") as d:
        path = Path(d) / "plan.pickle"
        path.write_bytes(pickle.dumps(plan))
        code = _COMPILE.format(path=str(path), chip=chip)
        t0 = time.perf_counter()
        scoped = parse_bundles(final_bundles(code, kernel_name(plan), scopes=True))
        as_run = parse_bundles(final_bundles(code, kernel_name(plan))) if plain else None
        seconds = time.perf_counter() - t0
    trips, shares = _factors(scoped)
    stacks = scope_stacks(scoped)
    rows = _rows(_counts(scoped, trips, shares, SCOPED), [s[0] if s else OTHER for s in stacks], SCOPED)
    if as_run is not None:
        rows += _rows(_counts(as_run, trips, shares, PLAIN), [STEP] * len(as_run), PLAIN)
    import jax

    common = dict(
        plan=plan.code_fingerprint,
        libtpu=libtpu_version(),
        model=plan.model.name,
        chip=chip,
        context=plan.context,
        batch=plan.users,
        setup=plan.setup.name if plan.setup is not None else "one chip",
        revision=kernel_revision(),
        compile_s=round(seconds, 1),
        date=datetime.date.today().isoformat(),
        commit=git_commit(),
        jax=jax.__version__,
        program=program_digest(plan, chip),
    )
    return pd.DataFrame([dict(common, **r) for r in rows], columns=list(COLUMNS))


def carried_rows(plan: StepPlan, chip: str) -> pd.DataFrame | None:
    """An earlier kernel revision's stored rows of ``plan`` whose traced program is this tree's (the compiler is handed
    the same program, so it schedules it alike), as this tree's revision's; None where no revision's program is."""
    program, now = program_digest(plan, chip), kernel_revision()
    for rev in range(now - 1, 0, -1):
        rows = stored_rows(plan, revision=rev)
        if rows is not None and (rows["program"] == program).all():
            return rows.assign(revision=now)
    return None


def store(rows: pd.DataFrame, plan: StepPlan, folder: Path | None = None) -> Path:
    """Write a plan's rows to data/schedule/ (or ``folder``), whole, under a temporary name renamed over the old."""
    path = schedule_file(plan, str(rows["libtpu"].iloc[0]), folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    rows.to_csv(tmp, index=False)
    tmp.replace(path)
    return path


# The plans whose schedules are kept in data/schedule/ (python -m mk schedule --refresh compiles them all): a small
# case a test compiles again, the published points the timing model is tested against (the write-up's kernel and its
# fixes, its knock-outs, INT8 experts, the shipped formats, eight users, 8K; the dense model; a small one) and the
# workbook's kernel at the contexts and users its notebooks show. (model, chip, context, users, setup, dtype,
# components knocked out)
# The rows of an earlier kernel revision are kept only where notebooks 05 and 11 compare revisions: the tiny-moe
# cases, and gemma4-26b-a4b's workbook kernel at 1K and 128K for 1 and 8 users and the write-up's at 1K.
_MOE, _DENSE, _SLICE = "gemma4-26b-a4b", "gemma4-31b", "tpu-v5e-8"
_OSS_PAIR = with_layers("gpt-oss-20b", 2)
_MOE_ONE_USER = tuple(with_layers(m, n) for m, n in ((_MOE, LAYER_PAIR), (_MOE, 7), ("qwen3-30b-a3b", 8),
                                                     ("mixtral-8x7b", 2)))  # fmt: skip
FIX_NAMES = [name for name in SETUPS if name != "users-split"]  # (a) .. (g), the write-up's fixes and the workbook's
STORED_CASES = (
    ("tiny-moe", "tpu-v5e", 256, 1, "workbook", "bf16", ()),
    ("tiny-moe", "tpu-v5e", 1024, 1, "workbook", "bf16", ()),  # notebook 11's CPU defaults
    ("tiny-moe", "tpu-v5e", 1024, 4, "workbook", "bf16", ()),
    ("llama-3.2-1b", "tpu-v5e", 1024, 1, "workbook", "bf16", ()),
    ("llama-3.2-1b", _SLICE, 1024, 1, "write-up", "bf16", ()),
    *((_MOE, _SLICE, 1024, 1, setup, "bf16", ()) for setup in FIX_NAMES),
    *((_MOE, _SLICE, 1024, 1, "write-up", "bf16", (c,)) for c in KNOCKOUTS if c != SHARED_MLP),
    (_MOE, _SLICE, 1024, 1, "write-up", "int8-experts", ()),
    *((_MOE, _SLICE, 1024, 1, "write-up", fmt, ()) for fmt in FORMAT_SCHEMES),  # as big models ship
    # the formats' step the v5e timed (notebook 12): gpt-oss-20b's first two layers on one chip
    *((_OSS_PAIR, "tpu-v5e", 1024, 1, "workbook", dtype, ()) for dtype in ("bf16", "mxfp4", "int4")),
    # the MoE cells timed at one user on one chip (notebook 12: where their stream waits, mk.analysis.stream_waits)
    *((cfg, "tpu-v5e", 1024, 1, "workbook", "bf16", ()) for cfg in _MOE_ONE_USER),
    (_MOE, _SLICE, 1024, 8, "write-up", "bf16", ()),
    (_MOE, _SLICE, 8192, 1, "write-up", "bf16", ()),
    (_MOE, _SLICE, 1024, 8, "workbook", "bf16", ()),
    (_MOE, _SLICE, 131072, 1, "workbook", "bf16", ()),
    (_MOE, _SLICE, 131072, 8, "workbook", "bf16", ()),
    (_DENSE, _SLICE, 1024, 1, "write-up", "bf16", ()),
    (_DENSE, _SLICE, 1024, 1, "workbook", "bf16", ()),
)


def schedule_for(plan: StepPlan, chip: str, stored: bool = False, keep: bool = False, folder: Path | None = None):
    """``plan``'s ScheduledStep on ``chip``: compiled now (``keep``: its rows stored too), or ``stored`` ones read.
    Raises RuntimeError without libtpu (when compiling) and LookupError without stored rows (when reading)."""
    c = get_chip(chip)
    if stored:
        return scheduled_pace(plan, c, folder=folder)
    if c.kind != "tpu":
        raise ValueError(f"{chip} is not a TPU: the schedule is libtpu's")
    rows = compile_schedule(plan, chip)
    if keep:
        store(rows, plan, folder)
    return scheduled_pace(plan, c, rows)


def refresh(missing: bool = False):
    """Compile and store every case of :data:`STORED_CASES` for the kernel in this tree (``missing``: only those
    data/schedule lacks, each carried over from an earlier revision where its traced program is unchanged, else
    compiled), yielding each case and its step's bundles as it is stored (a whole model takes minutes to compile)."""
    for case in STORED_CASES:
        plan = named_plan(*case)
        if missing and stored_rows(plan) is not None:
            continue
        carried = carried_rows(plan, case[1]) if missing else None
        if carried is not None:
            store(carried, plan)
            yield case, scheduled_pace(plan, get_chip(case[1]), carried).bundles
        else:
            yield case, schedule_for(plan, case[1], keep=True).bundles


def text(d: dict) -> str:
    """A ScheduledStep's ``to_dict()`` as ``python -m mk schedule`` prints it: the step, then one line per op kind."""
    lines = [
        f"{d['model']} on {d['chip']}, context {d['context']}, batch {d['batch']}: {d['kind']} (libtpu {d['libtpu']}, "
        f"plan {d['plan']})",
        f"  bundles/step  {d['bundles_per_step']:12,.0f}   at {d['clock_hz'] / 1e9:.3f} GHz (derived: data/chips.csv)",
        f"  compute       {d['compute_ms']:12.4f} ms   issued bundles at {d['bundle_rates']}",
        f"  HBM           {d['hbm_ms']:12.4f} ms   the step's bytes over the chip's bandwidth",
        f"  {'op kind (scope)':<30}{'count':>9}{'bundles':>12}{'each':>10}{'ns each':>10}",
    ]
    lines += [
        f"  {o['kind']:<30}{o['count'] or 0:9.1f}{o['bundles']:12,.0f}{o['bundles_each']:10.1f}{o['ns_each']:10.1f}"
        for o in d["ops"]
    ]
    return "\n".join(lines)
