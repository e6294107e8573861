"""Progress: the one progress bar mk uses (tqdm's notebook widget when ipywidgets is installed, else plain
tqdm), and the progress lines of a long measurement (``Log``).

``tqdm.auto`` picks the widget inside Jupyter and, without ipywidgets, warns "IProgress not found" and
falls back to text; choosing here avoids that warning in every notebook run.
"""

from __future__ import annotations

import importlib.util
import sys
import time

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm import tqdm


class Log:
    """Progress lines on stderr, each with the seconds since the run began (``quiet``: none)."""

    def __init__(self, quiet: bool = False):
        self.t0, self.quiet = time.perf_counter(), quiet

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{self.elapsed():7.1f} s] {msg}", file=sys.stderr, flush=True)


__all__ = ["Log", "tqdm"]
