"""Figures (plotly) that the notebooks show, apart from the computations they show: each module here draws
tables that mk's lower layers compute, and nothing below this package imports plotly."""
