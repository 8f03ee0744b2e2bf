"""Issue 45 item 3: the report says what a corpus costs in CPU: the run's process tree a file, and the loaders'
and OCR's CPU a PDF page (a PDF loaded by range: every range's), in its totals, the closing line and the HTML page."""
from __future__ import annotations

import resource
from pathlib import Path

import pytest

from conftest import ingest
from docs import make_pdf

from ingest.files import FileRef
from ingest.load import Loaded, Pages, Range
from ingest.ocr import OcrDone
from ingest.sections import Doc

TEXT = "Lighthouses guide ships along the rocky coast, and their keepers log every storm. "


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def test_the_report_says_what_the_run_cost_in_cpu(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INGEST_RANGE_PAGES", "2")           # the PDF loads in 3 tasks: pages [0, 2), [2, 4), [4, 5)
    make_pdf(work / "docs" / "report.pdf", [f"Page {n + 1}. " + TEXT * 30 for n in range(5)])
    for name in ("a.txt", "b.txt"):
        (work / "docs" / name).write_text(f"{name}: " + TEXT * 20)
    before = children_cpu_s()
    res = ingest("run", "docs", "--store", "null://", "--backend", "null", "--report", "report.json", cwd=work)
    tree = children_cpu_s() - before                        # the CLI's whole process tree, its start-up included
    assert res.rc == 0, res.stderr[-2000:]
    t = res.report["totals"]
    assert t["files"] == 3 and t["pdf_pages"] == 5
    # the workers' CPU is in it (the supervisor alone is a small part), the interpreter's start-up is not
    assert tree / 2 < t["cpu_s"] <= tree
    assert t["cpu_per_file_ms"] == pytest.approx(t["cpu_s"] * 1000 / 3, rel=0.01)
    assert 0 < t["cpu_per_pdf_page_ms"] * 5 / 1000 < t["cpu_s"]     # the PDF's loaders are part of the run
    assert f"| CPU: {t['cpu_s']:g} s, {t['cpu_per_file_ms']:g} ms a file, {t['cpu_per_pdf_page_ms']:g} ms a PDF page" \
        in res.stderr
    html = (work / "report.html").read_text(encoding="utf-8")
    assert all(f'<div class="k">CPU {unit}</div>' in html for unit in ("s", "ms a file", "ms a PDF page"))


def test_a_files_cpu_and_pages_add_up_over_its_ranges_and_ocr_pages() -> None:
    ref = FileRef(0, "scan.pdf", "/nowhere/scan.pdf", fmt="pdf")
    first = Loaded("hash", (), ((2, ()),), 0.5, ranges=(Range(1, 2, 4),), doc=Doc("scan.pdf", "scan.pdf"),
                   cpu_s=0.5, read_pages=2)
    pages = Pages(ref, first, None)
    pages.next_range()
    pages.add_ocr(0, 2, OcrDone((), 0.3, cpu_s=0.25))
    pages.add_part(1, Loaded("", (), (), 0.2, cpu_s=0.125, read_pages=2))
    *_, last = pages.ready()
    assert last.last and (last.outcome.cpu_s, last.outcome.read_pages) == (0.875, 4)
