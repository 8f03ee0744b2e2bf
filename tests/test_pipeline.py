"""Issue 2: `ingest run` end to end on real Milvus Lite with the real packaged model."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ingest, row_ids, run, search
from docs import make_docx, make_pdf, make_pptx

PHRASES = {
    "notes.txt": "Copper kettles whistle at dawn in the harbour town.",
    "guide.md": "Glacier trains climb slowly through alpine tunnels.",
    "chinese.txt": "熊猫在竹林里安静地吃竹子。",
    "report.pdf": "Quarterly revenue from solar panels doubled in March.",
    "memo.docx": "The violin workshop restores antique instruments every winter.",
    "deck.pptx": "Autonomous tractors plough the wheat fields at night.",
}


def build_folder(docs: Path) -> None:
    (docs / "notes.txt").write_text(PHRASES["notes.txt"] + "\n", encoding="utf-8")
    (docs / "guide.md").write_text("# Travel guide\n\n" + PHRASES["guide.md"] + "\n", encoding="utf-8")
    (docs / "chinese.txt").write_bytes(("大熊猫是中国的国宝。" + PHRASES["chinese.txt"]).encode("gbk"))
    make_pdf(docs / "report.pdf", ["Introduction to the annual report.", PHRASES["report.pdf"]])
    make_docx(docs / "memo.docx", [PHRASES["memo.docx"]], heading="Workshop memo",
              table_rows=[["Item", "Count"], ["Violin", "3"]], header="Company header", footer="Page footer")
    make_pptx(docs / "deck.pptx", [{"title": "Farming", "body": PHRASES["deck.pptx"], "notes": "Speaker notes here."}])
    (docs / "image.xyz").write_bytes(b"not a supported format")
    (docs / "broken.pdf").write_bytes(b"%PDF-1.7\n1 0 obj <<>> garbage without end")


@pytest.mark.slow
def test_run_search_rerun(work: Path) -> None:
    build_folder(work / "docs")
    first = run(work / "docs", work)
    assert first.rc == 1, first.stderr            # broken.pdf failed -> exit 1
    files = first.by_path()
    assert files["image.xyz"]["status"] == "skipped" and "unsupported" in files["image.xyz"]["error"]
    assert files["broken.pdf"]["status"] == "failed" and "\n" not in files["broken.pdf"]["error"]
    for name in PHRASES:
        assert files[name]["status"] == "ingested", files[name]
        assert files[name]["chunks"] >= 1
    assert files["report.pdf"]["format"] == "pdf"
    total = sum(f["chunks"] for f in first.report["files"])
    assert first.report["totals"]["chunks"] == total
    assert len(row_ids(work)) == total

    for name, phrase in PHRASES.items():
        hits = search(work, phrase, k=5)
        assert name in [h["source"] for h in hits], (name, hits)
    pdf_hit = next(h for h in search(work, PHRASES["report.pdf"]) if h["source"] == "report.pdf")
    assert pdf_hit["page"] == 2

    hits = search(work, "violin workshop", k=3)
    assert isinstance(hits, list) and hits
    for h in hits:
        assert set(h) == {"score", "source", "page", "chunk", "text", "title", "headings", "element", "bbox"}
        assert isinstance(h["score"], float) and isinstance(h["chunk"], int)

    second = run(work / "docs", work)
    assert second.rc == 1
    assert {f["path"]: f["status"] for f in second.report["files"]} == {
        **{n: "unchanged" for n in PHRASES}, "image.xyz": "skipped", "broken.pdf": "failed"}
    assert sorted(row_ids(work)) == sorted(set(row_ids(work))) and len(row_ids(work)) == total


@pytest.mark.slow
def test_plain_search_output_and_errors(work: Path) -> None:
    (work / "docs" / "a.txt").write_text("Lighthouses guide ships along the rocky coast.")
    assert run(work / "docs", work).rc == 0
    res = ingest("search", "lighthouse coast", "--store", str(work / "store.db"), cwd=work)
    assert res.rc == 0 and "a.txt" in res.stdout

    bad = run(work / "docs", work, config="[loaders.pdf]\nwrokers = 2\n")
    assert bad.rc == 2
    assert bad.stderr.strip().count("\n") == 0 and "loaders.pdf.wrokers" in bad.stderr
    bad = run(work / "docs", work, config="[loaders.pdf]\nworkers = \"two\"\n")
    assert bad.rc == 2 and "loaders.pdf.workers" in bad.stderr


def test_report_defaults_next_to_store(work: Path) -> None:
    (work / "docs" / "a.txt").write_text("Owls hunt quietly over frozen meadows.")
    res = ingest("run", "docs", "--quiet", cwd=work)
    assert res.rc == 0, res.stderr
    report = json.loads((work / "ingest.db.report.json").read_text())
    assert report["files"][0] == {**report["files"][0], "path": "a.txt", "status": "ingested", "format": "txt"}
