"""Two general stacks, named apart. The workbook sets its megakernel against two stacks, and they are not one:

- **XLA's compiled step** of the plain-JAX reference (mk.reference under ``jax.jit``), the general stack a TPU user
  gets without a serving engine: **measured** on one TPU v5e chip, cell by cell beside the kernel (mk.analysis.answer);
- **a vLLM-like serving stack**: **modelled** (mk.timing's general stack: the same work cut into a kernel per weight
  matrix, grouped GEMM and vector op, nothing in flight across kernels, and a fixed cost a kernel fitted to one
  published vLLM number: on TPUs, vLLM's fraction of the speed of light for Gemma 4 31B on a v5e-8).

Where both speak to the same model, context and users on the same TPU, :func:`stacks_on_chip` shows them side by side
and :func:`stacks_sentence` says, computed, whether the modelled stack's gap agrees with what the chip measured.
"""

from __future__ import annotations

import pandas as pd

from ..chips import get_chip, measured_limit
from ..timing import constant, kernel_cost
from .answer import measured_answer, value_range

XLA_STACK = "XLA's compiled step (measured on one TPU v5e)"
# The verdict rows one chip can measure: (key, the cell of the measured answer that speaks to it: base model, cut,
# context, users). The dense same-TPU row is its model's first sliding and full layer on one chip; the small model's
# is Llama 3.2 1B whole at 1K (the verdict's own setting is a 32-token prompt and 128 generated).
MEASURABLE_VERDICTS = {
    "verdict_dense_same_tpu": ("gemma4-31b", "sliding+full", 1024, 1),
    "verdict_small_model": ("llama-3.2-1b", "all", 1024, 1),
}


def vllm_like_words(kind: str = "tpu") -> str:
    """The modelled serving stack in words, with its fitted constant (``kind``: the chips it is fitted for)."""
    c = constant("kernel_s", kind)
    return (f"a vLLM-like serving stack (modelled: mk.timing's general stack, {kernel_cost(kind) * 1e6:.2f} us a "
            f"kernel on {kind.upper()}s, fitted to {c.fit_to})")  # fmt: skip


def measured_verdicts(answer: pd.DataFrame | None = None) -> pd.DataFrame:
    """The verdict rows one chip measured (:data:`MEASURABLE_VERDICTS`): key, the measured speed-up and what it was
    measured against, for mk.analysis.verdict.verdict_table's ``measured``."""
    a = measured_answer() if answer is None else answer
    rows = []
    for key, (model, layers, context, batch) in MEASURABLE_VERDICTS.items():
        cell = a[(a.base_model == model) & (a.layers == layers) & (a.context == context) & (a.batch == batch)
                 & (a.dtype == "bf16")]  # fmt: skip
        if len(cell):
            r = cell.iloc[0]
            rows.append(dict(key=key, speedup=r.speedup, measured_against=(
                f"{XLA_STACK}: {r.model}, {context} positions, {batch} user(s), {r.date}; not vLLM")))  # fmt: skip
    return pd.DataFrame(rows, columns=["key", "speedup", "measured_against"])


def stacks_on_chip(rule: pd.DataFrame, answer: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each same-TPU case of the rule of thumb (mk.analysis.verdict.rule_of_thumb) that the chip measured at its
    context and users (bf16): the vLLM-like stack's modelled fraction of the measured limit and the kernel's modelled
    speed-up over it, beside XLA's measured fraction of the limit and the kernel's measured speed-up over XLA (their
    ranges over the model's measured cuts). The model's fraction of the speed of light (at the data sheet's bandwidth)
    is carried to the measured limit's, so both columns have one denominator."""
    a = measured_answer() if answer is None else answer
    a = a[a.dtype == "bf16"]
    rows = []
    for r in rule[rule.same_hardware].itertuples():
        cells = a[(a.base_model == r.model) & (a.context == r.context) & (a.batch == r.batch)]
        if cells.empty:
            continue
        chip = r.general_on.split(" ")[0]
        to_limit = get_chip(chip).per_chip_bandwidth / measured_limit(chip).bandwidth
        rows.append(dict(
            model=r.model, context=r.context, batch=r.batch,
            vllm_like_fraction_of_limit=r.general_fraction_of_sol * to_limit, modelled_speedup=r.speedup,
            xla_min_fraction_of_limit=cells.xla_fraction_of_limit.min(),
            xla_max_fraction_of_limit=cells.xla_fraction_of_limit.max(),
            measured_min_speedup=cells.speedup.min(), measured_max_speedup=cells.speedup.max(),
            measured_cuts=", ".join(sorted(cells.model)), megakernel_setup=r.megakernel_setup,
        ))  # fmt: skip
    kind = "modelled (vLLM-like stack, mk.timing) vs measured (XLA on one TPU v5e)"
    return pd.DataFrame(rows).assign(kind=kind)


def stacks_sentence(t: pd.DataFrame) -> str:
    """Per model of :func:`stacks_on_chip`, at its fewest users and shortest context: the modelled stack's fraction of
    the limit and the kernel's modelled win over it, against XLA's measured fraction and the measured win, and whether
    the modelled win lies inside, above or below the measured range."""
    if t.empty:
        return "No case of the rule of thumb was measured on the chip."
    out = []
    for model, g in t.groupby("model", sort=False):
        r = g.sort_values(["batch", "context"]).iloc[0]
        lo, hi = r.measured_min_speedup, r.measured_max_speedup
        where = "inside" if lo <= r.modelled_speedup <= hi else "above" if r.modelled_speedup > hi else "below"
        measured, xla = (
            value_range(lo, hi, ".2f", "x"),
            value_range(r.xla_min_fraction_of_limit, r.xla_max_fraction_of_limit, ".2f"),
        )
        out.append(
            f"{model} at {r.context:,} positions, {r.batch} user(s): the vLLM-like stack is modelled at "
            f"{r.vllm_like_fraction_of_limit:.2f} of the measured limit and the kernel {r.modelled_speedup:.2f}x "
            f"faster; on the chip XLA reads {xla} of it "
            f"and the kernel is {measured} faster ({r.measured_cuts}): the modelled win is {where} the measured range"
        )
    return "; ".join(out) + "."
