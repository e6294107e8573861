"""What a measured row says about the code that made it, computed where it ran (mk.files.source_digest, the kernel's
digest against data/kernel_revisions.csv, mk.measure.steps.traced_digest), whether the committed rows of
data/measured/ say it, and that the readers of those rows keep each to its own device."""

import csv
import re
import subprocess

import pandas as pd
import pytest

from mk.analysis import on_tpu
from mk.config import TINY_LLAMA
from mk.files import DIGEST_HEX, source_digest
from mk.measure.harness import DIGESTS_FROM
from mk.measure.steps import decode_call
from mk.paths import MEASURED_DIR, MK_DIR, TPU_CSV
from mk.reference import decode_step
from mk.timing.scheduled import (
    current_kernel,
    kernel_digest,
    kernel_revision,
    kernel_revisions,
    recorded_revision,
    revision_digests,
)
from mk.tpu import DEVICE_KINDS
from mk.weights import random_params

DIGEST = re.compile(f"[0-9a-f]{{{DIGEST_HEX}}}")
DATE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")
TPUS = {f"tpu: {kind}" for kind in DEVICE_KINDS}
CLEAN_COMMIT = re.compile(r"([0-9a-f]{7,40})( \(a copy, as \$MK_COMMIT states\))?")

# The committed rows that lack part of their provenance, by (file, date): what they lack. Nothing in the rows gives
# it back (the CPU bench's and the GPU run's were written before mk recorded jaxlib and the commit; the single-run
# bench, kept for what it replaced, before any of it), so it is left missing, not filled in.
GAPS = {
    ("bench-before-intervals.csv", "2026-11-29T22:59:24Z"): {"commit"},
    ("bench-before-intervals.csv", "2026-11-29T23:59:37Z"): {"commit"},
    ("bench-before-intervals.csv", "2026-11-30T00:00:37Z"): {"commit"},
    ("bench.csv", "2026-11-30T03:25:41Z"): {"commit", "jaxlib_version"},
    ("bench.csv", "2026-11-30T03:25:55Z"): {"commit", "jaxlib_version"},
    ("bench.csv", "2026-11-30T03:26:10Z"): {"commit", "jaxlib_version"},
    ("bench.csv", "2026-11-30T03:26:24Z"): {"commit", "jaxlib_version"},
    ("bench.csv", "2026-11-30T03:26:48Z"): {"commit", "jaxlib_version"},
    ("gpu.csv", "2026-12-01T00:42:05Z"): {"commit", "jaxlib_version"},
    # the first runs of a kernel's copies alone: their program went undigested (the copies' rows; the kernel's have it)
    **{
        ("tpu_copies.csv", f"2026-12-07T{t}Z"): {"program_digest"}
        for t in ("20:45:50", "20:48:02", "20:49:42", "21:00:32")
    },
}


def _blank(v) -> bool:
    return v is None or str(v).strip() == ""


def row_gaps(name: str, row: dict, columns: list[str]) -> set[str]:
    """What a committed row of data/measured/``name`` lacks of full provenance (the module's test says what that is)."""
    gaps = set()
    if not DATE.fullmatch(str(row.get("date", ""))):
        gaps.add("date")
    device = str(row.get("device", ""))
    if not re.fullmatch(r"(cpu|gpu|tpu): .+", device) or (name.startswith("tpu") and device not in TPUS):
        gaps.add("device")
    if "backend" in columns and row["backend"] != device.split(":")[0]:
        gaps.add("backend")
    for version in ("jax_version", "jaxlib_version"):
        if version == "jax_version" or version in columns:
            if _blank(row.get(version)) or row.get(version) == "none":
                gaps.add(version)
    if device in TPUS and (_blank(row.get("libtpu_version")) or row.get("libtpu_version") == "none"):
        gaps.add("libtpu_version")
    commit = row.get("commit")
    if _blank(commit) or commit == "unknown":
        gaps.add("commit")
    gaps |= _code_gaps(row, columns)
    return gaps


def _code_gaps(row: dict, columns: list[str]) -> set[str]:
    """A row's digests (required from DIGESTS_FROM on; a transformers step is no JAX program), the clean commit it names
    against the digest it computed, and its kernel revision against data/kernel_revisions.csv."""
    gaps = set()
    digests = ["code_digest", "kernel_digest"]
    if "program_digest" in columns and row.get("engine") != "transformers":
        digests.append("program_digest")
    if row["date"] >= DIGESTS_FROM:
        gaps |= {d for d in digests if not DIGEST.fullmatch(str(row.get(d) or ""))}
    clean = CLEAN_COMMIT.fullmatch(str(row.get("commit") or ""))
    if clean and not _blank(row.get("code_digest")):
        at_commit = source_digest(MK_DIR, clean.group(1))  # None where this checkout lacks the commit
        if at_commit is not None and at_commit != row["code_digest"]:
            gaps.add("commit (its code is not the commit's: mark it '(with uncommitted changes)')")
    if "kernel_revision" in columns:
        revision = pd.to_numeric(row["kernel_revision"], errors="coerce")
        if revision not in set(kernel_revisions().revision):
            gaps.add("kernel_revision")
        elif not _blank(row.get("kernel_digest")) and recorded_revision(row["kernel_digest"]) != revision:
            gaps.add("kernel_revision (not the one data/kernel_revisions.csv records for its kernel_digest)")
    return gaps


def test_every_committed_measured_row_has_full_provenance():
    """Full provenance, for every row of every CSV in data/measured/:

    - **when**: ``date``, ISO 8601 in UTC to the second;
    - **where**: ``device`` as mk.profiling.device_name writes it (``tpu: TPU v5 lite``, ``cpu: <model> (n cores)``),
      in the tpu_* files a TPU of mk.tpu.DEVICE_KINDS (every row of those is a chip's); ``backend`` the device's kind
      where the file has one;
    - **what software**: ``jax_version``, ``jaxlib_version`` where the file has the column, ``libtpu_version`` on a
      TPU (not "none");
    - **what code**: ``commit`` as git or ``$MK_COMMIT`` stated it (not blank, not "unknown"); from DIGESTS_FROM on,
      what the machine computed from the files that ran: ``code_digest`` and ``kernel_digest``, and ``program_digest``
      where the file has it (a step of transformers is no JAX program); a clean commit this checkout has must have
      the code digest the row computed (else the tree was not that commit's); ``kernel_revision`` where the file has
      it, one data/kernel_revisions.csv lists, and the one it records for the row's kernel digest.

    The rows of :data:`GAPS` lack what it says and nothing else; any other gap fails, and so does a listed one that is
    gone (the list says what is missing now). And digests, once a file's rows carry them, never stop."""
    found = {}
    for path in sorted(MEASURED_DIR.glob("*.csv")):
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            rows, columns = list(reader), list(reader.fieldnames)
        for row in rows:
            gaps = row_gaps(path.name, row, columns)
            if gaps:
                found.setdefault((path.name, row["date"]), set()).update(gaps)
        if "code_digest" in columns:
            dated = sorted((r["date"], not _blank(r["code_digest"])) for r in rows)
            first = next((i for i, (_, has) in enumerate(dated) if has), len(dated))
            assert all(has for _, has in dated[first:]), f"{path.name}: rows without digests after rows with them"
    assert found == GAPS


def test_a_rows_gaps_are_what_it_lacks():
    """The checker itself: a complete TPU row has no gaps; each missing or wrong piece is named."""
    columns = ["date", "device", "backend", "jax_version", "jaxlib_version", "libtpu_version", "commit", "code_digest",
               "kernel_digest", "program_digest", "engine", "kernel_revision"]  # fmt: skip
    good = dict(date=DIGESTS_FROM + "T00:00:00Z", device="tpu: TPU v5 lite", backend="tpu", jax_version="0.10.2",
                jaxlib_version="0.10.2", libtpu_version="0.0.42.1", commit="unknown", code_digest="0" * 16,
                kernel_digest=kernel_digest(), program_digest="1" * 16, engine="megakernel",
                kernel_revision=str(kernel_revision()))  # fmt: skip
    assert row_gaps("tpu.csv", good, columns) == {"commit"}
    good["commit"] = "0123456 (a copy, as $MK_COMMIT states)"  # no such commit here: not checked against its code
    assert row_gaps("tpu.csv", good, columns) == set()
    assert row_gaps("tpu.csv", dict(good, device="cpu: a CPU", backend="cpu"), columns) == {"device"}
    assert row_gaps("tpu.csv", dict(good, libtpu_version="none", program_digest=""), columns) == {
        "libtpu_version",
        "program_digest",
    }
    assert row_gaps("tpu.csv", dict(good, date="2026-11-30T00:00:00Z", program_digest=""), columns) == set()
    wrong = row_gaps("tpu.csv", dict(good, kernel_revision=str(kernel_revision() - 1)), columns)
    assert wrong == {"kernel_revision (not the one data/kernel_revisions.csv records for its kernel_digest)"}


def test_a_row_naming_a_clean_commit_must_carry_that_commits_code(tmp_path):
    """The digest a chip computed, set against the commit the row names: equal for a clean copy of that commit; not
    for a copy with changes that still names it."""
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=MK_DIR, capture_output=True, text=True)
    at_head = source_digest(MK_DIR, head.stdout.strip()) if head.returncode == 0 else None
    if at_head is None:
        pytest.skip("no git history here")
    columns = ["date", "device", "jax_version", "commit", "code_digest"]
    row = dict(date="2026-11-30T00:00:00Z", device="cpu: a CPU", jax_version="0.10.2", code_digest=at_head,
               commit=f"{head.stdout.strip()} (a copy, as $MK_COMMIT states)")  # fmt: skip
    assert row_gaps("x.csv", row, columns) == set()
    assert row_gaps("x.csv", dict(row, code_digest="0" * 16), columns) == {
        "commit (its code is not the commit's: mark it '(with uncommitted changes)')"
    }


def test_this_trees_kernel_code_is_the_last_revision_data_kernel_revisions_records():
    """The megakernel's code here (mk/megakernel/'s digest) is one data/kernel_revisions.csv's last row records, so a
    row measured from this tree is given that revision by what ran, and each digest names one revision only."""
    now = kernel_digest()
    assert now in revision_digests(), (
        f"mk/megakernel/ changed (its digest is now {now}) and data/kernel_revisions.csv does not say what it is: if "
        "the kernel's programs changed, add a revision row with this digest (and store its schedules: python -m mk "
        "schedule --missing); if they did not (a comment, a rename: tests/test_compiler_schedule.py compares the "
        "stored programs), append the digest to the last row's kernel_digests"
    )
    assert recorded_revision() == kernel_revision() == recorded_revision(now)
    recorded = [d for cell in kernel_revisions().kernel_digests for d in cell.split()]
    assert len(recorded) == len(set(recorded)) and all(DIGEST.fullmatch(d) for d in recorded)
    assert recorded_revision("f" * DIGEST_HEX) is None


def test_the_source_digest_is_of_the_python_files_on_the_disk_or_in_a_commit(tmp_path):
    """Every .py file's path and bytes, nothing else; a file renamed changes it as an edit does; the same digest from
    the files git holds at a commit, and None where the commit is not here."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__pycache__").mkdir()
    (pkg / "a.py").write_text("A = 1\n")
    (pkg / "sub" / "b.py").write_text("B = 2\n")
    first = source_digest(pkg)
    assert DIGEST.fullmatch(first)
    (pkg / "notes.txt").write_text("not code")
    (pkg / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    assert source_digest(pkg) == first
    (pkg / "sub" / "b.py").write_text("B = 3\n")
    assert source_digest(pkg) != first
    (pkg / "sub" / "b.py").write_text("B = 2\n")
    assert source_digest(pkg) == first
    (pkg / "sub" / "b.py").rename(pkg / "sub" / "c.py")
    renamed = source_digest(pkg)
    assert renamed != first
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    for cmd in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "c"]):
        subprocess.run([*git, *cmd], cwd=tmp_path, check=True)
    assert source_digest(pkg, "HEAD") == renamed == source_digest(pkg)
    (pkg / "a.py").write_text("A = 9\n")  # a change not committed: the disk's digest is not the commit's
    assert source_digest(pkg) != source_digest(pkg, "HEAD") == renamed
    assert source_digest(pkg, "0123456789ab") is None


def test_a_rows_kernel_is_current_by_its_digest_else_by_the_revision_it_records():
    last = kernel_revision()
    rows = pd.DataFrame(dict(
        kernel_revision=[last, last, last - 1, last - 1, None],
        kernel_digest=[kernel_digest(), "0" * DIGEST_HEX, None, kernel_digest(), None],
    ))  # fmt: skip
    assert current_kernel(rows).tolist() == [True, False, False, True, False]
    assert not current_kernel(pd.DataFrame(dict(other=[1]))).any()  # a table that records no kernel


def test_a_program_digest_is_of_the_program_a_call_runs():
    """Two calls of one step at one shape share a digest; another shape or a component knocked out is another
    program. Nothing runs to take it."""
    params = random_params(TINY_LLAMA, 0)

    def digest(context=32, knockout=frozenset()):
        return decode_call(decode_step, params, TINY_LLAMA, context, 1, "f32", knockout).program_digest()

    one = digest()
    assert DIGEST.fullmatch(one) and digest() == one
    assert digest(context=64) != one and digest(knockout=frozenset({"head"})) != one


def test_a_tpu_tables_readers_keep_each_chips_rows_to_that_chip_and_no_cpus(tmp_path):
    """A CPU's interpreted row is no chip's, a v6e's row is set against a v6e (its model, not a v5e's), and of a check
    run on two chips each chip's newest stays; each step says whether it ran this tree's kernel."""
    t = pd.read_csv(TPU_CSV)
    one = t[(t.engine == "megakernel") & (t.setup == "one chip") & (t.model == "llama-3.2-1b")].iloc[[0]]
    v5e = one.assign(kernel_digest=kernel_digest(), kernel_revision=kernel_revision())
    v6e = one.assign(device="tpu: TPU v6 lite", chip="tpu-v6e", kernel_revision=kernel_revision() - 1)
    cpu = one.assign(device="cpu: a CPU", backend="cpu")
    pd.concat([v5e, v6e, cpu]).to_csv(tmp_path / "tpu.csv", index=False)
    steps = on_tpu.tpu_steps(tmp_path / "tpu.csv").set_index("chip")
    assert sorted(steps.index) == ["tpu-v5e", "tpu-v6e"]
    assert steps.loc["tpu-v6e", "modelled_ms"] < 0.6 * steps.loc["tpu-v5e", "modelled_ms"]  # 1.64 TB/s, not 0.82
    assert steps.kernel_is_current.to_dict() == {"tpu-v5e": True, "tpu-v6e": False}
    runs = (("2026-12-01", "tpu: TPU v5 lite", False), ("2026-12-02", "tpu: TPU v5 lite", True),
            ("2026-12-01", "tpu: TPU v6 lite", True), ("2026-12-03", "cpu: a CPU", False))  # fmt: skip
    parity = pd.DataFrame([dict(date=d, device=dev, model="tiny-llama", dtype="f32", quantize="none", held=h)
                           for d, dev, h in runs])  # fmt: skip
    parity.to_csv(tmp_path / "parity.csv", index=False)
    newest = on_tpu.parity(tmp_path / "parity.csv")
    assert newest[["date", "device"]].values.tolist() == [["2026-12-02", "tpu: TPU v5 lite"],
                                                         ["2026-12-01", "tpu: TPU v6 lite"]]  # fmt: skip
    assert newest.held.all()
    with pytest.raises(ValueError, match="DEVICE_KINDS"):
        on_tpu.chip_rows(pd.DataFrame(dict(device=["tpu: TPU v9"])))
