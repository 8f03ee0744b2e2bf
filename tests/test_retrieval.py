"""What `ingest run` stores is good to search (issue 21), end to end with the real loaders, model and
Milvus Lite: chunks know their document, section, page and box; tables are kept by rows under their
header; running headers and footers are gone; junk is skipped and counted; search and eval show it."""
from __future__ import annotations

import base64
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli_env, ingest, run

PAGES = 6
HEADER, FOOTER = "Acme Corp Annual Report 2023", "Page {n} of {total}"
WORDS = ("harbour crane ledger copper signal orchard lantern meadow thunder window granite "
         "shipment freight quarterly contract warehouse").split()
TABLE_HEADER = ("Segment", "2023", "2022")
SEGMENTS = [f"{w.title()} division" for w in WORDS[:12]]


def prose(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n)) + "."


def build_pdf(path: Path) -> None:
    """Six pages: a running header and footer on each, headings in bold 16 pt (and an outline), body text
    in 10 pt, and a ruled table that starts on page 4 and goes on, without its header, on page 5."""
    import pymupdf

    doc = pymupdf.open()
    doc.set_metadata({"title": "Acme Annual Report"})
    toc = [[1, "Part I", 1], [2, "Item 1. Business", 1], [1, "Part II", 3], [2, "Item 7. Liquidity", 3],
           [2, "Item 8. Segment results", 4]]
    headings = {1: "Item 1. Business", 3: "Item 7. Liquidity", 4: "Item 8. Segment results"}
    for n in range(1, PAGES + 1):
        page = doc.new_page(width=612, height=792)
        page.insert_text((72, 40), HEADER, fontsize=9)
        page.insert_text((280, 770), FOOTER.format(n=n, total=PAGES), fontsize=9)
        y = 90
        if n in headings:
            page.insert_text((72, y), headings[n], fontsize=16, fontname="hebo")
            y += 30
        if n in (4, 5):
            rows = ([TABLE_HEADER] if n == 4 else []) + [
                (s, f"{1000 + 37 * i:,}", f"{900 + 29 * i:,}") for i, s in enumerate(SEGMENTS) if (i < 6) == (n == 4)]
            x = (72, 300, 420, 540)
            for r, row in enumerate(rows):
                top = y + 20 * r
                page.draw_line((x[0], top), (x[-1], top))
                for c, cell in enumerate(row):
                    page.insert_text((x[c] + 4, top + 14), cell, fontsize=10)
            bottom = y + 20 * len(rows)
            page.draw_line((x[0], bottom), (x[-1], bottom))
            for xc in x:
                page.draw_line((xc, y), (xc, bottom))
            y = bottom + 30
            if n == 4:
                continue                       # the table runs to the page's end and goes on overleaf
        for p in range(3):
            rect = pymupdf.Rect(72, y, 540, y + 150)
            page.insert_textbox(rect, prose(70, n * 10 + p), fontsize=10)
            y += 160
            if y > 700:
                break
    doc.set_toc(toc)
    doc.save(path)


def build_docx(path: Path) -> None:
    import docx

    d = docx.Document()
    d.core_properties.title = "Staff Handbook"
    d.add_heading("Policies", level=1)
    d.add_heading("Travel", level=2)
    d.add_paragraph("Travel must be booked through the portal two weeks ahead; economy class for flights under six hours.")
    table = d.add_table(rows=3, cols=2)
    for r, (a, b) in enumerate([("Expense", "Limit"), ("Hotel night", "180 EUR"), ("Dinner", "45 EUR")]):
        table.cell(r, 0).text, table.cell(r, 1).text = a, b
    d.add_heading("Security", level=2)
    d.add_paragraph("Badges are worn visibly at all times and never lent to visitors or contractors.")
    d.save(path)


def rows_of(cwd: Path) -> list[dict]:
    code = ("import json, sys; from ingest.store import Store; s = Store(sys.argv[1], 'documents');"
            "print(json.dumps(s.rows(['source', 'page', 'chunk', 'text', 'title', 'headings', 'element', 'bbox'])))")
    proc = subprocess.run([sys.executable, "-c", code, str(cwd / "store.db")], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return sorted(json.loads(proc.stdout.strip().splitlines()[-1]), key=lambda r: (r["source"], r["chunk"]))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[dict]]:
    work = tmp_path_factory.mktemp("retrieval")
    docs = work / "docs"
    docs.mkdir()
    build_pdf(docs / "ACME_2023_annual.pdf")
    build_docx(docs / "handbook.docx")
    rng = random.Random(9)
    blob = base64.encodebytes(bytes(rng.randrange(256) for _ in range(12_000))).decode()
    (docs / "notes.txt").write_text(prose(120, 1) + "\n\n" + blob + "\n\n" + prose(120, 2))
    res = run(docs, work)
    assert res.rc == 0, res.stderr
    return work, res.by_path(), rows_of(work)


@pytest.mark.slow
def test_pdf_chunks_know_their_title_section_page_and_box(store) -> None:
    _, _, rows = store
    pdf = [r for r in store[2] if r["source"] == "ACME_2023_annual.pdf"]
    assert pdf and {r["title"] for r in pdf} == {"Acme Annual Report"}
    assert all(1 <= r["page"] <= PAGES for r in pdf)
    for r in pdf:
        x0, y0, x1, y1 = map(float, r["bbox"].split(","))
        assert 0 <= x0 < x1 <= 612 and 0 <= y0 < y1 <= 792
    by_page = {}
    for r in pdf:
        by_page.setdefault(r["page"], []).append(r)
    assert all(r["headings"].endswith("Item 1. Business") for r in by_page[2])          # carried to the next page
    assert any(r["headings"].endswith("Item 7. Liquidity") for r in by_page[3])
    assert not any("Item 7. Liquidity" in r["text"] for r in pdf)                          # headings are context


def test_running_headers_footers_and_page_numbers_are_gone(store) -> None:
    pdf = [r for r in store[2] if r["source"] == "ACME_2023_annual.pdf"]
    assert not any(HEADER in r["text"] or "of 6" in r["text"] for r in pdf)


def test_a_table_across_a_page_break_keeps_its_header_in_every_chunk(store) -> None:
    tables = [r for r in store[2] if r["source"] == "ACME_2023_annual.pdf" and r["element"] == "table"]
    assert {r["page"] for r in tables} == {4, 5}
    for r in tables:
        first = r["text"].splitlines()[0]
        assert all(cell in first for cell in TABLE_HEADER), r["text"]
    body = "\n".join(r["text"] for r in tables)
    for i, segment in enumerate(SEGMENTS):
        assert any(segment in line and f"{1000 + 37 * i:,}" in line and f"{900 + 29 * i:,}" in line
                   for line in body.splitlines()), segment                              # a row stays one line


def test_docx_headings_and_table(store) -> None:
    docx_rows = [r for r in store[2] if r["source"] == "handbook.docx"]
    assert {r["title"] for r in docx_rows} == {"Staff Handbook"}
    travel = [r for r in docx_rows if "portal" in r["text"]]
    assert travel and travel[0]["headings"] == "Policies > Travel"
    (table,) = [r for r in docx_rows if r["element"] == "table"]      # its short lead paragraph is its caption
    assert table["text"].splitlines()[:2] == [travel[0]["text"].splitlines()[0], "| Expense | Limit |"]
    assert "| Hotel night | 180 EUR |" in table["text"] and table["headings"] == "Policies > Travel"
    assert [r["headings"] for r in docx_rows if "Badges" in r["text"]] == ["Policies > Security"]


def test_junk_is_skipped_and_counted(store) -> None:
    work, files, rows = store
    notes = [r for r in rows if r["source"] == "notes.txt"]
    assert files["notes.txt"]["junk_chunks"] >= 5 and files["notes.txt"]["status"] == "ingested"
    assert len(notes) == files["notes.txt"]["chunks"] >= 2
    assert not any(len(max(r["text"].split(), key=len)) >= 60 for r in notes)
    report = json.loads((work / "report.json").read_text())
    assert report["totals"]["junk_chunks"] == files["notes.txt"]["junk_chunks"]


def test_search_shows_title_section_and_page(store) -> None:
    work = store[0]
    hits = ingest("search", "hotel night expense limit", "--json", "-k", "3", "--store", str(work / "store.db"),
                  cwd=work)
    assert hits.rc == 0, hits.stderr
    top = json.loads(hits.stdout)[0]
    assert top["source"] == "handbook.docx" and top["title"] == "Staff Handbook"
    assert top["headings"] == "Policies > Travel" and top["element"] == "table"
    plain = ingest("search", "liquidity of Acme in 2023", "-k", "2", "--store", str(work / "store.db"), cwd=work)
    assert plain.rc == 0, plain.stderr
    assert "Acme Annual Report" in plain.stdout and "Item 7. Liquidity" in plain.stdout and "p.3" in plain.stdout


def test_eval_scores_a_question_set(store) -> None:
    work = store[0]
    questions = work / "questions.jsonl"
    questions.write_text("\n".join(json.dumps(q) for q in [
        {"question": "What is the hotel night expense limit?", "source": "handbook.docx"},
        {"question": "Acme 2023 segment results: Copper division revenue", "source": "ACME_2023_annual.pdf",
         "pages": [4]},
    ]) + "\n")
    res = ingest("eval", str(questions), "--json", "--store", str(work / "store.db"), cwd=work)
    assert res.rc == 0, res.stderr
    metrics = json.loads(res.stdout)["metrics"]
    assert metrics["doc-hit@5"] == 1.0 and metrics["page-hit@5"] == 1.0
