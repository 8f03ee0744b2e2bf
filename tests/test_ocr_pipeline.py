"""Issue 4: scanned PDFs, mixed PDFs, images and legacy .doc/.ppt through `ingest run`."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import needs_soffice, run, search
from docs import make_doc, make_mixed_pdf, make_png, make_ppt, make_scanned_pdf

SCANNED_P2 = "Invoices are archived in the basement"
MIXED_TEXT = "Harbour cranes unload timber every Tuesday morning."
MIXED_SCAN = "Parking is free after six"
PNG_TEXT = "Fresh bread sold here daily"
CHINESE = "长江是亚洲最长的河流"
DOC_TEXT = "The orchard committee approved new ladders for the autumn harvest."
PPT_TEXT = "Volunteers repaint the harbour fence each spring."


@pytest.mark.slow
@needs_soffice
def test_ocr_and_legacy_formats(work: Path) -> None:
    docs = work / "docs"
    make_scanned_pdf(docs / "scanned.pdf", ["Cover letter of the archive", SCANNED_P2])
    make_mixed_pdf(docs / "mixed.pdf", MIXED_TEXT, MIXED_SCAN)
    make_png(docs / "sign.png", PNG_TEXT)
    make_scanned_pdf(docs / "chinese.pdf", [CHINESE])
    make_doc(docs / "minutes.doc", [DOC_TEXT], heading="Minutes")
    make_ppt(docs / "slides.ppt", [{"title": "Spring", "body": PPT_TEXT}])
    res = run(docs, work, config="[loaders.ocr]\nworkers = 2\n")
    assert res.rc == 0, res.stderr
    files = res.by_path()
    assert files["scanned.pdf"]["ocr_pages"] == 2 and files["mixed.pdf"]["ocr_pages"] == 1
    assert files["sign.png"]["format"] == "image" and files["minutes.doc"]["format"] == "doc"
    expected = [(SCANNED_P2, "scanned.pdf", 2), (MIXED_TEXT, "mixed.pdf", 1), (MIXED_SCAN, "mixed.pdf", 2),
                (PNG_TEXT, "sign.png", 1), (CHINESE, "chinese.pdf", 1), (DOC_TEXT, "minutes.doc", None),
                (PPT_TEXT, "slides.ppt", 1)]
    for phrase, source, page in expected:
        hits = [(h["source"], h["page"]) for h in search(work, phrase, k=3)]
        assert (source, page) in hits, (phrase, hits)


@pytest.mark.slow
def test_ocr_page_timeout_keeps_the_rest_of_the_document(work: Path) -> None:
    make_mixed_pdf(work / "docs" / "mixed.pdf", MIXED_TEXT, MIXED_SCAN)
    res = run(work / "docs", work, config="[loaders.ocr]\ntimeout_s = 0.01\n")
    entry = res.by_path()["mixed.pdf"]
    assert entry["status"] == "ingested" and entry["chunks"] >= 1, entry
    assert entry["warnings"] == ["page 2: OCR failed: timeout after 0.01 s"]
    assert ("mixed.pdf", 1) in [(h["source"], h["page"]) for h in search(work, MIXED_TEXT)]
