"""Writing files so that nothing half-written is ever left behind, and the commit they were written from."""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path
from typing import Callable

from .paths import ROOT


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


def append_csv_rows(rows: list[dict], path: Path, columns: tuple[str, ...], what: str = "a row") -> Path:
    """Append ``rows`` (each with exactly ``columns``; None and NaN written empty) to the CSV at ``path``
    atomically: the whole file is rewritten under a temporary name and renamed over the old one, the header
    with the first rows. A file with other columns is refused (it was written by another version of mk)."""
    path = Path(path)
    for row in rows:
        missing = [c for c in columns if c not in row]
        extra = [c for c in row if c not in columns]
        if missing or extra:
            raise ValueError(f"{what} needs exactly the columns {columns}; missing {missing}, unexpected {extra}")
    old = []
    if path.exists():
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            if tuple(reader.fieldnames or ()) != tuple(columns):
                raise ValueError(
                    f"{path} has columns {reader.fieldnames}, expected {list(columns)}: "
                    "move the old file aside (it was written by another version of mk)"
                )
            old = list(reader)

    def blank(v):
        return "" if v is None or (isinstance(v, float) and v != v) else v

    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")  # as git and pandas write them
            w.writeheader()
            w.writerows(old)
            w.writerows([{k: blank(v) for k, v in r.items()} for r in rows])
            f.flush()
            os.fsync(f.fileno())

    return write_atomic(path, write)


COMMIT_ENV = "MK_COMMIT"  # the commit a copy of the tree without its .git was made from, as its sender states it


def git_commit(root: Path = ROOT) -> str | None:
    """The checkout's commit (short), marked when the working tree has uncommitted changes; None without git, or where
    ``root`` is no checkout of its own (a copy inside another repository would otherwise take that one's commit),
    unless ``$MK_COMMIT`` names the commit the copy was made from (said so)."""
    if os.environ.get(COMMIT_ENV):
        return f"{os.environ[COMMIT_ENV][:12]} (a copy, as ${COMMIT_ENV} states)"
    try:
        run = dict(cwd=root, capture_output=True, text=True, timeout=10, check=True)
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], **run).stdout.strip()
        if Path(top).resolve() != Path(root).resolve():
            return None
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], **run).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], **run).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{sha} (with uncommitted changes)" if dirty else sha
