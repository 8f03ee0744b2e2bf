"""Issue 30, item 3: a commit deletes the stale rows of all its files in a few calls, not one a file (a
Milvus filtered delete scans the whole collection: 5,000 changed files cost 234 s on Milvus Lite), and
--prune of many files likewise; the last good copy stays exact. Real Milvus (Lite and a server), the real
Ledger and manifests, the real CLI; the store is counted, never replaced."""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conftest import run, sqlite, store_rows, write_rows
from ingest.files import FileRef, Finished, Outcome
from ingest.store import Store, milvus
from ingest.store.collection import Collection
from ingest.store.manifest import Entry, SqliteManifest
from ingest.store.server_manifest import Lease, ServerManifest
from ingest.ledger import Ledger

CHANGED = 600                    # files changed in one commit


class CountingStore(Store):
    """A real store that counts the client calls it makes, by method."""

    def __init__(self, *args: Any):
        super().__init__(*args)
        self.calls: Counter[str] = Counter()

    def call(self, what: str, method: str, *args: Any, **kwargs: Any) -> Any:
        self.calls[method] += 1
        return super().call(what, method, *args, **kwargs)


def _versions(store: Store) -> dict[str, Counter[str]]:
    """source -> rows by file_hash."""
    out: dict[str, Counter[str]] = {}
    for r in store.rows(["source", "file_hash"]):
        out.setdefault(r["source"], Counter())[r["file_hash"]] += 1
    return out


def _entry(source: str, version: str, chunks: int) -> Entry:
    return Entry(source, 1, 1, version, "ingested", chunks, "txt", "{}")


def _finished(source: str, version: str, chunks: int, old: str | None, status: str = "ingested",
              drop: bool = False) -> Finished:
    return Finished(FileRef(0, source, source, 1, 1, "txt", version), Outcome(status, chunks=chunks), old_hash=old,
                    record=status == "ingested", drop=drop)


@pytest.fixture(params=["lite", "server"])
def owned(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    """(store, manifest) of a fresh collection: a Lite file with its SQLite manifest, or a server collection
    with its lease and companion manifest (fencing before every delete)."""
    if request.param == "lite":
        store = CountingStore(str(tmp_path / "store.db"), "documents")
        manifest = SqliteManifest(tmp_path / "manifest.sqlite")
    else:
        store = CountingStore(request.getfixturevalue("milvus_uri"), f"batched_{tmp_path.name[-12:]}")
        store.drop()
        lease = Lease.acquire(store)
        manifest = ServerManifest(store, lease)
    store.ensure_collection("m", 8, "null")
    yield store, manifest
    if request.param == "server":
        lease.release()
        store.drop()
        store.call("drop the manifest collection", "drop_collection", store.collection + "__files")
    manifest.close()
    store.close()


def test_a_commit_of_many_changed_files_deletes_in_a_few_calls_and_exactly(owned: Any) -> None:
    store, manifest = owned
    old = {f"docs/c{i:04d}.txt": (f"a{i}", 1 + i % 3) for i in range(CHANGED)}           # changed files
    old |= {f"docs/u{i:03d}.txt": (f"u{i}", 2) for i in range(50)}                          # unchanged files
    old |= {"docs/same.txt": ("s1", 2), "docs/part.txt": ("p1", 3), "docs/drop.txt": ("d1", 2),
            "docs/twin.txt": ("t1", 2)}
    write_rows(store, old)
    manifest.record(_entry(s, v, n) for s, (v, n) in old.items())
    write_rows(store, {"docs/twin.txt": ("b5", 1)})     # a version abandoned by a crash: c0005's new content

    new = {f"docs/c{i:04d}.txt": (f"b{i}", 1 + i % 2) for i in range(CHANGED)}
    new |= {"docs/twin.txt": ("t2", 2), "docs/part.txt": ("p2", 2), "docs/fresh.txt": ("f2", 2)}
    write_rows(store, new)
    ledger = Ledger(store, manifest, "{}")
    ledger.touched.update(new)
    ledger.failed.update({"docs/part.txt": "refused", "docs/fresh.txt": "refused"})      # failed part-way
    files = [_finished(s, v, n, old[s][0] if s in old else None) for s, (v, n) in new.items()]
    files += [_finished("docs/same.txt", "s1", 2, "s1"),                                  # only its mtime changed
              _finished("docs/drop.txt", "", 0, "d1", status="skipped", drop=True)]
    store.calls.clear()
    done = ledger.commit(files)

    assert store.calls["delete"] <= 3, store.calls          # was one a file (607)
    assert store.calls["query"] <= 2, store.calls
    status = {f.ref.source: f.outcome.status for f in done}
    assert status["docs/part.txt"] == status["docs/fresh.txt"] == "failed"
    rows = _versions(store)
    for i in range(CHANGED):                                # only the new version, every chunk of it
        assert rows[f"docs/c{i:04d}.txt"] == Counter({f"b{i}": 1 + i % 2}), i
    for i in range(50):
        assert rows[f"docs/u{i:03d}.txt"] == Counter({f"u{i}": 2})
    assert rows["docs/twin.txt"] == Counter({"t2": 2})      # its stale version, though another file's new hash
    assert rows["docs/part.txt"] == Counter({"p1": 3})      # the last good copy, whole
    assert rows["docs/same.txt"] == Counter({"s1": 2})
    assert "docs/fresh.txt" not in rows and "docs/drop.txt" not in rows
    entries = manifest.all()
    assert entries["docs/part.txt"].file_hash == "p1" and entries["docs/c0007.txt"].file_hash == "b7"
    assert "docs/fresh.txt" not in entries and "docs/drop.txt" not in entries


def test_reads_that_fill_the_query_window_are_split_and_stay_exact(owned: Any,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store, _ = owned
    monkeypatch.setattr(milvus, "READ_LIMIT", 16)           # a window 16 rows wide: reads of 40 sources fill it
    old = {f"s{i:02d}": (f"a{i}", 2) for i in range(40)} | {"big": ("a-big", 20)}
    new = {f"s{i:02d}": (f"b{i}", 1) for i in range(40)} | {"big": ("b-big", 3)}
    write_rows(store, old)
    write_rows(store, new)
    store.delete_stale({s: v for s, (v, _) in new.items()} | {"s00": ""})
    rows = _versions(store)
    assert rows == {s: Counter({v: n}) for s, (v, n) in new.items() if s != "s00"}


def test_prune_of_many_files_deletes_in_a_few_calls(owned: Any) -> None:
    store, manifest = owned
    files = {f"docs/f{i:04d}.txt": (f"h{i}", 1 + i % 2) for i in range(CHANGED)}
    files |= {f"docs/sub/g{i}.txt": (f"g{i}", 1) for i in range(5)}          # in a folder the scan could not list
    write_rows(store, files)
    manifest.record(_entry(s, v, n) for s, (v, n) in files.items())
    collection = Collection(None, "null", "{}", store, manifest, manifest.all(), None)     # only what prune uses
    gone = [s for i, s in enumerate(sorted(files)) if i % 3 and "/sub/" not in s]
    store.calls.clear()
    assert collection.prune([*gone, "docs/sub/g1.txt", "docs/never-recorded.txt"], unlisted=["docs/sub"]) == gone
    assert store.calls["delete"] <= 2, store.calls           # was one a file (400)
    kept = set(files) - set(gone)
    assert set(_versions(store)) == kept == set(manifest.all())


# -- the CLI: a rerun of many changed files, one failing part-way; --prune of many deleted files ---------
SMALL = ('[model]\nbackend = "null"\n[chunking]\nchunk_tokens = 24\noverlap_tokens = 4\n[store]\nbatch_size = 8\n'
         '[loaders]\nplugins = ["last_good_loaders"]\n')


def _manifest(work: Path) -> dict[str, str]:
    with sqlite(work / "store.db.documents.manifest.sqlite") as con:
        return dict(con.execute("SELECT source, file_hash FROM files"))


@pytest.mark.slow
def test_a_rerun_of_many_changed_files_and_a_prune_leave_exactly_the_right_rows(work: Path) -> None:
    docs = work / "docs"
    for i in range(300):
        (docs / f"f{i:03d}.txt").write_text(f"Lantern number {i} glows over the quiet harbour at dusk.")
    (docs / "keep.paged").write_text("\n\n".join(f"keep paragraph {i}: " + " ".join(f"w{i}-{k}" for k in range(30))
                                                 for i in range(6)))
    first = run(docs, work, config=SMALL)
    assert first.rc == 0, first.stderr
    before = {r["id"]: r for r in store_rows(work)}
    keep_rows = {k for k, r in before.items() if r["source"] == "keep.paged"}
    assert len(keep_rows) >= 6

    for i in range(0, 300, 3):
        (docs / f"f{i:03d}.txt").write_text(f"Copper kettle {i} whistles on the stove at dawn.")     # changed
    (docs / "keep.paged").write_text((docs / "keep.paged").read_text() + "\n\nmore words here\n\nOVERFLOW")
    second = run(docs, work, config=SMALL)
    assert second.rc == 1 and second.by_path()["keep.paged"]["status"] == "failed", second.stderr
    entries, rows = _manifest(work), store_rows(work)
    by_source: dict[str, list[dict]] = {}
    for r in rows:
        by_source.setdefault(r["source"], []).append(r)
    assert {r["id"] for r in by_source["keep.paged"]} == keep_rows          # the last good copy, whole
    for i in range(300):
        source = f"f{i:03d}.txt"
        assert [r["file_hash"] for r in by_source[source]] == [entries[source]], source     # one row: the new
        if i % 3:
            assert by_source[source][0]["id"] in before, source                              # unchanged: untouched

    for i in range(0, 300, 2):
        (docs / f"f{i:03d}.txt").unlink()
    pruned = run(docs, work, "--prune", config=SMALL)
    assert pruned.rc == 1, pruned.stderr                    # keep.paged still fails
    left = {f"f{i:03d}.txt" for i in range(1, 300, 2)} | {"keep.paged"}
    assert {r["source"] for r in store_rows(work)} == left == set(_manifest(work))
