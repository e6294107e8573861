"""Measuring a decode step: one harness, three thin drivers, and the instruments' timed uses.

- ``loop``: the one timing loop (variants interleaved round by round) and its one stopping rule;
- ``harness``: the row schema every CSV of data/measured/ shares, the provenance and versions collector, the
  speed of light a row is set against, timing engines into rows (``time_engines``);
- ``steps``: a decode step as a call to time (``decode_call``, ``step_program``, ``op_by_op``);
- ``cpu``: ``python -m mk bench``, the step against this device's probed bandwidth (data/measured/bench.csv),
  and which data type a step streams fastest, relative (``dtype_table``);
- ``gpu``: ``python -m mk measure-gpu``, the reference beside transformers on one GPU (data/measured/gpu.csv);
- ``tpu``: ``python -m mk tpu-smoke``, the megakernel checked against and timed beside the reference on a TPU
  slice (data/measured/tpu.csv);
- on one TPU chip: ``chip_parity`` (every family's and format's parity), ``hbm`` (the chip's HBM read rate,
  data/measured/tpu_hbm.csv), ``on_chip`` (both engines' host and device steps by case and cell, chip 0 of a slice
  by its loopback stand-in), ``tpu_runs`` (``python -m mk tpu-measure``: the three, resumable);
- ``knockouts``: the step timed with each component switched off, and the seed's published table beside it;
- ``xla_cost``: XLA's own TPU cost model per component, compiled ahead of time;
- ``schedule``: the TPU compiler's own schedule of a kernel (its final VLIW bundles, read from libtpu's dump of an
  ahead-of-time compile) and the bundles one call issues, each loop body counted once a trip.

Submodules are imported by name (``from mk.measure import cpu``): the drivers pull in the engines they time.
"""
