"""The store contract: the same cases on every store behind `ingest.store.base.StoreBase`, chosen by URI
(`open_store`): Milvus Lite, a Milvus server (milvus-lite server on loopback), a real PostgreSQL + pgvector
(`pg_server`), Qdrant's local mode and LanceDB. A Qdrant server could not be installed here: it is not tested.

Cases: an idempotent upsert; two versions, then exactly one (commit); the manifest round trip; a second
owner refused; a takeover after expiry, then the fence; a foreign collection refused and untouched; a planted
phrase found first in each mode; errors classed as the file's (StoreRejected) or the run's (StoreError)."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from typing import Iterator

import numpy as np
import pytest

from ingest.store import LeaseLost, StoreBase, StoreError, StoreRejected
from ingest.store.factory import open_store
from ingest.store.manifest import Entry, SqliteManifest, manifest_path
from ingest.store.schema import Columns

DIM = 16
KINDS = ["milvus-lite", "milvus", "postgresql", "qdrant-local", "lancedb"]


@pytest.fixture(params=KINDS)
def uri(request, tmp_path) -> str:
    """A store of each kind (a fresh collection name per test keeps the session's servers apart)."""
    kind = request.param
    if kind == "milvus-lite":
        return str(tmp_path / "store.db")
    if kind == "milvus":
        return request.getfixturevalue("milvus_uri")
    if kind == "postgresql":
        return request.getfixturevalue("pg_uri")
    if kind == "lancedb":
        return f"lancedb://{tmp_path / 'lance'}"
    return f"qdrant://{tmp_path / 'qdrant'}"


@pytest.fixture
def name() -> str:
    return "c" + uuid.uuid4().hex[:12]


def columns(source: str, file_hash: str, texts: list[str], vectors: np.ndarray | None = None) -> Columns:
    n = len(texts)
    if vectors is None:
        vectors = np.random.default_rng(abs(hash((source, file_hash))) % 2**32).normal(size=(n, DIM))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    ids = [uuid.uuid5(uuid.NAMESPACE_URL, f"{source}#{file_hash}#{i}").hex for i in range(n)]
    return Columns(ids, vectors, texts, [source] * n, [i + 1 for i in range(n)], list(range(n)), ["txt"] * n,
                   [file_hash] * n, ["A title"] * n, ["Part > Section"] * n, ["text"] * n, [""] * n,
                   [f"{source}\n{t}" for t in texts])


@contextmanager
def owned(uri: str, name: str) -> Iterator[tuple[StoreBase, object, object]]:
    """(store, manifest, lease) owned as a run owns them: an embedded store flocked with its SQLite manifest
    beside it, a server's lease and manifest there (`own`)."""
    store = open_store(uri, name, 20)
    store.lock()
    lease = None
    try:
        if store.caps.embedded:
            manifest = SqliteManifest(manifest_path(store.uri, name))
        else:
            manifest, lease = store.own()
        yield store, manifest, lease
        manifest.close()
        if lease is not None:
            lease.release()
    finally:
        store.close()


def pairs(store: StoreBase) -> list[tuple[str, str]]:
    return sorted((r["source"], r["file_hash"]) for r in store.rows(["source", "file_hash"]))


def test_idempotent_upsert(uri, name):
    with owned(uri, name) as (store, _, _):
        store.ensure_collection("model-a", DIM, "null")
        c = columns("a.txt", "h1", ["one", "two", "three"])
        store.upsert_columns(c)
        store.upsert_columns(c)
        store.flush()
        rows = {r["id"]: r for r in store.rows(["id", "source", "file_hash", "text", "page", "chunk"])}
        assert set(rows) == set(c.ids)
        assert rows[c.ids[1]] | {"id": ""} == {"id": "", "source": "a.txt", "file_hash": "h1", "text": "two",
                                               "page": 2, "chunk": 1}
        assert store.recorded() == ("model-a", DIM, "null")


def test_two_versions_then_exactly_one(uri, name):
    with owned(uri, name) as (store, manifest, _):
        store.ensure_collection("model-a", DIM, "null")
        for c in (columns("a.txt", "v1", ["old one", "old two", "old three"]), columns("a.txt", "v2", ["new"]),
                  columns("b.txt", "b1", ["other"]), columns("gone.txt", "g1", ["gone"])):
            store.upsert_columns(c)
        store.flush()
        manifest.record([Entry("gone.txt", 1, 1, "g1", "ingested", 1, "txt", "{}")])
        store.commit(manifest, {"a.txt": "v2", "gone.txt": ""}, [Entry("a.txt", 3, 4, "v2", "ingested", 1, "txt", "{}")],
                     ["gone.txt"])
        assert pairs(store) == [("a.txt", "v2"), ("b.txt", "b1")]
        assert set(manifest.all()) == {"a.txt"} and manifest.all()["a.txt"].file_hash == "v2"


def test_manifest_round_trip(uri, name):
    entries = [Entry(f"dir/ä {i}.txt", 100 + i, 10**18 + i, f"h{i}", "ingested", i, "txt", '{"s": 1}')
               for i in range(5)]
    with owned(uri, name) as (store, manifest, _):
        manifest.set_meta("settings", '{"model": "m"}')
        manifest.record(entries)
        manifest.remove(["dir/ä 0.txt"])
    with owned(uri, name) as (store, manifest, _):
        assert manifest.get_meta("settings") == '{"model": "m"}' and manifest.get_meta("nothing") is None
        assert manifest.all() == {e.source: e for e in entries[1:]}
        manifest.clear()
        assert manifest.all() == {} and manifest.get_meta("settings") is None


def test_second_owner_refused(uri, name):
    with owned(uri, name):
        with pytest.raises(StoreError, match="in use by"):
            with owned(uri, name):
                pass
    with owned(uri, name):          # given back: the next run owns it
        pass


def test_takeover_after_expiry_then_the_fence(uri, name, request):
    """A server collection whose owner stopped renewing is taken over; the old owner's fence then refuses
    (before any delete or record). An embedded store's flock expires with its holder's process (killed here)."""
    if open_store(uri, name).caps.embedded:      # a flock: it expires with its holder's process
        holder = subprocess.Popen([sys.executable, "-c", HOLD, uri, name], stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            with pytest.raises(StoreError, match="in use by"):
                with owned(uri, name):
                    pass
        finally:
            holder.kill()
            holder.wait(timeout=30)
        with owned(uri, name) as (_, manifest, _):
            manifest.fence()                    # held as long as this process lives: nothing to check
        return
    store, manifest, lease = _owner(uri, name)
    try:
        expire(request, store, lease)
        with owned(uri, name) as (_, new_manifest, _):
            new_manifest.set_meta("owner", "new")
            with pytest.raises(LeaseLost):
                manifest.fence()
            with pytest.raises(LeaseLost):
                store.commit(manifest, {"a.txt": ""}, [], [])
            assert new_manifest.get_meta("owner") == "new"
    finally:
        manifest.close()
        lease is None or lease.release()
        store.close()


HOLD = ("import sys, time; from ingest.store.factory import open_store\n"
        "s = open_store(sys.argv[1], sys.argv[2]); s.lock(); print('held', flush=True); time.sleep(600)")


def _owner(uri: str, name: str):
    store = open_store(uri, name, 20)
    store.lock()
    if store.caps.embedded:
        return store, SqliteManifest(manifest_path(store.uri, name)), None
    manifest, lease = store.own()
    return store, manifest, lease


def expire(request, store: StoreBase, lease) -> None:
    """Make `lease` as good as expired, the way each store's lease expires when its holder stops."""
    if store.caps.name == "Milvus":             # the lease row: expired, as if its heartbeat had stopped
        from ingest.store.server_manifest import LEASE_KEY, _row, companion_name

        lease._stop.set()
        value = json.dumps({**lease.me.__dict__, "expires": time.time() - 1, "host": "elsewhere", "boot": ""})
        store.call("write the lease", "upsert", companion_name(store.collection), [_row(LEASE_KEY, value=value)])
    elif store.caps.name.startswith("PostgreSQL"):     # the owner's session ends (its advisory lock goes with it)
        request.getfixturevalue("pg_server").sql(f"SELECT pg_terminate_backend({lease.conn.info.backend_pid})")
        time.sleep(0.2)
    else:
        raise AssertionError(f"no way to expire a lease of {store.caps.name}")


def test_foreign_collection_refused_untouched(uri, name, request):
    make_foreign(request, uri, name)
    with owned(uri, name) as (store, _, _):
        assert store.exists() and store.recorded() is None
        with pytest.raises(StoreError, match="not made by ingest"):
            store.ensure_collection("model-a", DIM, "null")
        with pytest.raises(StoreError, match="not made by ingest"):
            store.drop()
        assert store.exists()
    assert foreign_rows(request, uri, name) == 1


def make_foreign(request, uri: str, name: str) -> None:
    """Another tool's collection named `name`, holding one row."""
    store = open_store(uri, name, 20)
    try:
        if store.caps.name.startswith("Milvus"):
            store.call("create", "create_collection", name, dimension=4)
            store.call("insert", "insert", name, [{"id": 1, "vector": [0.1, 0.2, 0.3, 0.4]}])
            store.flush()
        elif store.caps.name.startswith("PostgreSQL"):
            request.getfixturevalue("pg_server").sql(f'CREATE TABLE "{name}" (id text PRIMARY KEY, body text); '
                                                     f"INSERT INTO \"{name}\" VALUES ('1', 'theirs')")
        elif store.caps.name == "LanceDB":
            store.db.create_table(name, [{"id": "1", "vector": [0.1, 0.2, 0.3, 0.4]}])
        else:
            from qdrant_client import models

            store.lock()
            store.client.create_collection(name, vectors_config=models.VectorParams(size=4, distance=models.Distance.DOT))
            store.client.upsert(name, [models.PointStruct(id=1, vector=[0.1, 0.2, 0.3, 0.4])])
    finally:
        store.close()


def foreign_rows(request, uri: str, name: str) -> int:
    store = open_store(uri, name, 20)
    try:
        if store.caps.name.startswith("Milvus"):
            store.call("load", "load_collection", name)
            return len(store.call("count", "query", name, filter="id >= 0", output_fields=["id"]))
        if store.caps.name.startswith("PostgreSQL"):
            return request.getfixturevalue("pg_server").sql(f'SELECT count(*) FROM "{name}"')[0][0]
        if store.caps.name == "LanceDB":
            return store.table().count_rows()
        store.lock()
        return store.client.count(name).count
    finally:
        store.close()


def test_planted_phrase_found_first_in_each_mode(uri, name):
    rng = np.random.default_rng(7)
    texts = [f"filler paragraph {i} about quarterly revenue and operating costs" for i in range(40)]
    texts[23] = "our mascot is a purple octopus that hides under the pier"
    vectors = rng.normal(size=(40, DIM))
    with owned(uri, name) as (store, _, _):
        store.ensure_collection("model-a", DIM, "null")
        store.upsert_columns(columns("deck.pptx", "d1", texts, vectors))
        store.upsert_columns(columns("other.txt", "o1", ["an octopus recipe", "purple paint"]))
        store.flush()
        query = vectors[23] / np.linalg.norm(vectors[23])
        for mode in store.caps.modes:
            hits = store.search(query.tolist(), 5, mode, "Where does the purple octopus hide?")
            assert hits and hits[0]["text"] == texts[23], (mode, hits[:2])
            assert hits[0]["source"] == "deck.pptx" and hits[0]["page"] == 24 and hits[0]["chunk"] == 23
            assert hits[0]["title"] == "A title" and hits[0]["headings"] == "Part > Section"
        assert set(store.caps.modes) == {"dense", "bm25", "hybrid"}


@pytest.mark.slow
def test_errors_classed_as_the_files_or_the_runs(uri, name):
    with owned(uri, name) as (store, _, _):
        store.ensure_collection("model-a", DIM, "null")
        bad = columns("bad.txt", "b", ["x"])
        bad = Columns(bad.ids, bad.vectors[:, :4], *list(bad.__dict__.values())[2:])    # the wrong dimension
        with pytest.raises(StoreRejected):
            store.upsert_columns(bad)
        store.upsert_columns(columns("good.txt", "g", ["fine"]))       # the store still takes other files' rows
    port = _closed_port()
    dead = {"milvus-lite": None, "milvus": f"http://127.0.0.1:{port}",
            "postgresql": f"postgresql://u:s3cret@127.0.0.1:{port}/db", "qdrant-local": f"qdrant://127.0.0.1:{port}",
            "lancedb": None}
    target = dead[_kind(uri)]
    if target is None:
        return
    store = open_store(target, name, 3)
    try:
        with pytest.raises(StoreError) as err:
            store.exists()
        assert not isinstance(err.value, StoreRejected) and "s3cret" not in str(err.value)
        assert "\n" not in str(err.value)
    finally:
        store.close()


def _kind(uri: str) -> str:
    from ingest.store import kind

    return kind(uri)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
