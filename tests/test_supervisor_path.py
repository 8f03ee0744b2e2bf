"""The supervisor's per-file path (issue 44): small files batched to the loaders (a crash or a hang costs only
its file), the reuse keys made in the loader, the vector cache written by the writer processes (the stub
backend), values pickled by columns, and the encode pool fed groups as arrays, in order."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from conftest import cli_env, sqlite

from ingest.api import EncodePool, Pretokenized
from ingest.chunk import ChunkSpec, PageChunks, chunk_keys, page_chunks
from ingest.files import FileRef, Outcome, evolve
from ingest.model_ref import resolve_model
from ingest.store.rows import Row, Rows
from ingest.store.writers import Batch, Segment

MODEL = resolve_model("default")
WORDS = "river mountain engine harbour lantern orchard copper glacier violin meadow falcon circuit".split()


def paragraphs(seed: int, n: int) -> str:
    rng = np.random.default_rng(seed)
    return "\n\n".join(" ".join(rng.choice(WORDS, size=120)) + "." for _ in range(n))


def cli(args: list[str], cwd: Path, timeout: float = 300, **env: str) -> tuple[int, str, dict | None]:
    proc = subprocess.run([sys.executable, "-m", "ingest.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**cli_env(), **env})
    report = cwd / "report.json"
    return proc.returncode, proc.stderr, json.loads(report.read_text()) if report.exists() else None


@pytest.mark.slow
def test_a_crash_and_a_hang_in_a_batch_of_small_files_cost_only_their_own_files(work: Path) -> None:
    """20 small files of a plugin's format, batched 16 to a task (INGEST_BATCH_FORMATS): the batch holding a
    file that kills its worker and one that hangs fails whole, and is sent again file by file; only those two
    fail, each with its own reason, and every other file is ingested."""
    for i in range(20):
        text = "CRASH" if i == 3 else "HANG" if i == 7 else paragraphs(i, 2)
        (work / "docs" / f"f{i:02d}.crashtxt").write_text(text)
    (work / "config.toml").write_text('[loaders]\nplugins = ["txt_crash_loader"]\n[loaders.txt]\nworkers = 1\n'
                                      'timeout_s = 4\n')
    started = time.monotonic()
    rc, err, report = cli(["run", "docs", "--store", "null://", "--backend", "null", "--report", "report.json",
                           "--quiet", "--config", "config.toml"], work, INGEST_BATCH_FORMATS="crashtxt")
    assert rc == 1, err[-2000:]
    files = {f["path"]: f for f in report["files"]}
    failed = {p: f["error"] for p, f in files.items() if f["status"] != "ingested"}
    assert set(failed) == {"f03.crashtxt", "f07.crashtxt"}, failed
    assert "retried once in a fresh worker" in failed["f03.crashtxt"]
    assert "timeout after 4 s" in failed["f07.crashtxt"]
    assert sum(f["status"] == "ingested" for f in files.values()) == 18
    assert time.monotonic() - started < 120


@pytest.mark.slow
def test_the_stub_backend_fills_the_vector_cache_from_the_writers_and_a_copy_reuses_it(work: Path) -> None:
    """With the stub backend (null's vectors taken as a model's) the vector cache beside the store gets every
    chunk's row from the writer processes, replacing a cache file of the old layout (a WITHOUT ROWID table);
    a copy of the folder into another collection takes every vector from it and encodes nothing."""
    for i in range(6):
        (work / "docs" / f"doc{i}.txt").write_text(paragraphs(i, 3))
    cache = work / "store.db.vectors.sqlite"
    with sqlite(cache) as con:           # an older ingest's cache: rebuilt in the new layout
        con.execute("CREATE TABLE vectors (key BLOB PRIMARY KEY, vec BLOB NOT NULL, used REAL NOT NULL) WITHOUT ROWID")
        con.execute("INSERT INTO vectors VALUES (x'00', x'00', 0)")
    base = ["--store", str(work / "store.db"), "--backend", "stub", "--report", "report.json", "--quiet"]
    rc, err, report = cli(["run", "docs", *base], work)
    assert rc == 0, err[-2000:]
    chunks = report["totals"]["chunks"]
    assert chunks >= 6 and report["totals"]["encoded_chunks"] == chunks
    with sqlite(cache) as con:
        (sql,) = con.execute("SELECT sql FROM sqlite_master WHERE name = 'vectors'").fetchone()
        (rows,) = con.execute("SELECT count(*) FROM vectors").fetchone()
    assert "WITHOUT ROWID" not in sql.upper() and rows == chunks
    rc, err, report = cli(["run", "docs", *base, "--collection", "copy"], work)
    assert rc == 0, err[-2000:]
    assert report["totals"]["reused_chunks"] == chunks and report["totals"]["encoded_chunks"] == 0


def test_the_keys_a_loader_makes_are_the_supervisors() -> None:
    secret = b"s" * 32
    spec = ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 40, 8, key_secret=secret)
    page = page_chunks(1, paragraphs(3, 4), spec)
    assert len(page.chunks) > 3 and len(page.keys) == 16 * len(page.chunks)
    expected = chunk_keys(secret, np.array(page.ids), np.array(page.lengths))     # as Reuse.plan makes them
    assert [page.keys[i:i + 16] for i in range(0, len(page.keys), 16)] == expected
    assert page_chunks(1, paragraphs(3, 4), replace(spec, key_secret=b"")).keys == b""


def test_pickled_by_columns_the_values_come_back_equal() -> None:
    page = PageChunks(2, ("a", "b c"), np.arange(6, dtype=np.int32), np.array([2, 4], np.int32), "T", 1, 3, "H > I",
                      "table", ("1,2,3,4", "5,6,7,8"), 1, "'x'", b"k" * 32)
    back = pickle.loads(pickle.dumps(page))
    assert {k: v for k, v in vars(back).items() if k not in ("ids", "lengths")} == \
        {k: v for k, v in vars(page).items() if k not in ("ids", "lengths")}
    assert back.ids.tolist() == page.ids.tolist() and back.lengths.tolist() == page.lengths.tolist()
    rows = tuple(Row(p, f"text {p}", "T", "H", "text", "", "ctx") for p in (None, 1, 2))
    segment = Segment("a/b.txt", "txt", "h" * 64, 5, Rows.of(rows), np.arange(12, dtype=np.float32).reshape(3, 4))
    (got,) = pickle.loads(pickle.dumps(Batch((segment,)))).segments
    assert (got.source, got.fmt, got.file_hash, got.start, tuple(got.chunks)) == ("a/b.txt", "txt", "h" * 64, 5, rows)
    assert got.vectors.dtype == np.float32 and got.vectors.tolist() == segment.vectors.tolist()
    other = Segment("d.txt", "md", "g" * 64, 0, Rows.of(rows[:2]), np.ones((2, 4), np.float32))
    both = pickle.loads(pickle.dumps(Batch((segment, other)))).segments      # one set of columns for the batch
    assert [(s.source, s.fmt, s.file_hash, s.start, tuple(s.chunks), s.vectors.tolist()) for s in both] == \
        [(s.source, s.fmt, s.file_hash, s.start, tuple(s.chunks), s.vectors.tolist()) for s in (segment, other)]
    empty = pickle.loads(pickle.dumps(Segment("c.txt", "txt", "h", 0, Rows(), np.zeros((0, 4), np.float32))))
    assert tuple(empty.chunks) == () and empty.vectors.shape == (0, 4)


def test_a_batchs_cache_keys_travel_with_its_rows_and_the_writer_caches_only_keyed_rows(tmp_path: Path) -> None:
    from ingest.store.factory import open_store
    from ingest.store.writers import NO_KEY, Ack, upsert
    from ingest.vector_cache import VectorCache, put_written

    rows = tuple(Row(None, f"text {i}", "", "", "text", "", "") for i in range(3))
    keys = [bytes([i + 1]) * 16 for i in range(3)]
    keyed = Segment("a.txt", "txt", "h", 0, Rows.of(rows), np.arange(12, dtype=np.float32).reshape(3, 4),
                    keys[0] + NO_KEY + keys[2])                 # the middle row is not to be cached
    bare = Segment("b.txt", "txt", "h", 0, Rows.of(rows[:2]), np.ones((2, 4), np.float32))
    head, tail = keyed.cut(1)
    assert (head.keys, tail.keys) == (keys[0], NO_KEY + keys[2])
    batch = pickle.loads(pickle.dumps(Batch((keyed, bare))))
    assert batch.keys() == keys[0] + NO_KEY + keys[2] + NO_KEY * 2 and Batch((bare,)).keys() == b""
    target = (str(tmp_path / "cache.sqlite"), 10.0, 4)
    store = open_store("null://", "documents")
    assert upsert(store, batch, (put_written, target)) == Ack(5)
    cache = VectorCache(tmp_path / "cache.sqlite", 10.0, 4)
    got = cache.get([*keys, NO_KEY])
    assert sorted(got) == [keys[0], keys[2]] and got[keys[2]].tolist() == [8.0, 9.0, 10.0, 11.0]
    cache.close()


def test_rows_as_columns_index_slice_join_and_pickle_as_rows_do() -> None:
    a = [Row(p, f"text {p}", "T", "H", "text", "", "ctx") for p in (None, 1, 2)]
    b = [Row(7, "seven", "U", "", "table", "1,2,3,4", "c2")]
    rows = Rows.join([Rows.of(a), Rows.of(b)])
    assert len(rows) == 4 and list(rows) == a + b and rows[3] == b[0] and list(rows[1:3]) == a[1:3]
    assert list(rows.texts) == [r.text for r in a + b] and len(Rows()) == 0 and not Rows() and list(Rows()) == []
    assert list(pickle.loads(pickle.dumps(rows))) == a + b
    assert list(Rows.join([Rows.of(a)])) == a


def test_evolve_is_replace_without_its_cost() -> None:
    ref = FileRef(3, "a.txt", "/x/a.txt", 10, 20)
    assert evolve(ref, fmt="txt") == replace(ref, fmt="txt") and ref.fmt == ""
    assert evolve(Outcome("ingested", chunks=2), status="failed").status == "failed"
    with pytest.raises(TypeError):
        evolve(ref, nonsense=1)


def test_many_small_groups_come_back_in_order_and_whole() -> None:
    """Groups of 0-3 texts, a document pipeline's small files, through the pool as arrays: each group's rows
    come back in order (the feeder wakes the coordinator only when it must: workers/encode/_stream.py NOTE)."""
    rng = np.random.default_rng(1)
    sizes = rng.integers(0, 4, size=600)
    with EncodePool(backend="null", pretokenized=True) as pool:
        def groups():
            for key, n in enumerate(sizes):
                lengths = rng.integers(3, 40, size=n).astype(np.int32)
                yield key, Pretokenized([f"t{key}-{i}" for i in range(n)], np.ones(int(lengths.sum()), np.int32),
                                        lengths)
        out = [(key, rows.shape) for key, rows in pool.encode_groups(groups())]
    assert [k for k, _ in out] == list(range(len(sizes)))
    assert [s[0] for _, s in out] == sizes.tolist() and all(s[1] == 384 for _, s in out if s[0])


def _finished(seq: int, text: str, spec: ChunkSpec, old_hash: str | None = None):
    from ingest.files import Finished

    chunks = page_chunks(None, text, spec)
    ref = FileRef(seq, f"f{seq:02d}.txt", f"/nowhere/f{seq:02d}.txt", fmt="txt", file_hash=f"h{seq}")
    return Finished(ref, Outcome("ingested", chunks=len(chunks.chunks)), (chunks,), old_hash, record=True)


def test_small_files_waiting_together_share_one_encode_group() -> None:
    """Whole small files already on the feed go to the pool as one group (ingest/encode.py NOTE: merged groups),
    each with the span of its rows, in file order; a file with no chunks, and one whose previous rows reuse reads
    from the store, go alone; a file never waits for the next to arrive."""
    import threading

    from ingest.config import load_config
    from ingest.encode import EncodeStage, Merged, members
    from ingest.files import Finished
    from ingest.store.factory import open_store

    cfg = load_config(None)
    settings = {**cfg["model"], "backend": "null"}
    spec = ChunkSpec(MODEL.tokenizer_file, MODEL.max_seq_length, 200, 30)
    stage = EncodeStage(MODEL, settings, None, lambda e: None, threading.Event())
    stage.reuse.store = open_store("null://", "documents")     # the rows of changed files are read from a store
    files = [_finished(i, paragraphs(i, 1 + i % 3), spec) for i in range(6)]
    empty = Finished(FileRef(6, "f06.txt", "/nowhere/f06.txt", fmt="txt"), Outcome("empty", "no text found"),
                     record=True)
    changed = _finished(7, paragraphs(7, 2), spec, old_hash="old")
    for f in (*files, empty, changed, _finished(8, paragraphs(8, 1), spec)):
        stage.feed.put(f)
    stage.feed.put(None)
    try:
        plans = list(stage._groups())
    finally:
        stage.close()
    first = plans[0]
    assert isinstance(first.part, Merged) and [p.file.ref.seq for p, _, _ in first.part.members] == list(range(6))
    spans = [(lo, hi) for _, lo, hi in first.part.members]
    sizes = [f.chunk_count for f in files]
    assert spans == [(sum(sizes[:i]), sum(sizes[:i + 1])) for i in range(6)] and len(first.keys) == sum(sizes)
    assert first.encoded == sum(sizes) and len(first.tokens) == sum(sizes)
    ids = np.concatenate([f.token_ids()[0] for f in files])
    assert np.array_equal(first.tokens.ids, ids)
    assert [r.text for r in first.part.chunks] == [r.text for f in files for r in f.chunk_texts()]
    rest = [[p.file.ref.seq for p, _, _ in members(plan)] for plan in plans[1:]]
    assert rest == [[6], [7], [8]]                      # alone: no chunks; rows in the store; the last one


def test_a_poisoned_chunk_in_a_shared_group_fails_only_its_own_file(work: Path) -> None:
    """30 small files, two with a chunk the encoder fails on every attempt: those two fail, naming the chunk,
    and the others, which shared encode groups with them, are ingested whole."""
    for i in range(30):
        text = paragraphs(i, 3)
        if i in (5, 17):
            text = "\n\n".join([*text.split("\n\n")[:2], "POISON " + paragraphs(100 + i, 1)])
        (work / "docs" / f"f{i:02d}.txt").write_text(text)
    rc, err, report = cli(["run", "docs", "--store", "store.db", "--backend", "null", "--report", "report.json",
                           "--quiet"], work, INGEST_FAULT=json.dumps({"match": "POISON", "action": "raise"}))
    assert rc == 1, err[-2000:]
    files = {f["path"]: f for f in report["files"]}
    failed = {p: f["error"] for p, f in files.items() if f["status"] != "ingested"}
    assert set(failed) == {"f05.txt", "f17.txt"}, failed
    assert all("chunk 2 could not be encoded" in e and "injected fault" in e for e in failed.values()), failed
    ingested = [f for f in files.values() if f["status"] == "ingested"]
    assert len(ingested) == 28 and all(f["encoded"] == f["chunks"] == 3 for f in ingested)
    with sqlite(work / "store.db.documents.manifest.sqlite") as con:
        recorded = {s for (s,) in con.execute("SELECT source FROM files")}
    assert recorded == {p for p in files if p not in failed}


def test_small_files_sniffed_by_their_loader_get_the_verdict_the_dispatcher_gave(work: Path) -> None:
    """Small text and Markdown files are sniffed in their loader worker, not by the dispatcher (ingest/sniff.py
    NOTE: deferred sniff): a PDF or a DOCX by a text name is read as what it is, with the sniff's warning, and an
    empty or binary one is skipped or failed with the sniff's words, as a full sniff in the dispatcher says."""
    import docx
    import pymupdf

    from ingest.sniff import sniff

    pdf = pymupdf.open()
    pdf.new_page().insert_text((72, 72), "Tide tables for the northern harbour, printed every spring.")
    document = docx.Document()
    document.add_paragraph("Minutes of the orchard cooperative: the copper roof is repaired.")
    docs = work / "docs"
    (docs / "scan.txt").write_bytes(pdf.tobytes())
    document.save(docs / "minutes.md")
    (docs / "empty.txt").write_bytes(b"")
    (docs / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (docs / "plain.txt").write_text(paragraphs(1, 2))
    rc, err, report = cli(["run", "docs", "--store", "null://", "--backend", "null", "--report", "report.json",
                           "--quiet"], work)
    files = {f["path"]: f for f in report["files"]}
    for name in ("scan.txt", "minutes.md", "empty.txt", "binary.txt", "plain.txt"):
        path = docs / name
        verdict = sniff(FileRef(0, name, str(path), path.stat().st_size), None, "", 100)
        got = files[name]
        if isinstance(verdict, FileRef):
            assert got["status"] == "ingested" and got["format"] == verdict.fmt, got
            assert list(verdict.warnings) == [w for w in got.get("warnings", []) if "despite" in w], got
        else:
            assert (got["status"], got["error"]) == (verdict.outcome.status, verdict.outcome.error), got
    assert files["scan.txt"]["format"] == "pdf" and files["minutes.md"]["format"] == "docx"
    assert files["binary.txt"]["status"] == "failed" and files["empty.txt"]["status"] == "skipped"
    assert rc == 1, err[-2000:]
