"""Issue 23 item 5: every run writes an HTML report beside the JSON one, which headless Chromium renders
with every section and no script error; file names and errors in it are escaped."""
from __future__ import annotations

import base64
import json
import random
import shutil
import subprocess
from html import escape
from pathlib import Path

import pytest

from conftest import ingest, run
from docs import make_scanned_pdf

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (chromium or chromium-browser on PATH) "
                                                              "to render the HTML report")
NULL = '[model]\nbackend = "null"\n'
MARKUP = "<img src=x onerror=alert(1)>.txt"          # a file name that is markup: shown, never run
STAGES = ["load", "ocr", "chunk", "encode", "write"]
SECTIONS = ("summary", "timeline", "formats", "slowest", "problems")


def junk_text() -> str:
    """A base64 blob: every chunk of it is non-language junk."""
    return base64.b64encode(random.Random(7).randbytes(3000)).decode()


def chromium(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess:
    """Headless Chromium on `page` (as root it needs --no-sandbox), its console on stderr."""
    argv = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
            "--enable-logging=stderr", "--v=0", *args, page.as_uri()]
    return subprocess.run(argv, capture_output=True, text=True, timeout=90)


@pytest.mark.slow
@needs_chromium
def test_html_report_renders_every_section(work: Path) -> None:
    docs = work / "docs"
    (docs / "notes.txt").write_text("Lighthouses guide ships along the rocky coast.\n")
    (docs / MARKUP).write_text("Markup in a file name stays text.\n")
    (docs / "junk.txt").write_text(junk_text())
    (docs / "broken.pdf").write_bytes(b"%PDF-1.7\n1 0 obj <<>> garbage without end")
    make_scanned_pdf(docs / "blank-scan.pdf", [""])         # one page image without text: OCRed, nothing found
    res = run(docs, work, config=NULL)
    assert res.rc == 1, res.stderr                          # broken.pdf failed
    files, totals = res.by_path(), res.report["totals"]
    assert {p: f["status"] for p, f in files.items()} == {
        "notes.txt": "ingested", MARKUP: "ingested", "junk.txt": "empty", "broken.pdf": "failed",
        "blank-scan.pdf": "empty"}
    assert files["blank-scan.pdf"]["error"] == "no text found on 1 OCRed page"
    timeline = totals["timeline"]
    assert timeline["measured"] and list(timeline["busy_s"]) == STAGES and timeline["busy_s"]["ocr"] > 0
    assert all(len(lane) == len(timeline["stages"]["load"]) for lane in timeline["stages"].values())

    page = work / "report.html"
    html = page.read_text(encoding="utf-8")
    assert "<img src=x" not in html and escape(MARKUP) in html
    assert all(escape(files[p]["error"]) in html for p in ("broken.pdf", "junk.txt", "blank-scan.pdf"))

    shot = work / "report.png"
    shown = chromium(page, work / "chromium-shot", f"--screenshot={shot}", "--window-size=1280,2400")
    print(f"screenshot of the HTML report: {shot}")
    assert shown.returncode == 0 and shot.stat().st_size > 20_000, shown.stderr[-2000:]
    dom = chromium(page, work / "chromium-dom", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-rendered="yes"' in dom.stdout and 'id="js-error"' not in dom.stdout
    assert all(f'id="{s}"' in dom.stdout for s in SECTIONS)
    console = [line for out in (shown.stderr, dom.stderr) for line in out.splitlines() if ":CONSOLE" in line]
    assert not console, console


def test_a_run_that_cannot_start_writes_its_page_too(work: Path) -> None:
    """The report's name without .json gets .html appended; a run stopped before its scan has a page saying so."""
    res = ingest("run", "docs", "--store", str(work / "store.db"), "--report", str(work / "run-report"), "--quiet",
                 cwd=work, config='[loaders]\nplugins = ["no_such_plugin_module"]\n')
    assert res.rc == 2 and "no_such_plugin_module" in res.stderr
    assert json.loads((work / "run-report").read_text())["totals"]["exit_code"] == 2
    html = (work / "run-report.html").read_text(encoding="utf-8")
    assert "No timeline: the run did not start" in html and "no_such_plugin_module" in html
