"""The one progress bar mk uses: tqdm's notebook widget when ipywidgets is installed, else plain tqdm.

``tqdm.auto`` picks the widget inside Jupyter and, without ipywidgets, warns "IProgress not found" and
falls back to text; choosing here avoids that warning in every notebook run.
"""

from __future__ import annotations

import importlib.util

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm import tqdm

__all__ = ["tqdm"]
