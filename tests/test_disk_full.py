"""Issue 40, item 1: a full disk under an embedded store (Milvus Lite and its SQLite manifest; LanceDB). The store
lives on a small tmpfs filled mid-run by a filler file: the run stops with one line naming the disk, exit 2, and
its report (on another disk) counts as written the files whose rows were committed; every file keeps its last
good copy whole (a changed file its previous version), the manifest passes SQLite's integrity check; a rerun
with room completes with exactly one current version of every file, and the next finds every file unchanged.
Real CLI, real stores, a real tmpfs (root only: skipped, saying why, where mount is refused)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Iterator

import pytest

from conftest import cli_env, sqlite, write_rows
from ingest.files import FileRef, Finished, Outcome
from ingest.ledger import Ledger
from ingest.store import Store
from ingest.store.errors import DiskFull
from ingest.store.manifest import RESERVE_MIN, Entry, SqliteManifest, manifest_path

WORDS = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor", "indigo", "juniper", "kelp",
         "lagoon", "marble", "nectar", "obsidian", "prairie", "quartz", "river", "saffron", "tundra"]
DISK_MB = 24
STORES = {"lite": lambda disk: str(disk / "store.db"), "lancedb": lambda disk: f"lancedb://{disk / 'lance'}"}


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MB tmpfs at tmp_path/disk, unmounted after the test."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}M", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip() or proc.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def write_docs(docs: Path, names: range, tag: str = "") -> None:
    for i in names:
        text = "\n\n".join(f"{tag}file {i} part {p}: " + " ".join(f"{WORDS[(i * 3 + p + k) % 20]}-{i}-{p}-{k}"
                                                                   for k in range(60)) for p in range(3))
        (docs / f"f{i:03d}.txt").write_text(text)


def ingest_run(uri: str, docs: Path, report: Path) -> tuple[subprocess.CompletedProcess, dict | None]:
    report.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "ingest.cli", "run", str(docs), "--store", uri, "--report", str(report),
            "--quiet", "--backend", "null"]
    proc = subprocess.run(argv, cwd=docs.parent, capture_output=True, text=True, timeout=300, env=cli_env())
    return proc, json.loads(report.read_text()) if report.exists() else None


def stored(uri: str) -> dict[str, dict[str, int]]:
    """source -> {file_hash: rows}, read by a process of its own (the stores lock their files)."""
    code = ("import json, sys; from ingest.store.factory import open_store\n"
            "s = open_store(sys.argv[1], 'documents')\n"
            "print(json.dumps(s.rows(['id', 'source', 'file_hash']) if s.exists() else []))")
    proc = subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True, env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len({r["id"] for r in rows}) == len(rows), "duplicate ids"
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        versions = out.setdefault(r["source"], {})
        versions[r["file_hash"]] = versions.get(r["file_hash"], 0) + 1
    return out


def manifest(uri: str) -> dict[str, tuple[str, int]]:
    """source -> (file_hash, chunks), after SQLite's own integrity check."""
    with sqlite(manifest_path(uri, "documents")) as con:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        return {s: (h, n) for s, h, n in con.execute("SELECT source, file_hash, chunks FROM files")}


def fill(mnt: Path, room_kb: int) -> Path:
    """A filler file that leaves `room_kb` kB free on the tmpfs."""
    free_kb = shutil.disk_usage(mnt).free // 1024
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        f.truncate(0)
        os.posix_fallocate(f.fileno(), 0, max(0, free_kb - room_kb) * 1024)
    return filler


def stored_kb(mnt: Path) -> int:
    """kB the store and its manifest take on the tmpfs, less the manifest's reserve (its room for a last record)."""
    return (shutil.disk_usage(mnt).used - sum(p.stat().st_size for p in mnt.glob("*.reserve"))) // 1024


def one_version_each(uri: str, sources: set[str]) -> dict[str, tuple[str, int]]:
    """Exactly one version of every file in the store, the manifest's, with all its rows."""
    rows, entries = stored(uri), manifest(uri)
    assert set(rows) == set(entries) == sources
    for source, versions in rows.items():
        assert versions == {entries[source][0]: entries[source][1]}, source
    return entries


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(STORES))
def test_full_disk_stops_in_one_line_keeps_last_good_copy_and_a_rerun_with_room_completes(disk: Path,
                                                                                          tmp_path: Path, kind: str):
    uri, docs, report = STORES[kind](disk), tmp_path / "docs", tmp_path / "report.json"
    docs.mkdir()
    write_docs(docs, range(40))
    first, rep = ingest_run(uri, docs, report)
    assert first.returncode == 0, first.stderr
    before = one_version_each(uri, {f"f{i:03d}.txt" for i in range(40)})

    write_docs(docs, range(0, 40, 2), tag="changed ")            # 20 changed files and 60 new ones
    write_docs(docs, range(40, 100))
    filler = fill(disk, room_kb=stored_kb(disk))      # what 40 files took: about half of it
    full, rep = ingest_run(uri, docs, report)
    lines = [line for line in full.stderr.splitlines() if line.strip()]
    assert full.returncode == 2, full.stderr
    assert "Traceback" not in full.stderr, full.stderr
    assert lines[-1].startswith("ingest: error: disk full (No space left on device) writing "), full.stderr
    assert str(disk) in lines[-1] and "free space" in lines[-1]
    assert len(lines) <= 2, full.stderr               # at most the manifest's "last run not recorded" warning
    assert rep is not None and rep["totals"]["exit_code"] == 2 and "disk full" in rep["totals"]["stopped_by"]

    # The last good copy: each file holds one whole version, the new one exactly where the report says written.
    written = {f["path"] for f in rep["files"] if f["status"] == "ingested"}
    rows, entries = stored(uri), manifest(uri)
    for source, versions in rows.items():
        assert len(versions) == 1, (source, versions)
        assert versions == {entries[source][0]: entries[source][1]}, source
    for source, (file_hash, chunks) in before.items():
        assert (entries[source] != (file_hash, chunks)) == (source in written and int(source[1:4]) % 2 == 0), source
    assert set(entries) == set(before) | written
    assert all(f["status"] in ("ingested", "unchanged", "failed") for f in rep["files"])
    print(f"{kind}: {len(written)} of 80 new or changed files committed before the disk filled")

    filler.unlink()                                              # room again: the rerun completes
    rerun, rep = ingest_run(uri, docs, report)
    assert rerun.returncode == 0, rerun.stderr
    one_version_each(uri, {f"f{i:03d}.txt" for i in range(100)})
    again, rep = ingest_run(uri, docs, report)
    assert again.returncode == 0 and rep["totals"]["by_status"] == {"unchanged": 100}, again.stderr


@pytest.mark.slow
def test_a_report_on_the_full_disk_is_said_in_one_line(disk: Path, tmp_path: Path):
    """The report beside the store (its default place) cannot be written either: one more line, no traceback."""
    uri, docs, report = STORES["lite"](disk), tmp_path / "docs", disk / "store.db.report.json"
    docs.mkdir()
    write_docs(docs, range(20))
    assert ingest_run(uri, docs, report)[0].returncode == 0
    write_docs(docs, range(20, 80))
    fill(disk, room_kb=stored_kb(disk) // 2)
    proc, _ = ingest_run(uri, docs, report)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[-1].startswith("ingest: error: disk full (No space left on device) writing "), proc.stderr
    assert any(line.startswith(f"warning: the report could not be written to {report} (No space left on device)")
               for line in lines), proc.stderr
    assert len(lines) <= 3, proc.stderr
    assert not list(disk.glob("*.tmp")), "a half-written report left behind"


@pytest.mark.slow
def test_a_collection_a_full_disk_left_half_made_is_made_again(tmp_path: Path):
    """Milvus Lite makes a collection's folder, then its schema.json (a temp file renamed): a disk that fills in
    between leaves the folder with the temp file alone, which Lite then refuses to make again ("File exists").
    The Lite host removes such a folder (nothing else in it) when it opens the store."""
    uri, docs, report = str(tmp_path / "store.db"), tmp_path / "docs", tmp_path / "report.json"
    docs.mkdir()
    write_docs(docs, range(3))
    assert ingest_run(uri, docs, report)[0].returncode == 0
    half = tmp_path / "store.db" / "collections" / "other"
    half.mkdir()
    (half / "schema.json.tmp").write_text('{"collection_name": "oth')
    argv = [sys.executable, "-m", "ingest.cli", "run", str(docs), "--store", uri, "--collection", "other",
            "--report", str(report), "--quiet", "--backend", "null"]
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env())
    assert proc.returncode == 0, proc.stderr
    assert (half / "schema.json").exists() and not (half / "schema.json.tmp").exists()


@pytest.mark.slow
def test_a_lancedb_table_a_full_disk_left_unmade_or_unindexed_is_made_again(tmp_path: Path):
    """A full disk while LanceDB creates a table leaves its folder with empty `_versions/` and `_transactions/`,
    which Lance neither opens ("Table ... was not found") nor makes again: every rerun failed (found by the chaos
    soak). Such a folder is removed and the table made; a table whose indexes a full disk kept from being made
    gets them on the next run; a folder holding anything else is left alone."""
    folder, docs, report = tmp_path / "lance", tmp_path / "docs", tmp_path / "report.json"
    uri = f"lancedb://{folder}"
    docs.mkdir()
    write_docs(docs, range(3))
    for name in ("other.lance/_versions", "other.lance/_transactions"):
        (folder / name).mkdir(parents=True)
    (folder / "kept.lance" / "_versions").mkdir(parents=True)
    (folder / "kept.lance" / "notes.txt").write_text("not Lance's")
    for collection in ("other", "documents"):
        argv = [sys.executable, "-m", "ingest.cli", "run", str(docs), "--store", uri, "--collection", collection,
                "--report", str(report), "--quiet", "--backend", "null"]
        proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=300, env=cli_env())
        assert proc.returncode == 0, proc.stderr
    assert (folder / "kept.lance" / "notes.txt").exists()
    code = ("import json, sys; from ingest.store.factory import open_store\n"
            "s = open_store(sys.argv[1], sys.argv[2]); t = s.table()\n"
            "if sys.argv[3] == 'drop': t.drop_index('search_text_idx')\n"
            "print(json.dumps([t.count_rows(), sorted(i.columns[0] for i in t.list_indices())]))")

    def table(collection: str, drop: str = "") -> list:
        proc = subprocess.run([sys.executable, "-c", code, uri, collection, drop], capture_output=True, text=True,
                              env=cli_env(), timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    assert table("other") == [27, ["id", "search_text"]]
    assert table("documents", "drop")[1] == ["id"]
    rerun, _ = ingest_run(uri, docs, report)
    assert rerun.returncode == 0, rerun.stderr
    assert table("documents") == [27, ["id", "search_text"]]


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_full_disk_at_the_start_is_never_called_a_damaged_manifest(disk: Path, tmp_path: Path, kind: str):
    """SQLite says "disk I/O error" when it cannot make the WAL's files of an existing manifest on a full disk:
    the line says the disk is full (never "damaged: move it aside ... --reembed"), and a rerun with room is fine."""
    uri, docs, report = STORES[kind](disk), tmp_path / "docs", tmp_path / "report.json"
    docs.mkdir()
    write_docs(docs, range(5))
    assert ingest_run(uri, docs, report)[0].returncode == 0
    write_docs(docs, range(5, 10))
    filler = fill(disk, room_kb=0)
    proc, _ = ingest_run(uri, docs, report)
    assert proc.returncode == 2, proc.stderr
    assert "damaged" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("ingest: error: disk full (No space left on device) ")
    filler.unlink()
    assert ingest_run(uri, docs, report)[0].returncode == 0
    one_version_each(uri, {f"f{i:03d}.txt" for i in range(10)})


@pytest.mark.slow
def test_a_disk_that_fills_part_way_through_a_commit_is_met_by_the_reserve(disk: Path):
    """The window of a commit (ingest.store.manifest NOTE: reserve): 300 changed files whose new rows are in a
    Milvus Lite store, then a full disk before their old versions are deleted and their entries recorded. The
    commit is done once more on the reserve: only the new versions, the manifest naming them; then the ledger
    raises the DiskFull before any other commit. Room again, the next run's reserve is made again."""
    path = manifest_path(str(disk / "store.db"), "documents")
    store, manifest = Store(str(disk / "store.db"), "documents"), SqliteManifest(path)
    manifest.hold_reserve()
    assert manifest.reserve.stat().st_size >= RESERVE_MIN
    store.ensure_collection("m", 8, "null")
    old = {f"docs/f{i:04d}.txt": (f"a{i}", 1 + i % 3) for i in range(300)}
    new = {s: (f"b{i}", 1 + i % 2) for i, s in enumerate(old)}
    write_rows(store, old)
    manifest.record(Entry(s, 1, 1, v, "ingested", n, "txt", "{}") for s, (v, n) in old.items())
    write_rows(store, new)
    filler = fill_up(disk)
    ledger = Ledger(store, manifest, "{}")
    ledger.touched.update(new)
    files = [Finished(FileRef(0, s, s, 1, 1, "txt", v), Outcome("ingested", chunks=n), old_hash=old[s][0],
                      record=True, card='{"title": "t"}') for s, (v, n) in new.items()]
    done = ledger.commit(files)

    assert [f.outcome.status for f in done] == ["ingested"] * 300
    assert isinstance(ledger.full, DiskFull) and not manifest.reserve.exists()
    versions: dict[str, Counter[str]] = {}
    for r in store.rows(["source", "file_hash"]):
        versions.setdefault(r["source"], Counter())[r["file_hash"]] += 1
    assert versions == {s: Counter({v: n}) for s, (v, n) in new.items()}
    assert {s: e.file_hash for s, e in manifest.all().items()} == {s: v for s, (v, _) in new.items()}
    with pytest.raises(DiskFull) as raised:
        ledger.commit([])
    assert raised.value is ledger.full
    store.close()
    manifest.close()
    filler.unlink()
    again = SqliteManifest(path)
    again.hold_reserve()
    assert again.reserve.stat().st_size >= RESERVE_MIN
    again.close()


def fill_up(mnt: Path) -> Path:
    """A filler file that takes every free byte of the tmpfs while a store may be writing on it."""
    filler = mnt / "filler"
    with open(filler, "wb") as f:
        size = 0
        for step in (1 << 20, 1 << 16, 1 << 12):
            while True:
                try:
                    os.posix_fallocate(f.fileno(), size, step)
                except OSError:
                    break
                size += step
    return filler
