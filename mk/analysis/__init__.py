"""Every table a notebook shows, one module per subject, each computed from the layers below (the timing model,
the speed of light, the published numbers, the measurements) with a ``kind`` column saying what its numbers are.
``mk.views`` draws them: ``views/X`` draws what ``analysis/X`` computes.

- ``allreduce``: the in-kernel all-reduce priced from the plans, and the step after each fix of the kernel setup;
- ``claims``: the write-up's claims beside the workbook's values (the report opens with it);
- ``independent``: the timing model against independent published measurements (data/independent.csv);
- ``knockouts``: the write-up's component table, modelled;
- ``quality``: what INT8 weights cost in logits and greedy tokens;
- ``straggler``: the busiest chip of a whole-expert placement, exact, sampled and measured, and what it costs;
- ``sweeps``: modelled tokens/s against context, batch, placement, attention split, drafts and chip;
- ``verdict``: the timing model against the write-up's numbers, and its verdict computed.
"""
