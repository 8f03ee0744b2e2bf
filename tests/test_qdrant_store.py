"""The Qdrant store on its own, in the client's local mode (qdrant:///dir, a real local store in tmp_path):
upserts, versions, the SQLite manifest beside the folder, the flock across processes, the server-mode
lease and fence (driven through a local-mode client: its conditional upsert is the server's), foreign
collections and folders refused untouched, each search mode, and the term vectors ingest computes.
A Qdrant server is not tested here."""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest

from ingest.store import LeaseLost, StoreError, StoreRejected
from ingest.store.manifest import Entry, SqliteManifest, manifest_path
from ingest.store.qdrant import QdrantStore, server_options
from ingest.store.schema import Columns
from ingest.store import qdrant_manifest
from ingest.store.qdrant_manifest import QdrantLease, QdrantManifest, read_holder, read_summary
from ingest.store.sparse import document_vector, query_vector, term_index, terms

DIM = 8


def columns(source: str, file_hash: str, texts: list[str], vectors: np.ndarray | None = None,
            ids: list[str] | None = None) -> Columns:
    n = len(texts)
    if vectors is None:
        vectors = np.random.default_rng(len(source) + n).normal(size=(n, DIM)).astype(np.float32)
    ids = ids or [uuid.uuid5(uuid.NAMESPACE_URL, f"{source}#{file_hash}#{i}").hex for i in range(n)]
    return Columns(ids, vectors, texts, [source] * n, [1] * n, list(range(n)), ["txt"] * n, [file_hash] * n,
                   ["Title"] * n, ["A > B"] * n, ["text"] * n, ["1,2,3,4"] * n, [f"{source}\n{t}" for t in texts])


@pytest.fixture
def store(tmp_path):
    s = QdrantStore(f"qdrant://{tmp_path / 'q'}", "documents", 10)
    s.lock()
    s.ensure_collection("model-a", DIM, "null")
    yield s
    s.close()


def by_id(s: QdrantStore) -> dict[str, dict]:
    return {r["id"]: r for r in s.rows(["id", "source", "file_hash", "text", "page", "chunk", "vector"])}


def test_idempotent_upsert(store):
    c = columns("a.txt", "h1", ["one", "two", "three"])
    store.upsert_columns(c)
    first = by_id(store)
    row = first[c.ids[0]]
    assert (row["source"], row["file_hash"], row["text"], row["page"], row["chunk"]) == ("a.txt", "h1", "one", 1, 0)
    assert np.allclose(row["vector"], c.vectors[0] / np.linalg.norm(c.vectors[0]), atol=1e-5)   # cosine: normalized
    store.upsert_columns(c)
    again = by_id(store)
    assert set(first) == set(again) == set(c.ids)
    for i in c.ids:        # the same rows (local mode re-normalizes a vector: the last bit may differ)
        assert np.allclose(again[i].pop("vector"), first[i].pop("vector"), atol=1e-6) and again[i] == first[i]


def test_two_versions_then_one_and_the_manifest(store, tmp_path):
    store.upsert_columns(columns("a.txt", "v1", ["old one", "old two", "old three"]))
    store.upsert_columns(columns("a.txt", "v2", ["new one", "new two"]))
    store.upsert_columns(columns("b.txt", "b1", ["other"]))
    store.upsert_columns(columns("gone.txt", "g1", ["gone"]))
    assert store.local_path == (tmp_path / "q").resolve()
    path = manifest_path(store.uri, store.collection)
    assert path == tmp_path / "q.documents.manifest.sqlite" and not store.has_manifest()
    manifest = SqliteManifest(path)
    entry = Entry("a.txt", 10, 20, "v2", "ok", 2, "txt", "{}")
    store.commit(manifest, {"a.txt": "v2", "gone.txt": ""}, [entry], ["gone.txt"])
    manifest.set_meta("settings", "{}")
    rows = store.rows(["source", "file_hash"])
    assert sorted((r["source"], r["file_hash"]) for r in rows) == [("a.txt", "v2"), ("a.txt", "v2"), ("b.txt", "b1")]
    manifest.close()
    assert store.has_manifest()
    again = SqliteManifest(path)
    assert again.all() == {"a.txt": entry}
    again.close()
    summary = store.summary()
    assert summary.meta["settings"] == "{}" and summary.counts == [("txt", "ok", 1, 2)]


def test_many_sources_deleted_in_a_few_calls(store):
    for i in range(300):            # more sources than one filtered delete takes
        store.upsert_columns(columns(f"d/{i}.txt", "v1", [f"text {i}"]))
    store.upsert_columns(columns("d/7.txt", "v2", ["seven again"]))
    store.delete_stale({**{f"d/{i}.txt": "" for i in range(0, 300, 2)}, "d/7.txt": "v2"})
    left = {(r["source"], r["file_hash"]) for r in store.rows(["source", "file_hash"])}
    assert left == {(f"d/{i}.txt", "v1") for i in range(1, 300, 2) if i != 7} | {("d/7.txt", "v2")}


def test_stale_versions_found_again_after_a_reopen_and_deleted_in_one_commit(store, tmp_path):
    for i in range(300):
        store.upsert_columns(columns(f"d/{i}.txt", "v1", [f"text {i}", f"more {i}"]))
    store.close()
    again = QdrantStore(store.uri, "documents", 10)         # its source index read anew, by one scan
    again.lock()
    again.upsert_columns(columns("d/7.txt", "v2", ["seven again"]))
    statements: list[str] = []
    again.client._client.collections["documents"].storage.storage.set_trace_callback(statements.append)
    again.delete_stale({**{f"d/{i}.txt": "v2" for i in range(0, 300, 3)}, "d/7.txt": "v2", "d/8.txt": ""})
    assert sum(s.strip().upper() == "COMMIT" for s in statements) == 1, statements[-3:]    # 203 points, one commit
    read = again.rows(["source", "file_hash", "chunk", "vector"], sources=["d/1.txt", "d/7.txt", "d/8.txt", "x"])
    assert sorted((r["source"], r["file_hash"], r["chunk"]) for r in read) == [
        ("d/1.txt", "v1", 0), ("d/1.txt", "v1", 1), ("d/7.txt", "v2", 0)] and all(len(r["vector"]) == DIM for r in read)
    again.upsert_columns(columns("d/1.txt", "v3", ["one anew"]))     # kept in the index as it is written
    again.delete_stale({"d/1.txt": "v3"})
    again.close()
    third = QdrantStore(store.uri, "documents", 10)          # what SQLite holds: the same
    left = {(r["source"], r["file_hash"]) for r in third.rows(["source", "file_hash"])}
    third.close()
    assert left == {(f"d/{i}.txt", "v1") for i in range(300) if i % 3 and i not in (1, 7, 8)} | {
        ("d/7.txt", "v2"), ("d/1.txt", "v3")}


def test_a_write_sqlite_refuses_raises_and_the_store_reopens_from_sqlite(store):
    store.upsert_columns(columns("a.txt", "v1", ["one", "two", "three"]))
    store.delete_stale({"b.txt": ""})                          # the source index read
    store.client._client.collections["documents"].storage.storage.execute("PRAGMA query_only = ON")
    with pytest.raises(StoreError, match="failed to delete old rows"):
        store.delete_stale({"a.txt": ""})
    assert len(store.rows(["id"], sources=["a.txt"])) == 3     # the folder opened anew: what SQLite holds
    store.delete_stale({"a.txt": ""})
    assert store.rows(["id"]) == []


HOLD = """
import sys
from ingest.store.qdrant import QdrantStore
s = QdrantStore(sys.argv[1], "documents", 10)
s.lock()
s.client                  # the local client open too: it locks the folder itself
print("held", flush=True)
sys.stdin.readline()
"""


def test_second_owner_refused_across_processes(tmp_path):
    uri = f"qdrant://{tmp_path / 'q'}"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, uri], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        other = QdrantStore(uri, "documents", 10)
        with pytest.raises(StoreError, match="in use by ingest pid .*one process per folder"):
            other.lock()
        with pytest.raises(StoreError, match="in use by another process"):
            other.exists()                   # the local client's own lock on the folder: one line too
        other.close()
    finally:
        holder.stdin.close()
        holder.wait(30)
    again = QdrantStore(uri, "documents", 10)
    again.lock()
    assert not again.exists()
    again.close()


def test_lease_takeover_after_expiry_then_the_fence(store, monkeypatch):
    """The server-mode lease and manifest, driven through a local-mode client (same conditional upsert)."""
    monkeypatch.setattr(qdrant_manifest, "LEASE_TTL_S", -1.0)      # a's lease is already expired when written
    a = QdrantLease.acquire(store)
    monkeypatch.setattr(qdrant_manifest, "LEASE_TTL_S", 60.0)
    a_manifest = QdrantManifest(store, a)
    a_manifest.fence()
    a_manifest.set_meta("settings", "a")
    b = QdrantLease.acquire(store)                # a's expired: b takes it over
    try:
        assert read_holder(store) is not None and "pid" in read_holder(store)
        with pytest.raises(LeaseLost, match="taken over"):
            a_manifest.fence()
        with pytest.raises(LeaseLost):
            a_manifest.record([Entry("x.txt", 1, 1, "h", "ok", 1, "txt", "")])
        a.release()                               # lost: b's lease point stays
        with pytest.raises(StoreError, match="in use by the run on"):
            QdrantLease.acquire(store)            # b's is fresh
        c = QdrantLease(store)
        c._write()                                # a write that is not b's does not replace b's point
        assert qdrant_manifest.read_lease(store).run == b.me.run
        b._renew()
        assert not b.lost
        m = QdrantManifest(store, b)
        m.fence()
        entries = [Entry(f"f{i}.txt", i, i, f"h{i}", "ok", i, "txt", "{}") for i in range(3)]
        m.record(entries)
        m.set_meta("settings", "b")
        assert m.get_meta("settings") == "b" and m.get_meta("nothing") is None
        assert m.all() == {e.source: e for e in entries}
        m.remove(["f0.txt"])
        assert set(m.all()) == {"f1.txt", "f2.txt"}
        assert read_summary(store).counts == [("txt", "ok", 2, 3)]
        m.clear()
        assert m.all() == {} and m.get_meta("settings") is None
        m.fence()                                 # the lease survives clear()
    finally:
        b.release()
    assert qdrant_manifest.read_lease(store) is None and read_holder(store) is None
    QdrantLease.acquire(store).release()          # free again


def test_foreign_collection_refused_and_untouched(tmp_path):
    from qdrant_client import QdrantClient, models

    raw = QdrantClient(path=str(tmp_path / "q"))
    raw.create_collection("documents", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.DOT))
    raw.upsert("documents", [models.PointStruct(id=1, vector=[0.5] * DIM, payload={"theirs": True})])
    raw.create_collection("shaped", vectors_config=models.VectorParams(size=DIM, distance=models.Distance.COSINE),
                          metadata={"ingest": {"role": "chunks", "model": "model-a", "dim": DIM, "backend": "null"}})
    raw.create_collection("documents__files", vectors_config={})
    raw.close()
    s = QdrantStore(f"qdrant://{tmp_path / 'q'}", "documents", 10)
    s.lock()
    assert s.exists() and s.recorded() is None
    with pytest.raises(StoreError, match="was not made by ingest") as refused:
        s.ensure_collection("model-a", DIM, "null")
    assert "\n" not in str(refused.value)
    with pytest.raises(StoreError, match="was not made by ingest; it was not dropped"):
        s.drop()
    with pytest.raises(StoreError, match="'documents__files' .* was not made by ingest"):
        QdrantLease.acquire(s)
    shaped = QdrantStore(s.uri, "shaped", 10)
    shaped._client, shaped._pid, shaped._mutex = s.client, os.getpid(), s._mutex
    with pytest.raises(StoreError, match="not of the shape ingest makes"):
        shaped.ensure_collection("model-a", DIM, "null")
    with pytest.raises(StoreError, match="holds model-a vectors"):
        shaped.ensure_collection("model-b", DIM, "null")
    points, _ = s.client.scroll("documents", with_payload=True)
    assert [p.payload for p in points] == [{"theirs": True}]
    assert s.client.get_collection("documents").config.params.vectors.distance == models.Distance.DOT
    s.close()


def test_folder_of_documents_refused(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.txt").write_text("mine")
    s = QdrantStore(f"qdrant://{docs}", "documents", 10)
    with pytest.raises(StoreError, match="folder of other files, not a Qdrant local store"):
        s.lock()
    with pytest.raises(StoreError, match="folder of other files"):
        s.ensure_collection("model-a", DIM, "null")
    assert sorted(p.name for p in docs.iterdir()) == ["a.txt"] and not (tmp_path / "docs.lock").exists()


def test_planted_phrase_first_in_every_mode(store):
    rng = np.random.default_rng(7)
    words = "river stone cloud paper window garden engine market silver forest".split()
    texts = [" ".join(rng.choice(words, 30)) for _ in range(60)]
    vectors = rng.normal(size=(60, DIM)).astype(np.float32)
    store.upsert_columns(columns("noise.txt", "n", texts, vectors))
    query = rng.normal(size=DIM).astype(np.float32)
    planted = columns("zoo.txt", "z", ["a purple octopus waves from the river stone"], query[None, :] * 3)
    store.upsert_columns(planted)
    for mode in ("dense", "bm25", "hybrid"):
        hits = store.search(query.tolist(), 5, mode, "purple octopus")
        assert hits[0]["source"] == "zoo.txt", mode
        assert hits[0]["bbox"] == [1.0, 2.0, 3.0, 4.0] and hits[0]["headings"] == "A > B" and hits[0]["page"] == 1
    assert store.search(None, 5, "bm25", "!!! ...") == []
    assert store.sources_like("zoo.txt", 10) == ["zoo.txt"] and store.sources_like("oo.txt", 10) == []


def test_bad_rows_rejected_and_nothing_written(store):
    with pytest.raises(StoreRejected, match="not 32 hex digits"):
        store.upsert_columns(columns("a.txt", "h", ["one"], ids=["not-a-hex-id"]))
    with pytest.raises(StoreRejected, match="refused to store 1 rows"):
        store.upsert_columns(columns("a.txt", "h", ["one"], np.ones((1, DIM + 1), np.float32)))
    assert store.rows(["id"]) == []


def test_threads_share_the_local_client(store):
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(10):
                store.upsert_columns(columns(f"t{n}/{i}.txt", "h", ["thread text"]))
                store.search([1.0] * DIM, 3, "hybrid", "thread")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(store.rows(["id"])) == 30


def test_server_uri_options_and_an_unreachable_server(monkeypatch):
    monkeypatch.delenv("QDRANT_API_KEY", raising=False)
    o = server_options("qdrants://:s3cret@db.example:7000/base", 2.5)
    assert (o["url"], o["port"], o["https"], o["prefix"], o["api_key"], o["timeout"]) == \
        ("https://db.example", 7000, True, "base", "s3cret", 3)
    assert server_options("qdrant://h?api_key=k2", 60)["api_key"] == "k2"
    monkeypatch.setenv("QDRANT_API_KEY", "k3")
    o = server_options("qdrant://[::1]", 60)
    assert (o["url"], o["port"], o["https"], o["api_key"]) == ("http://[::1]", 6333, False, "k3")
    s = QdrantStore("qdrant://:s3cret@127.0.0.1:9/", "documents", 2)
    assert s.caps.embedded is False and s.caps.hosted and s.local_path is None and "s3cret" not in s.uri
    started = time.monotonic()
    with pytest.raises(StoreError) as down:
        s.exists()
    assert not isinstance(down.value, StoreRejected) and "did not answer" in str(down.value)
    assert "s3cret" not in str(down.value) and "\n" not in str(down.value) and time.monotonic() - started < 30
    assert s.endpoint().address.startswith("qdrant://:s3cret@") and QdrantStore.at(s.endpoint()).uri == s.uri


def test_term_vectors_are_stable_and_read_any_script():
    assert terms("Ｆｕｌｌ-width CAFÉ, naïve Straße 東京タワー 서울") == \
        ["full", "width", "café", "naïve", "strasse", "東京", "京タ", "タワ", "ワー", "서울"]     # CJK: bigrams
    assert term_index("octopus") == 3699423415        # the same in every process, machine and version
    out = subprocess.run([sys.executable, "-c", "from ingest.store.sparse import term_index; print(term_index('東'))"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "123"}, check=True)
    assert int(out.stdout) == term_index("東")
    indices, values = document_vector("octopus octopus squid")
    assert indices == sorted(indices) and len(indices) == 2
    weight = dict(zip(indices, values))
    assert weight[term_index("squid")] < weight[term_index("octopus")] < 2 * weight[term_index("squid")]
    assert document_vector("octopus octopus squid") == (indices, values)
    assert query_vector("Octopus octopus 東") == (sorted({term_index("octopus"), term_index("東")}), [1.0, 1.0])
    assert query_vector("...") == ([], [])
