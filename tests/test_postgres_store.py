"""The PostgreSQL + pgvector store on a real server (`pg_server`: one per session), without the pipeline:
upserts, the one-transaction commit, the manifest, ownership and its loss, foreign tables, search in
every mode, and the one-line errors (never a password)."""
from __future__ import annotations

import multiprocessing
import uuid

import numpy as np
import pytest

from ingest.store.base import LeaseLost, StoreError, StoreRejected
from ingest.store.manifest import Entry
from ingest.store.postgres import PostgresStore
from ingest.store.schema import Columns
from ingest.store.factory import open_store, store_at

DIM = 8


def unit(i: int) -> list[float]:
    """A unit vector near axis i % DIM, different for each i."""
    v = np.full(DIM, 0.01 * (i // DIM + 1), dtype=np.float32)
    v[i % DIM] = 1.0
    return list(v / np.linalg.norm(v))


def columns(source: str, file_hash: str, texts: list[str], first: int = 0, ids: list[str] | None = None) -> Columns:
    n = len(texts)
    return Columns(ids or [f"{source}:{file_hash}:{i}" for i in range(n)],
                   np.array([unit(first + i) for i in range(n)], dtype=np.float32), texts, [source] * n, [1] * n,
                   list(range(n)), ["txt"] * n, [file_hash] * n, ["Title"] * n, ["A > B"] * n, ["text"] * n,
                   ["1,2,3,4"] * n, texts)


def entry(source: str, file_hash: str, chunks: int = 1) -> Entry:
    return Entry(source, 10, 20, file_hash, "ingested", chunks, "txt", "{}")


@pytest.fixture
def store(pg_uri: str):
    """A new collection (ingest's table made) in the session's database."""
    s = open_store(pg_uri, "c_" + uuid.uuid4().hex[:12], 30)
    s.ensure_collection("model-x", DIM, "null")
    yield s
    s.close()


def test_uri_picks_postgres_and_hides_the_password(pg_server, store):
    assert isinstance(store, PostgresStore) and store.caps.transactional and not store.caps.embedded
    assert pg_server.password not in store.uri and ":***@" in store.uri
    assert store.recorded() == ("model-x", DIM, "null") and store.schema() == (2, True)
    assert pg_server.password not in repr(store.endpoint().uri)


def test_upsert_is_idempotent_and_resends_go_through_the_upsert_path(store):
    store.upsert_columns(columns("a.txt", "h1", ["one", "two", "three"]))
    again = columns("a.txt", "h1", ["one", "two", "three changed"])
    store.upsert_columns(again)                       # every id is there: COPY fails, the temp-table upsert runs
    store.upsert_columns(again)
    rows = sorted(store.rows(["id", "text", "chunk"]), key=lambda r: r["chunk"])
    assert [r["text"] for r in rows] == ["one", "two", "three changed"]


def test_first_load_by_copy_then_the_hnsw_index(store):
    store.upsert_columns(columns("a.txt", "h1", [f"chunk {i}" for i in range(300)]))
    assert not store.has_index()                      # not before the load: HNSW inserts cost ~1 ms a row
    store.finish()
    assert store.has_index()
    store.upsert_columns(columns("b.txt", "h1", ["later"]))
    assert len(store.rows(["id"])) == 301


def test_finish_on_an_empty_table_builds_nothing_and_is_idempotent(store):
    store.finish()
    assert not store.has_index()
    store.upsert_columns(columns("a.txt", "h1", ["x", "y"]))
    store.finish()
    store.finish()
    assert store.has_index()


def test_two_versions_then_exactly_one_in_one_transaction(store):
    manifest, lease = store.own()
    try:
        store.upsert_columns(columns("a.txt", "old", ["a", "b", "c"]))
        store.upsert_columns(columns("gone.txt", "g", ["z"]))
        store.commit(manifest, {}, [entry("a.txt", "old", 3), entry("gone.txt", "g")], [])
        store.upsert_columns(columns("a.txt", "new", ["a2", "b2"]))
        assert {r["file_hash"] for r in store.rows(["file_hash"])} == {"old", "new", "g"}
        # a commit that fails part-way (an entry PostgreSQL cannot hold) changes nothing: the delete rolls back
        with pytest.raises(StoreRejected):
            store.commit(manifest, {"a.txt": "new"}, [entry("bad\x00.txt", "x")], [])
        assert sorted(r["file_hash"] for r in store.rows(["file_hash"])) == ["g", "new", "new", "old", "old", "old"]
        assert manifest.all()["a.txt"].file_hash == "old"
        store.commit(manifest, {"a.txt": "new", "gone.txt": ""}, [entry("a.txt", "new", 2)], ["gone.txt"])
        assert sorted(r["text"] for r in store.rows(["text"])) == ["a2", "b2"]
        assert manifest.all() == {"a.txt": entry("a.txt", "new", 2)}
    finally:
        lease.release()


def test_manifest_round_trip(store):
    assert not store.has_manifest() and store.summary() is None and store.holder() is None
    manifest, lease = store.own()
    try:
        assert store.has_manifest()
        manifest.set_meta("settings", '{"a": 1}')
        manifest.set_meta("settings", '{"a": 2}')
        assert manifest.get_meta("settings") == '{"a": 2}' and manifest.get_meta("nothing") is None
        odd = "dir/it's \"quoted\"\n\tnamé 🐙.txt"
        manifest.record([entry("a.txt", "h1", 3), entry(odd, "h2", 4)])
        manifest.record([entry("a.txt", "h3", 5)])
        assert manifest.all() == {"a.txt": entry("a.txt", "h3", 5), odd: entry(odd, "h2", 4)}
        summary = store.summary()
        assert summary.meta == {"settings": '{"a": 2}'} and summary.counts == [("txt", "ingested", 2, 9)]
        manifest.remove([odd])
        assert list(manifest.all()) == ["a.txt"]
        manifest.clear()
        assert manifest.all() == {} and manifest.get_meta("settings") is None
        assert store.holder() is not None                 # clear keeps the lease
    finally:
        lease.release()
    assert store.holder() is None


def test_a_second_owner_is_refused_naming_the_holder(store):
    _, lease = store.own()
    other = PostgresStore(store.address, store.collection, 30)
    try:
        with pytest.raises(StoreError) as err:
            other.own()
        message = str(err.value)
        assert "\n" not in message and "in use by the run on" in message and "(pid " in message
        assert "since" in store.holder()
    finally:
        lease.release()
        other.close()
    _, lease = other.own()                            # free again once released
    lease.release()


def test_takeover_after_the_owner_session_ends_then_the_old_owner_is_fenced(pg_server, store):
    manifest, lease = store.own()
    store.upsert_columns(columns("a.txt", "old", ["a"]))
    manifest.record([entry("a.txt", "old")])
    store.upsert_columns(columns("a.txt", "new", ["b"]))
    pg_server.sql(f"SELECT pg_terminate_backend({lease.conn.info.backend_pid})")
    other = PostgresStore(store.address, store.collection, 30)
    manifest2, lease2 = other.own()                   # the lock went with the session
    try:
        with pytest.raises(LeaseLost):
            manifest.fence()
        with pytest.raises(LeaseLost):
            store.commit(manifest, {"a.txt": "new"}, [entry("a.txt", "new")], [])
        with pytest.raises(LeaseLost):
            lease.check()
        assert sorted(r["file_hash"] for r in store.rows(["file_hash"])) == ["new", "old"]
        assert manifest2.all()["a.txt"].file_hash == "old"
        assert "pid" in other.holder()
    finally:
        lease.release()
        lease2.release()
        other.close()


def test_a_foreign_table_is_refused_and_untouched(pg_server, pg_uri):
    name = "foreign_" + uuid.uuid4().hex[:8]
    pg_server.sql(f'CREATE TABLE "{name}" (id int, note text); INSERT INTO "{name}" VALUES (1, \'theirs\')')
    s = open_store(pg_uri, name, 30)
    try:
        assert s.exists() and s.recorded() is None
        for attempt in (lambda: s.ensure_collection("model-x", DIM, "null"), s.drop):
            with pytest.raises(StoreError) as err:
                attempt()
            assert "not made by ingest" in str(err.value) and "\n" not in str(err.value)
        assert pg_server.sql(f'SELECT id, note FROM "{name}"') == [(1, "theirs")]
        pg_server.sql(f'CREATE TABLE "{name}_2__files" (source text)')     # a manifest table of another tool
        with pytest.raises(StoreError, match="not made by ingest"):
            open_store(pg_uri, name + "_2", 30).own()
    finally:
        s.close()


def test_another_model_or_shape_is_refused(pg_server, store):
    with pytest.raises(StoreError, match="--reembed"):
        store.ensure_collection("model-y", DIM, "null")
    pg_server.sql(f'ALTER TABLE "{store.collection}" ADD COLUMN extra int')
    with pytest.raises(StoreError, match="columns ingest makes"):
        store.ensure_collection("model-x", DIM, "null")


def test_a_planted_phrase_is_found_first_in_every_mode(store):
    texts = [f"filler chunk number {i} about ordinary matters of the day" for i in range(60)]
    texts[37] = "the purple octopus hides under the old pier"
    store.upsert_columns(columns("sea.txt", "h", texts))
    store.finish()
    question = "Where does the purple octopus hide?"
    for mode in ("dense", "bm25", "hybrid"):
        hits = store.search(unit(37), 5, mode, question)
        assert hits[0]["text"] == texts[37], mode
        assert hits[0]["source"] == "sea.txt" and hits[0]["page"] == 1 and hits[0]["bbox"] == [1.0, 2.0, 3.0, 4.0]
    assert store.search(None, 5, "bm25", "!!! ???") == []
    assert store.search(unit(37), 5, "dense")[0]["score"] == pytest.approx(1.0, abs=1e-5)


def test_a_nul_byte_fails_the_rows_not_the_store(store):
    for bad in (columns("a.txt", "h", ["bad\x00text"]), columns("b\x00.txt", "h", ["ok"]),
                columns("c.txt", "h", ["ok"], ids=["id\x00"])):
        with pytest.raises(StoreRejected, match="NUL"):
            store.upsert_columns(bad)
    with pytest.raises(StoreRejected):                 # a vector of another dimension: the rows' fault too
        store.upsert_columns(Columns(["x"], np.ones((1, DIM + 1), np.float32), ["t"], ["s"], [0], [0], ["txt"],
                                     ["h"], [""], [""], ["text"], [""], ["t"]))
    store.upsert_columns(columns("ok.txt", "h", ["fine"]))
    assert [r["text"] for r in store.rows(["text"])] == ["fine"]


def test_connection_errors_are_one_line_without_the_password(pg_server, monkeypatch):
    secret = "s3cr3t-" + uuid.uuid4().hex[:6]
    cases = [pg_server.uri(password=secret), pg_server.uri(database="no_such_db"),
             f"postgresql://postgres:{secret}@127.0.0.1:1/ingest"]
    for uri in cases:
        with pytest.raises(StoreError) as err:
            open_store(uri, "docs", 5).exists()
        message = str(err.value)
        assert "\n" not in message and secret not in message and pg_server.password not in message, message
    assert "password authentication failed" in str(pytest.raises(StoreError, open_store(cases[0], "d", 5).exists).value)
    monkeypatch.setenv("PGPASSWORD", pg_server.password)      # libpq's variables apply
    s = open_store(f"postgresql://postgres@127.0.0.1:{pg_server.port}/ingest", "docs", 5)
    assert s.exists() is False
    s.close()


def test_socket_uri(pg_server):
    s = open_store(pg_server.socket_uri(), "c_" + uuid.uuid4().hex[:8], 10)
    s.ensure_collection("model-x", DIM, "null")
    assert s.recorded() == ("model-x", DIM, "null")
    s.close()


def test_missing_extension_without_privilege_is_one_line_and_changes_nothing(pg_server):
    pg_server.sql("CREATE ROLE plain LOGIN PASSWORD 'plainpw'")
    pg_server.database("novector", owner="plain")
    s = open_store(pg_server.uri("novector", "plain", "plainpw"), "docs", 10)
    with pytest.raises(StoreError) as err:
        s.ensure_collection("model-x", DIM, "null")
    assert "CREATE EXTENSION vector" in str(err.value) and "plainpw" not in str(err.value)
    assert not s.exists()
    s.close()


def test_long_collection_name_is_refused(pg_uri):
    with pytest.raises(StoreError, match="too long"):
        open_store(pg_uri, "x" * 60, 5).exists()


def _write_in_child(endpoint, q) -> None:
    store = store_at(endpoint)
    store.upsert_columns(columns("child.txt", "h", ["from another process"]))
    q.put(store.conn.info.backend_pid)


def test_writer_processes_open_their_own_connection(store):
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_write_in_child, args=(store.endpoint(), q))
    p.start()
    child_backend = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0 and child_backend != store.conn.info.backend_pid
    assert [r["text"] for r in store.rows(["text"])] == ["from another process"]
