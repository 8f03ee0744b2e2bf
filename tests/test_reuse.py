"""Issue 32, items 1-3: a change costs only the change. An edited file re-encodes only its changed chunks (the
others take their vectors from the store's last good copy), equal embedded texts are encoded once per run, a
local cache serves a --reembed into a new collection, and nothing is reused across models, backends or dtypes.
Real CLI, the packaged model where vectors matter (the null backend where only counts do), real stores
(Milvus Lite, PostgreSQL, Qdrant's local mode), a real SIGKILL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import cli_env, ingest, run

NO_CACHE = "[cache]\nvectors_mb = 0\n"
SMALL = "[chunking]\nchunk_tokens = 24\noverlap_tokens = 4\n"
WORDS = ["amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor", "indigo", "juniper", "kelp",
         "lagoon", "marble", "nectar", "obsidian", "prairie", "quartz", "river", "saffron", "tundra"]


def paragraphs(tag: str, n: int) -> list[str]:
    """n different paragraphs of about three 24-token chunks each."""
    return [f"{tag} paragraph {i}: " + " ".join(f"{WORDS[(i * 7 + k) % 20]}-{tag}{i}-{k}" for k in range(30))
            for i in range(n)]


def counts(res, path: str) -> tuple[int, int, int]:
    """(chunks, encoded, reused) of a file in a run's report."""
    f = res.by_path()[path]
    return f["chunks"], f["encoded"], f["reused"]


_VECTORS = """
import json, sys
from ingest.store.factory import open_store
store = open_store(sys.argv[1], sys.argv[2]); store.lock()
print(json.dumps([[r["id"], r["source"], r["file_hash"], r["text"], r["vector"]]
                  for r in store.rows(["id", "source", "file_hash", "text", "vector"])]))
store.close()
"""


def vectors(uri: str, collection: str = "documents") -> dict[str, tuple[str, str, str, np.ndarray]]:
    """id -> (source, file_hash, text, vector) of every row, read by a process of its own."""
    proc = subprocess.run([sys.executable, "-c", _VECTORS, uri, collection], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return {r[0]: (r[1], r[2], r[3], np.asarray(r[4], np.float32))
            for r in json.loads(proc.stdout.strip().splitlines()[-1])}


def same_vectors(a: dict, b: dict) -> None:
    """The same rows, and each vector the one a fresh run makes (cosine >= 0.9999: batches differ in padding)."""
    assert set(a) == set(b)
    for k in b:
        assert a[k][:3] == b[k][:3]
        assert float(a[k][3] @ b[k][3]) >= 0.9999 * float(np.linalg.norm(a[k][3]) * np.linalg.norm(b[k][3])), k


@pytest.mark.slow
def test_an_edited_file_reencodes_only_its_changed_chunks(work: Path) -> None:
    docs = work / "docs"
    text = paragraphs("keep", 12)
    (docs / "a.txt").write_text("\n\n".join(text))
    first = run(docs, work, config=SMALL + NO_CACHE)               # no cache: the vectors come from the store
    assert first.rc == 0, first.stderr
    chunks, encoded, reused = counts(first, "a.txt")
    assert chunks >= 24 and (encoded, reused) == (chunks, 0)

    text[5] = "An edited paragraph: whales sing long songs that carry across the cold ocean."
    (docs / "a.txt").write_text("\n\n".join(text))
    second = run(docs, work, config=SMALL + NO_CACHE)
    assert second.rc == 0, second.stderr
    chunks, encoded, reused = counts(second, "a.txt")
    assert 1 <= encoded <= 4 and reused == chunks - encoded, second.by_path()["a.txt"]
    totals = second.report["totals"]
    assert (totals["encoded_chunks"], totals["reused_chunks"]) == (encoded, reused)
    page = (work / "report.html").read_text()
    assert "chunks encoded" in page and "chunks reused" in page

    fresh = work / "fresh"
    fresh.mkdir()
    assert run(docs, fresh, config=SMALL + NO_CACHE).rc == 0
    same_vectors(vectors(str(work / "store.db")), vectors(str(fresh / "store.db")))


@pytest.mark.slow
def test_a_rerun_of_many_changed_files_reads_their_previous_rows_in_a_few_calls(work: Path) -> None:
    """Issue 40, item 2: reuse reads the previous rows of the changed files it expects together (a Milvus Lite
    query scans the whole collection: one call a file made 3,000 changed files cost 15x their first ingest).
    The report's reuse_reads counts the store calls; the null backend reads nothing."""
    docs = work / "docs"
    texts = {f"f{i:02d}.txt": paragraphs(f"many{i}", 3) for i in range(40)}
    for name, text in texts.items():
        (docs / name).write_text("\n\n".join(text))
    config = SMALL + NO_CACHE + "[run]\nmax_files_in_flight = 64\n"
    assert run(docs, work, config=config).rc == 0
    for name, text in texts.items():
        (docs / name).write_text("\n\n".join([f"An edited first paragraph of {name} about seals.", *text[1:]]))
    second = run(docs, work, config=config)
    assert second.rc == 0, second.stderr
    for name in texts:
        chunks, encoded, reused = counts(second, name)
        assert 1 <= encoded <= 4 and reused == chunks - encoded > 0, (name, chunks, encoded, reused)
    assert 1 <= second.report["totals"]["reuse_reads"] <= 4, second.report["totals"]["reuse_reads"]   # was 40

    null = work / "null"
    null.mkdir()
    assert run(docs, null, "--backend", "null").rc == 0
    for name, text in texts.items():
        (docs / name).write_text("\n\n".join(text))
    res = run(docs, null, "--backend", "null")
    assert res.rc == 0 and res.report["totals"]["reuse_reads"] == 0, res.stderr


@pytest.mark.slow
def test_equal_embedded_texts_are_encoded_once_and_rows_keep_their_provenance(work: Path) -> None:
    """Without a context line, copies embed the same texts: the run encodes each once, in a file and across
    files; every row keeps its own id, source and chunk number."""
    docs = work / "docs"
    para = [f"copy paragraph {i}: " + " ".join(WORDS[(i * 7 + k * 3) % 20] for k in range(110)) for i in range(6)]
    body = "\n\n".join(para[:4] + [para[0], para[4], para[0], para[5]])   # para 0 three times
    for name in ("a.txt", "b.txt", "c.txt"):
        (docs / name).write_text(body)
    res = run(docs, work, config="[chunking]\ncontext_tokens = 0\n")
    assert res.rc == 0, res.stderr
    assert [counts(res, n) for n in ("a.txt", "b.txt", "c.txt")] == [(8, 6, 2), (8, 0, 8), (8, 0, 8)]
    assert (res.report["totals"]["encoded_chunks"], res.report["totals"]["reused_chunks"]) == (6, 18)
    rows = vectors(str(work / "store.db"))
    assert len(rows) == 24 and {r[0] for r in rows.values()} == {"a.txt", "b.txt", "c.txt"}
    by_text: dict[str, list[np.ndarray]] = {}
    for source, _, text, vec in rows.values():
        by_text.setdefault(text, []).append(vec)
    assert len(by_text) == 6 and all(np.isfinite(v).all() and np.array_equal(v, vs[0]) for vs in by_text.values()
                                     for v in vs)


@pytest.mark.slow
def test_a_backend_or_dtype_change_reuses_nothing_and_the_cache_serves_a_reembed(work: Path) -> None:
    docs = work / "docs"
    (docs / "a.txt").write_text("\n\n".join(paragraphs("cache", 4)))
    first = ingest("run", "docs", "--store", "store.db", "--report", "report.json", "--quiet", "--backend", "onnx",
                   cwd=work, config=SMALL)
    assert first.rc == 0, first.stderr
    chunks, _, _ = counts(first, "a.txt")

    def again(*extra: str, config: str = SMALL):
        res = ingest("run", "docs", "--store", "store.db", "--report", "report.json", "--quiet", *extra, cwd=work,
                     config=config)
        assert res.rc == 0, res.stderr
        return counts(res, "a.txt")

    # the cache (beside the store) serves a --reembed into a new collection with the same settings: no encoding
    assert again("--backend", "onnx", "--collection", "copy", "--reembed") == (chunks, 0, chunks)
    # another backend, or another dtype, reuses nothing (the cache's keys include them)
    assert again("--backend", "torch", "--collection", "torch") == (chunks, chunks, 0)
    assert again("--backend", "torch", "--collection", "bf16",
                 config=SMALL + '[model]\ndtype = "bfloat16"\n') == (chunks, chunks, 0)
    # --reembed of an existing collection reuses nothing, not even from the cache
    assert again("--backend", "torch", "--collection", "torch", "--reembed") == (chunks, chunks, 0)

    # a collection whose dtype changed (not refused as a change) reuses nothing from the store any more
    (docs / "a.txt").write_text("\n\n".join(paragraphs("cache", 4) + ["A new last paragraph."]))
    mixed = SMALL + NO_CACHE + '[model]\ndtype = "bfloat16"\n'
    n, encoded, reused = again("--backend", "torch", "--collection", "torch", config=mixed)
    assert (encoded, reused) == (n, 0)
    (docs / "a.txt").write_text("\n\n".join(paragraphs("cache", 4)))
    n, encoded, reused = again("--backend", "torch", "--collection", "torch", config=mixed)
    assert (encoded, reused) == (n, 0)


def test_a_corrupt_cache_is_ignored_with_one_line(work: Path) -> None:
    docs = work / "docs"
    (docs / "a.txt").write_text("\n\n".join(paragraphs("bad", 3)))
    for suffix in ("", "-wal", "-shm"):
        Path(f"{work / 'store.db.vectors.sqlite'}{suffix}").unlink(missing_ok=True)
    (work / "store.db.vectors.sqlite").write_bytes(b"not a database " * 512)
    res = run(docs, work, config=SMALL)
    assert res.rc == 0, res.stderr
    assert "embedding cache" in res.stderr and "unusable" in res.stderr
    assert len([line for line in res.stderr.splitlines() if "embedding cache" in line]) == 1
    chunks, encoded, _ = counts(res, "a.txt")
    assert encoded == chunks > 0


@pytest.mark.slow
def test_a_sigkill_during_a_run_that_reuses_vectors_keeps_the_last_good_copy_and_the_rerun_is_exact(
        work: Path) -> None:
    """The edited file has over 256 chunks (two groups): the first group's vectors all come from the store
    and its rows are written, then the encoder hangs on the edited chunk, and the whole run is SIGKILLed."""
    docs = work / "docs"
    text = paragraphs("big", 100)
    (docs / "big.txt").write_text("\n\n".join(text))
    config = SMALL + NO_CACHE + "[store]\nbatch_size = 8\n"
    first = run(docs, work, config=config)
    assert first.rc == 0, first.stderr
    assert first.by_path()["big.txt"]["chunks"] > 256
    old = vectors(str(work / "store.db"))

    text[95] = "HANGHERE the edited paragraph, near the end of the file."
    (docs / "big.txt").write_text("\n\n".join(text))
    fired = work / "fired"
    env = dict(cli_env(), INGEST_FAULT=json.dumps({"match": "HANGHERE", "action": "hang", "once_file": str(fired)}))
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db", "--report",
                             "report.json", "--quiet"], cwd=work, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not fired.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert fired.exists(), "the encoder never reached the edited chunk"
        time.sleep(3)                                                # the first group's rows reach the store
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(2)                                                    # its children follow their parent
    after = vectors(str(work / "store.db"))
    assert {k: after[k][:3] for k in old} == {k: v[:3] for k, v in old.items()}    # the last good copy, whole

    rerun = run(docs, work, config=config)
    assert rerun.rc == 0, rerun.stderr
    chunks, encoded, reused = counts(rerun, "big.txt")
    assert 1 <= encoded <= 4 and reused == chunks - encoded
    fresh = work / "fresh"
    fresh.mkdir()
    assert run(docs, fresh, config=config).rc == 0
    same_vectors(vectors(str(work / "store.db")), vectors(str(fresh / "store.db")))


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["postgresql", "qdrant-local"])
def test_reuse_on_postgresql_and_qdrant_local(kind: str, work: Path, request: pytest.FixtureRequest) -> None:
    uri = request.getfixturevalue("pg_server").database("reuse") if kind == "postgresql" \
        else f"qdrant://{work / 'qdrant'}"
    docs = work / "docs"
    text = paragraphs("store", 8)
    (docs / "a.txt").write_text("\n\n".join(text))

    def go():
        (work / "report.json").unlink(missing_ok=True)
        res = ingest("run", "docs", "--store", uri, "--report", "report.json", "--quiet", cwd=work,
                     config=SMALL + NO_CACHE)
        assert res.rc == 0, res.stderr
        return res

    first = go()
    chunks, encoded, _ = counts(first, "a.txt")
    assert encoded == chunks
    text[3] = "An edited paragraph about penguins."
    (docs / "a.txt").write_text("\n\n".join(text))
    second = go()
    chunks, encoded, reused = counts(second, "a.txt")
    assert 1 <= encoded <= 4 and reused == chunks - encoded
    fresh = work / "fresh"
    (fresh / "docs").mkdir(parents=True)
    (fresh / "docs" / "a.txt").write_text("\n\n".join(text))
    assert run(fresh / "docs", fresh, config=SMALL + NO_CACHE).rc == 0     # the same text, on Milvus Lite
    mine, theirs = vectors(uri), vectors(str(fresh / "store.db"))
    assert sorted(r[2] for r in mine.values()) == sorted(r[2] for r in theirs.values())
    by_text = {r[2]: r[3] for r in theirs.values()}
    for _, _, text_, vec in mine.values():
        assert float(vec @ by_text[text_]) >= 0.9999
