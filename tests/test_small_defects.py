"""Issue 30 item 11: a folder of documents refused as a store; a damaged manifest's true hint; `ingest eval`
naming the sources its store lacks; `ingest search` on a collection that is empty. Real CLI runs
(`--backend null`: vectors do not matter; searches in BM25 mode)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ingest, run, run_on

NULL = '[model]\nbackend = "null"\n'


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.slow
def test_a_folder_of_documents_is_no_store(work: Path) -> None:
    (work / "docs" / "owls.txt").write_text("Barn owls hunt voles over the meadow at dusk.\n")
    mydocs = work / "mydocs"
    mydocs.mkdir()
    (mydocs / "letter.txt").write_text("Dear aunt, the orchard is in bloom.\n")
    store = ("--store", str(mydocs))
    for args in (("status",), ("search", "owls", "--mode", "bm25"),
                 ("run", "docs", "--report", "report.json", "--quiet")):
        res = ingest(*args, *store, cwd=work, config=NULL)
        line = one_line(res.stderr)
        assert res.rc == 2 and "is a folder of other files, not a Milvus Lite store" in line, (args, line)
        assert f"--store {mydocs}.db" in line
    assert sorted(p.name for p in mydocs.iterdir()) == ["letter.txt"]       # nothing written among them
    assert not Path(f"{mydocs}.lock").exists()

    empty = work / "empty"                   # an empty folder may become a store
    empty.mkdir()
    res = ingest("run", "docs", "--store", str(empty), "--report", "report.json", "--quiet", cwd=work)
    assert res.rc == 0, res.stderr
    again = ingest("run", "docs", "--store", str(empty), "--report", "report.json", "--quiet", cwd=work)
    assert again.rc == 0 and again.report["totals"]["by_status"] == {"unchanged": 1}, again.stderr
    assert ingest("status", "--store", str(empty), cwd=work).rc == 0


@pytest.mark.slow
def test_a_damaged_manifest_says_so_and_how_to_recover(work: Path) -> None:
    (work / "docs" / "owls.txt").write_text("Barn owls hunt voles over the meadow at dusk.\n")
    assert run(work / "docs", work, config=NULL).rc == 0
    manifest = work / "store.db.documents.manifest.sqlite"
    manifest.write_bytes(b"this is no SQLite database, a disk error wrote it\n" * 100)
    store = ("--store", str(work / "store.db"))

    status = ingest("status", *store, cwd=work)
    line = one_line(status.stderr)
    assert status.rc == 2 and "damaged" in line and "permissions" not in line, line
    assert f"mv {manifest} {manifest}.damaged" in line and "--reembed" in line
    again = run(work / "docs", work)                                   # was a traceback, exit 1
    line = one_line(again.stderr)
    assert again.rc == 2 and "damaged" in line and "--reembed" in line, again.stderr

    manifest.rename(f"{manifest}.damaged")                             # the hint, followed
    rebuilt = run(work / "docs", work, "--reembed")
    assert rebuilt.rc == 0 and rebuilt.report["totals"]["by_status"] == {"ingested": 1}, rebuilt.stderr
    assert ingest("status", *store, cwd=work).rc == 0


@pytest.mark.slow
def test_eval_names_the_sources_the_store_lacks(work: Path) -> None:
    docs = work / "docs"
    (docs / "deep").mkdir()
    (docs / "deep" / "owls.txt").write_text("Barn owls hunt voles over the meadow at dusk.\n")
    (docs / "axb.txt").write_text("Copper kettles whistle at dawn in the harbour town.\n")
    assert run(docs, work, config=NULL).rc == 0
    questions = work / "questions.jsonl"
    questions.write_text("\n".join(json.dumps(q) for q in [
        {"question": "owls hunting voles", "source": "owls.txt"},          # in the store (a tail)
        {"question": "kettles at dawn", "source": "deep/owls.txt"},        # in the store, not found by this question
        {"question": "kettles at dawn", "source": "a_b.txt"},              # not in the store (axb.txt is another)
        {"question": "glaciers", "source": "missing/report.pdf"},          # not in the store
        {"question": "owls", "source": "missing/report.pdf"},
    ]) + "\n")
    store = ("--store", str(work / "store.db"), "--mode", "bm25")

    res = ingest("eval", str(questions), "--json", *store, cwd=work)
    assert res.rc == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["missing_sources"] == ["a_b.txt", "missing/report.pdf"]
    line = one_line(res.stderr)
    assert line.startswith("warning: 2 source(s)") and line.endswith("a_b.txt, missing/report.pdf"), line
    assert out["questions"] == 5 and out["results"][0]["doc_rank"] == 1     # all scored, theirs as misses
    assert [r["doc_rank"] for r in out["results"][2:]] == [None, None, None]

    plain = ingest("eval", str(questions), *store, cwd=work)
    assert plain.rc == 0 and one_line(plain.stderr) == line


@pytest.mark.slow
def test_search_on_an_empty_collection_says_it_is_empty(work: Path) -> None:
    assert run(work / "docs", work, config=NULL).rc == 0                # an empty folder: a collection, no rows
    store = ("--store", str(work / "store.db"))
    res = ingest("search", "owls", "--mode", "bm25", *store, cwd=work)
    assert res.rc == 0 and "no collection" not in res.stderr, res.stderr
    assert "collection 'documents' in" in res.stderr and "is empty" in res.stderr and "no hits" in res.stderr
    as_json = ingest("search", "owls", "--json", *store, cwd=work)
    assert as_json.rc == 0 and json.loads(as_json.stdout) == [], as_json.stderr

    questions = work / "questions.jsonl"
    questions.write_text(json.dumps({"question": "owls", "source": "owls.txt"}) + "\n")
    ev = ingest("eval", str(questions), "--json", *store, cwd=work)
    assert ev.rc == 0, ev.stderr
    assert json.loads(ev.stdout)["missing_sources"] == ["owls.txt"] and "is empty" in ev.stderr

    other = ingest("search", "owls", "--store", str(work / "store.db"), "--collection", "nothing", cwd=work)
    assert other.rc == 2 and "no collection 'nothing'" in other.stderr      # a collection never opened


def test_search_on_an_empty_server_collection(work: Path, milvus_uri: str) -> None:
    res = run_on(milvus_uri, "i30_empty", work, config=NULL)                 # an empty folder
    assert res.rc == 0, res.stderr
    found = ingest("search", "owls", "--mode", "bm25", "--store", milvus_uri, "--collection", "i30_empty", cwd=work)
    assert found.rc == 0 and "collection 'i30_empty'" in found.stderr and "is empty" in found.stderr, found.stderr
