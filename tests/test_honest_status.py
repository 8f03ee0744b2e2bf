"""Issue 23 item 6: a file without text is "empty" (with why), not a failure, recorded so a rerun says
unchanged (a file that lost its text loses its rows); each file's seconds are its stages' (OCR included, a
timed-out page at its timeout)."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run, store_rows
from docs import make_mixed_pdf
from test_html_report import NULL, STAGES, junk_text

OCR_TIMEOUT_S = 0.5
# The scanned page: enough lines that no box OCRs it within the timeout (one short line took under 0.5 s on a
# fast one, and the page did not time out).
SCANNED = " ".join(["Parking is free for guests of the harbour hotel on weekdays."] * 30)


@pytest.mark.slow
def test_empty_files_and_every_stage_counted(work: Path) -> None:
    docs = work / "docs"
    (docs / "notes.txt").write_text("Copper kettles whistle at dawn in the harbour town.\n")
    (docs / "junk.txt").write_text(junk_text())
    make_mixed_pdf(docs / "mixed.pdf", "Harbour cranes unload timber every Tuesday morning.", SCANNED)
    config = NULL + f"[loaders.ocr]\ntimeout_s = {OCR_TIMEOUT_S}\n"
    res = run(docs, work, config=config)
    assert res.rc == 0, res.stderr                          # an empty file is no failure
    files, totals = res.by_path(), res.report["totals"]
    junk = files["junk.txt"]
    assert junk["status"] == "empty" and junk["chunks"] == 0, junk
    assert junk["error"] == f"all {junk['junk_chunks']} chunks were skipped as non-language junk"
    assert totals["by_status"] == {"ingested": 2, "empty": 1} and totals["chunks"] == sum(f["chunks"] for f in files.values())

    mixed = files["mixed.pdf"]                               # page 2's OCR timed out: its time is counted
    assert mixed["status"] == "ingested" and mixed["warnings"] == [f"page 2: OCR failed: timeout after {OCR_TIMEOUT_S:g} s"]
    assert mixed["stages"]["ocr"] >= OCR_TIMEOUT_S and mixed["seconds"] >= OCR_TIMEOUT_S, mixed
    for f in files.values():                                 # stages sum to seconds
        assert set(f["stages"]) <= set(STAGES) and abs(sum(f["stages"].values()) - f["seconds"]) < 1e-6, f
    for name in ("notes.txt", "mixed.pdf"):                 # their share of the writer's time
        assert files[name]["stages"]["write"] > 0, files[name]

    (docs / "notes.txt").write_text(junk_text())             # now without text: its rows of before go
    again = run(docs, work, config=config)
    assert again.rc == 0 and {p: f["status"] for p, f in again.by_path().items()} == {
        "junk.txt": "unchanged", "mixed.pdf": "unchanged", "notes.txt": "empty"}
    assert {r["source"] for r in store_rows(work)} == {"mixed.pdf"}
