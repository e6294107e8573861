"""Models past one host: each big model in the format it is released in, on the smallest documented slice of a TPU
that holds it, the megakernel against the general stack there (both modelled by mk.timing, the megakernel as it is
charged past one host: the slice's torus, whole experts over hosts), and the write-up's Kimi rows beside their
stand-in's numbers."""

from __future__ import annotations

import math
from dataclasses import replace

import pandas as pd

from ..chips import get_chip, slice_shape
from ..config import get_config
from ..kernel_setup import LATENT_DOWN
from ..published import bound_words, published_table
from ..timing import MODELLED
from .claims import speculative_stand_in
from .verdict import BIG_VERDICTS, big_model_cases, big_verdicts


def pod_table(models, batches=(1, 8), context: int = 1024) -> pd.DataFrame:
    """Each model in its released format (data/released_formats.csv) at each batch, on the smallest documented v5e
    slice holding its weights and that batch's caches (mk.analysis.verdict.big_model_cases): the megakernel's and the
    general stack's tokens/s per user, the speed-up, the megakernel's step, its time on the links between chips and
    that time's share of the step, and its fraction of the slice's speed of light."""
    rows = []
    for model in models:
        for batch in batches:
            mk_case, gen_case = big_model_cases(model, batch, context)
            m, g = mk_case.predict(), gen_case.predict()
            shape = slice_shape(get_chip(mk_case.chip))
            links_s = m.pacing.ici_s if m.pacing else 0.0
            rows.append(
                dict(
                    model=model, format=mk_case.dtype, chip=mk_case.chip, topology=shape.topology if shape else "",
                    hosts=shape.hosts if shape else math.nan, users=batch, megakernel_tokens_per_s=m.tokens_per_s,
                    general_tokens_per_s=g.tokens_per_s, speedup=m.tokens_per_s / g.tokens_per_s,
                    step_ms=m.step_s * 1e3, links_ms=links_s * 1e3, links_share=links_s / m.step_s,
                    fraction_of_sol=m.fraction_of_sol, setup=m.setup, op_costs=m.op_costs,
                )
            )  # fmt: skip
    return pd.DataFrame(rows).assign(kind=MODELLED)


def latent_down_table(models, batches=(1, 8), context: int = 1024) -> pd.DataFrame:
    """MLA's down-projections (q_a, kv_a) over a big model's slice (:func:`pod_table`'s), split by rows where that
    reads fewer bytes a chip (the default) or whole on every chip (``KernelSetup.latent_down``): the bytes a chip
    reads a step, the time on the links between chips, the step and the speed-up over the general stack, each way;
    a model without MLA is left out."""
    rows = []
    for model in models:
        if get_config(model).latent_attention is None:
            continue
        for batch in batches:
            mk_case, gen_case = big_model_cases(model, batch, context)
            general = gen_case.predict().tokens_per_s
            for down in LATENT_DOWN:
                case = replace(mk_case, setup=mk_case.setup.but(latent_down=down))
                m = case.predict()
                links_s = m.pacing.ici_s if m.pacing else 0.0
                rows.append(
                    dict(
                        model=model, format=case.dtype, chip=case.chip, users=batch, down_projections=down,
                        weight_GB_per_chip=case.plan().weight_bytes / 1e9, links_ms=links_s * 1e3,
                        step_ms=m.step_s * 1e3, speedup=m.tokens_per_s / general,
                    )
                )  # fmt: skip
    return pd.DataFrame(rows).assign(kind=MODELLED)


def stand_in_rows() -> pd.DataFrame:
    """The write-up's Kimi rows (Inferact's figures, for a model whose config is not published): each published value
    beside its stand-in's modelled one (mk.analysis.verdict.big_verdicts, mk.analysis.claims.speculative_stand_in),
    the error, how it is compared (a value, or a published lower bound met or not) and what was modelled in words."""
    pub = published_table().set_index("key")
    verdicts = big_verdicts().set_index("key")
    rows = []
    for key, _, _ in BIG_VERDICTS:
        r = verdicts.loc[key]
        what = f"speed-up over the general stack ({r.megakernel} against {r.general}); beside it {r.beside}"
        rows.append(dict(key=key, situation=r.situation, published=r.published, modelled=r.modelled, unit="x",
                         error=r.error, compared_as="a value", modelled_as=what))  # fmt: skip
    for key in pub.index[pub.quantity == "tokens_per_s_lower_bound"]:
        value, words, _ = speculative_stand_in(pub.loc[key])
        published = float(pub.loc[key, "value"])
        error = value / published - 1  # "over 700 tok/s": a lower bound
        rows.append(dict(key=key, situation=f"speculative decoding fused in (over {published:g} tok/s published)",
                         published=published, modelled=value, unit="tok/s", error=error,
                         compared_as=f"a lower bound: {bound_words(error)}", modelled_as=words))  # fmt: skip
    return pd.DataFrame(rows).assign(kind=f"published (the write-up; Inferact's figures) vs {MODELLED}")
