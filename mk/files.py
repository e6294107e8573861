"""Writing files so that nothing half-written is ever left behind."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable


def write_atomic(dest: Path, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` on a temporary name beside ``dest``, then rename it over ``dest``: a crash
    leaves the old file (or none), never a torn one, and the temporary file is removed on failure."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.partial")
    try:
        write(tmp)
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
