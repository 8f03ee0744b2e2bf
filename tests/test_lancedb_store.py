"""Issue 39: what LanceDB promises beyond the store contract (tests/test_store_contract.py) and the end-to-end
store tests (tests/test_stores_e2e.py), through the real CLI and real kills: a changed file's old or new
version, never both nor neither, whenever a run with two writer processes is SIGKILLed; a second run refused
in one line while searches read the store; bad input refused in one line with nothing changed; the vector
index built past INDEX_ROWS; the install hint and a scheme no store knows."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_env, ingest
from test_last_good_copy import _without_permission_override
from test_store_contract import DIM, columns
from test_stores_e2e import rows_of, run
from ingest.store import StoreError
from ingest.store.factory import open_store
from ingest.store.manifest import Entry, SqliteManifest, manifest_path

CONFIG = '[store]\nwriters = 2\nbatch_size = 16\n[chunking]\nchunk_tokens = 24\noverlap_tokens = 4\n'


def _write(docs: Path, version: str, files: int = 40) -> None:
    docs.mkdir(exist_ok=True)
    for i in range(files):
        (docs / f"f{i:02}.txt").write_text(" ".join(f"{version}-word{i}-{k}" for k in range(60 + i)))


def _versions(uri: str) -> dict[str, dict[str, int]]:
    """source -> {file_hash: rows}."""
    out: dict[str, dict[str, int]] = {}
    for source, file_hash in rows_of(uri):
        out.setdefault(source, {}).setdefault(file_hash, 0)
        out[source][file_hash] += 1
    return out


@pytest.mark.slow
def test_sigkill_at_any_point_leaves_the_old_version_or_the_new(tmp_path: Path) -> None:
    docs, uri = tmp_path / "docs", f"lancedb://{tmp_path / 'lance'}"
    _write(docs, "old")
    assert run(uri, docs, tmp_path, "--backend", "null", config=CONFIG).rc == 0
    old = _versions(uri)
    whole = {h: n for by_hash in old.values() for h, n in by_hash.items()}
    _write(docs, "new")
    seen: list[dict[str, dict[str, int]]] = []
    for delay in (1.5, 3.0, 4.5):      # from the start of the run: loading, writing, committing
        proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", uri, "--backend", "null",
                                 "--report", "report.json", "--quiet"], cwd=tmp_path, env=cli_env(),
                                stderr=subprocess.PIPE, start_new_session=True)
        time.sleep(delay)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        seen.append(_versions(uri))
    res = run(uri, docs, tmp_path, "--backend", "null", config=CONFIG)
    assert res.rc == 0, res.stderr
    new = _versions(uri)
    assert all(len(by_hash) == 1 and not set(by_hash) & set(old[s]) for s, by_hash in new.items())
    whole.update((h, n) for by_hash in new.values() for h, n in by_hash.items())
    for now in seen:
        assert set(now) == set(old)                                   # never neither
        for source, by_hash in now.items():
            assert len(by_hash) == 1, (source, by_hash)               # never both
            assert by_hash.items() <= whole.items()                   # the old version whole, or the new


@pytest.mark.slow
def test_a_second_run_is_refused_while_searches_read_the_store(tmp_path: Path) -> None:
    docs, uri = tmp_path / "docs", f"lancedb://{tmp_path / 'lance'}"
    _write(docs, "first", 10)
    assert run(uri, docs, tmp_path, "--backend", "null").rc == 0
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from ingest.store.factory import open_store\n"
                               "s = open_store(sys.argv[1], 'documents'); s.lock(); print('held', flush=True); "
                               "time.sleep(600)", uri], stdout=subprocess.PIPE, text=True, env=cli_env())
    try:
        assert holder.stdout.readline().strip() == "held"
        second = run(uri, docs, tmp_path, "--backend", "null")
        assert second.rc == 2 and "in use by" in second.stderr and len(second.stderr.strip().splitlines()) == 1
        found = ingest("search", "first-word3-5", "--mode", "bm25", "--json", "--store", uri, cwd=tmp_path)
        assert found.rc == 0 and json.loads(found.stdout)[0]["source"] == "f03.txt", found.stderr
        status = ingest("status", "--json", "--store", uri, cwd=tmp_path)
        assert status.rc == 0 and json.loads(status.stdout)["in_use_by"].startswith("ingest pid")
    finally:
        holder.kill()
        holder.wait(timeout=30)


def _one_line(res) -> None:
    assert res.rc == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr


@pytest.mark.slow
def test_bad_input_is_one_line_and_changes_nothing(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    _write(docs, "x", 3)
    before = sorted(p.name for p in docs.iterdir())
    res = run(f"lancedb://{docs}", docs, tmp_path, "--backend", "null")          # a folder of documents
    _one_line(res)
    assert "folder of other files" in res.stderr and sorted(p.name for p in docs.iterdir()) == before
    assert not Path(f"{docs}.lock").exists()

    import lancedb

    theirs = tmp_path / "theirs"                                                  # a table ingest did not make
    lancedb.connect(str(theirs)).create_table("documents", [{"id": "1", "vector": [0.1, 0.2]}])
    for extra in ((), ("--reembed",)):
        res = run(f"lancedb://{theirs}", docs, tmp_path, "--backend", "null", *extra)
        _one_line(res)
        assert "not made by ingest" in res.stderr
    assert lancedb.connect(str(theirs)).open_table("documents").count_rows() == 1

    other = f"lancedb://{tmp_path / 'dim16'}"                                    # ingest's, another dimension
    store = open_store(other, "documents")
    store.ensure_collection("sentence-transformers/all-MiniLM-L6-v2", DIM, "null")
    store.upsert_columns(columns("a.txt", "h", ["kept"]))
    store.flush()
    store.close()
    res = run(other, docs, tmp_path, "--backend", "null")
    _one_line(res)
    assert "dim 16" in res.stderr and len(rows_of(other)) == 1

    locked = tmp_path / "locked"                                                  # a folder it may not write
    locked.mkdir()
    locked.chmod(0o555)
    try:
        proc = subprocess.run([*_without_permission_override(), sys.executable, "-m", "ingest.cli", "run", "docs",
                               "--store", f"lancedb://{locked / 'store'}", "--backend", "null", "--report", "r.json",
                               "--quiet"], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert not any(locked.iterdir())
    finally:
        locked.chmod(0o755)


def test_the_vector_index_is_built_past_index_rows(tmp_path: Path, monkeypatch) -> None:
    from ingest.store import lancedb as lance_store

    monkeypatch.setattr(lance_store, "INDEX_ROWS", 1000)
    rng = np.random.default_rng(3)
    vectors = rng.normal(size=(1200, DIM))
    store = open_store(f"lancedb://{tmp_path / 'lance'}", "documents")
    store.lock()
    try:
        store.ensure_collection("model-a", DIM, "null")
        store.upsert_columns(columns("big.txt", "b", [f"row {i}" for i in range(1200)], vectors))
        store.flush()
        store.finish()
        assert any(i.columns == ["vector"] for i in store.table().list_indices())
        query = vectors[700] / np.linalg.norm(vectors[700])
        assert store.search(query.tolist(), 3)[0]["text"] == "row 700"
        assert store.search(None, 3, "bm25", "row 700")[0]["text"] == "row 700"
    finally:
        store.close()


def test_the_install_hint_and_a_scheme_no_store_knows(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['lancedb'] = None\nfrom ingest.store.factory import open_store\n"
            "open_store(sys.argv[1], 'documents')")
    proc = subprocess.run([sys.executable, "-c", code, f"lancedb://{tmp_path}"], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert "pip install 'ingest[lancedb]'" in proc.stderr.strip().splitlines()[-1]
    with pytest.raises(StoreError, match="scheme no store knows.*lancedb://"):
        open_store("lance://x", "documents")
    (tmp_path / "docs").mkdir()
    res = run("weird://host/x", tmp_path / "docs", tmp_path, "--backend", "null")
    _one_line(res)
    assert "postgresql://" in res.stderr


class _KilledBeforeRecord(SqliteManifest):
    """The manifest of a run killed between its store commit and its record: the record never happens."""

    def record(self, entries) -> None:
        raise KeyboardInterrupt("killed")


def test_new_files_are_appended_and_a_commit_killed_before_its_record_leaves_no_duplicates(tmp_path: Path) -> None:
    uri = f"lancedb://{tmp_path / 'lance'}"
    path = manifest_path(uri, "documents")

    def commit(manifest: SqliteManifest, sources: list[str], file_hash: str = "h1") -> None:
        store = open_store(uri, "documents")
        store.lock()
        try:
            store.ensure_collection("model-a", DIM, "null")
            for s in sources:
                store.upsert_columns(columns(s, file_hash, [f"{s} row {i}" for i in range(5)]))
            store.commit(manifest, {}, [Entry(s, 1, 1, file_hash, "ingested", 5, "txt", "{}") for s in sources], [])
        finally:
            store.close()

    manifest = SqliteManifest(path)
    commit(manifest, ["a.txt", "b.txt"])                    # a first load: appended
    with pytest.raises(KeyboardInterrupt):                  # then a run killed between its commit and its record
        commit(_KilledBeforeRecord(path), ["c.txt"])
    assert sorted(s for s, _ in rows_of(uri)) == ["a.txt"] * 5 + ["b.txt"] * 5 + ["c.txt"] * 5
    commit(manifest, ["c.txt", "d.txt"])                    # the rerun: the table is out of step, so it merges
    rows = rows_of(uri)
    assert sorted(s for s, _ in rows) == sorted(["a.txt", "b.txt", "c.txt", "d.txt"] * 5)
    assert manifest.chunks_recorded() == 20
    commit(manifest, ["e.txt"])                             # in step again: appended, still one copy
    assert len(rows_of(uri)) == 25
    manifest.close()


def test_a_record_that_fails_leaves_the_same_store_merging(tmp_path: Path) -> None:
    """A commit whose record raises (a full disk) in a process that goes on (watch): its next commits merge."""
    uri = f"lancedb://{tmp_path / 'lance'}"
    path = manifest_path(uri, "documents")
    store = open_store(uri, "documents")
    store.lock()
    try:
        store.ensure_collection("model-a", DIM, "null")
        entry = Entry("a.txt", 1, 1, "h1", "ingested", 5, "txt", "{}")
        for manifest in (_KilledBeforeRecord(path), SqliteManifest(path)):
            store.upsert_columns(columns("a.txt", "h1", [f"row {i}" for i in range(5)]))
            with pytest.raises(KeyboardInterrupt) if isinstance(manifest, _KilledBeforeRecord) else nullcontext():
                store.commit(manifest, {}, [entry], [])
        assert rows_of(uri) == [("a.txt", "h1")] * 5
    finally:
        store.close()
