"""Writing files so that nothing half-written is ever left behind, the commit they were written from, and the digest
of the code that wrote them."""

from __future__ import annotations

import csv
import hashlib
import os
import subprocess
from pathlib import Path
from typing import Callable

from .paths import MK_DIR, ROOT


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


DIGEST_HEX = 16  # hex digits a digest keeps: 64 bits, no collision among a project's trees and programs


def text_digest(text: str) -> str:
    """The first DIGEST_HEX hex digits of ``text``'s SHA-256: the one way mk digests a program's printed text."""
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_HEX]


def _digest_files(files: list[tuple[str, bytes]]) -> str:
    """SHA-256 over (relative path, size, bytes) of each file, in the order of their paths: a file renamed, added or
    removed changes it as an edit does."""
    h = hashlib.sha256()
    for rel, data in sorted(files):
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:DIGEST_HEX]


def source_digest(folder: Path = MK_DIR, commit: str | None = None) -> str | None:
    """The digest of every ``*.py`` file under ``folder`` (its path relative to ``folder`` and its bytes; caches and
    other files left out), read from the disk: the code a process on this machine runs, whatever ``$MK_COMMIT`` says
    and whether or not a .git came with the tree. A few milliseconds for mk/ (1.4 MB), so each run computes it where
    it runs, never carries it from elsewhere.

    With ``commit``, the same digest of the files git holds under ``folder`` at that commit (None where git or the
    commit is not here): a row's recorded digest set against the commit it names says whether the tree that ran was
    that commit's (a dirty or mislabelled copy is not)."""
    folder = Path(folder)
    if commit is None:
        return _digest_files([(p.relative_to(folder).as_posix(), p.read_bytes()) for p in folder.rglob("*.py")])
    try:
        run = dict(cwd=folder, capture_output=True, timeout=60, check=True)
        # paths relative to ``folder`` (ls-tree's own, from the directory it runs in)
        listing = subprocess.run(["git", "ls-tree", "-r", "-z", commit, "--", "."], **run).stdout.decode()
        blobs = [(line.split("\t", 1)[1], line.split()[2]) for line in listing.split("\0") if line]
        blobs = [(path, sha) for path, sha in blobs if path.endswith(".py")]
        batch = subprocess.run(["git", "cat-file", "--batch"], input="\n".join(s for _, s in blobs).encode(), **run)
    except (OSError, subprocess.SubprocessError):
        return None
    out, at, files = batch.stdout, 0, []
    for rel, _ in blobs:  # each blob: "<sha> blob <size>\n<bytes>\n"
        header_end = out.index(b"\n", at)
        size = int(out[at:header_end].split()[2])
        files.append((rel, out[header_end + 1 : header_end + 1 + size]))
        at = header_end + 1 + size + 1
    return _digest_files(files)
