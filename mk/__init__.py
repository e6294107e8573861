"""mk: a research workbook on decode megakernels for Gemma 4."""

__version__ = "0.1.0"
