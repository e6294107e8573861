"""Where mk's files live: the repository's folders and data files, named once.

The workbook's outputs (figures, tables, the report, executed notebooks) go to ``figures/`` and ``build/``
unless a caller names another folder: ``ci/run_notebooks.py --out/--figures``, and for figures and tables
written inside a notebook's kernel the environment variable ``MK_FIGURES_DIR`` (:func:`figures_dir`), which
the runner sets for its notebooks (the tests name temporary folders)."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MK_DIR = ROOT / "mk"  # the package's source: a measured row carries its digest (mk.files.source_digest)
KERNEL_DIR = MK_DIR / "megakernel"  # the megakernel's code: each revision's digests in data/kernel_revisions.csv
NOTEBOOKS_DIR = ROOT / "notebooks"
FIGURES_DIR = ROOT / "figures"  # figures (HTML + PNG), exported tables, the report page
BUILD_DIR = ROOT / "build"  # executed notebooks
FIGURES_ENV = "MK_FIGURES_DIR"  # overrides FIGURES_DIR; an environment variable reaches the notebooks' kernels

DATA_DIR = ROOT / "data"
CHIPS_CSV = DATA_DIR / "chips.csv"  # chip and slice specs, each with its source
SLICES_CSV = DATA_DIR / "slices.csv"  # the slice shapes each TPU is documented to come in, with their hosts
TIMING_CSV = DATA_DIR / "timing.csv"  # the timing model's constants, each with its source and kind
PUBLISHED_CSV = DATA_DIR / "published.csv"  # the write-up's numbers
INDEPENDENT_CSV = DATA_DIR / "independent.csv"  # independent published decode measurements
RELEASED_FORMATS_CSV = DATA_DIR / "released_formats.csv"  # the format each big model's weights are released in
CONFIGS_DIR = DATA_DIR / "configs"  # full-size config.json of other decoders, each as its authors published it
MEASURED_DIR = DATA_DIR / "measured"  # rows measured by this code, each with its provenance
BENCH_CSV = MEASURED_DIR / "bench.csv"  # the CPU bench
GPU_CSV = MEASURED_DIR / "gpu.csv"  # the reference beside transformers on one GPU
TPU_CSV = MEASURED_DIR / "tpu.csv"  # the megakernel beside the reference on a TPU slice
TPU_OPS_CSV = MEASURED_DIR / "tpu_ops.csv"  # the longest ops of profiled TPU steps (mk.measure.on_chip)
TPU_HBM_CSV = MEASURED_DIR / "tpu_hbm.csv"  # a TPU chip's HBM read rate, by method and size (mk.measure.hbm)
TPU_LOGS_DIR = MEASURED_DIR / "tpu_logs"  # one-off runs on a TPU: each one's script, output and CSV side by side
TPU_CLOCK_CSV = MEASURED_DIR / "tpu_clock.csv"  # a TPU core's bundles a second by kind of work (mk.measure.chip_clock)
TPU_DMA_CSV = MEASURED_DIR / "tpu_dma.csv"  # one copy from HBM alone, start to wait, by size (mk.measure.dma_latency)
TPU_COPIES_CSV = MEASURED_DIR / "tpu_copies.csv"  # a kernel beside its copies alone (mk.measure.copies_alone)
KERNEL_REVISIONS_CSV = DATA_DIR / "kernel_revisions.csv"  # each revision of the megakernel's code, what changed
SCHEDULE_DIR = DATA_DIR / "schedule"  # the TPU compiler's schedule of the megakernel, one CSV a plan and libtpu


def figures_dir() -> Path:
    """The folder figures, exported tables and the report are written to: $MK_FIGURES_DIR when set, else
    FIGURES_DIR. Read at each write, so a runner or a test can point a whole notebook run elsewhere."""
    return Path(os.environ.get(FIGURES_ENV) or FIGURES_DIR)
