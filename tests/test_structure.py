"""Structure-aware loaders (issue 21): headings, tables and running lines as Blocks, on documents the
tests build with PyMuPDF, python-docx and python-pptx; loader functions called directly (no store)."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ingest.config import load_config, loader_options
from ingest.loaders import Page, loader_for

BODY = ("Revenue grew in every region during the year, driven by new customers and higher prices. "
        "Costs rose more slowly than sales, so the operating margin widened for the third year in a row.")


def load(fmt: str, path: Path, **overrides: Any) -> list[Page]:
    options = dataclasses.replace(loader_options(load_config()), **overrides)
    return list(loader_for(fmt)(path, options))


def kinds(page: Page) -> list[tuple]:
    return [(b.kind, b.level, b.text) if b.kind == "heading" else (b.kind, b.text[:20]) for b in page.blocks]


def write_lines(page: Any, y: float, text: str, size: float = 10, font: str = "helv") -> float:
    """Body text wrapped at ~90 characters from y; returns the y after it."""
    words, line = text.split(), ""
    for word in words:
        if len(line) + len(word) > 90:
            page.insert_text((50, y), line, fontsize=size, fontname=font)
            y, line = y + size * 1.3, ""
        line = f"{line} {word}".strip()
    page.insert_text((50, y), line, fontsize=size, fontname=font)
    return y + size * 2.5


def test_pdf_outline_entries_become_headings(tmp_path: Path) -> None:
    import pymupdf

    doc = pymupdf.open()
    for title, sub in [("Introduction", "Scope of the study"), ("Results", None)]:
        page = doc.new_page()
        y = write_lines(page, 72, title)
        if sub:
            y = write_lines(page, y, BODY)
            y = write_lines(page, y, sub)
        write_lines(page, y, BODY)
    doc.set_toc([[1, "Introduction", 1], [2, "Scope of the study", 1], [1, "Results", 2], [2, "Missing entry", 2]])
    doc.save(tmp_path / "outline.pdf")
    first, second = load("pdf", tmp_path / "outline.pdf")
    assert kinds(first) == [("heading", 1, "Introduction"), ("text", BODY[:20]), ("heading", 2, "Scope of the study"),
                            ("text", BODY[:20])]
    assert kinds(second) == [("heading", 2, "Missing entry"), ("heading", 1, "Results"), ("text", BODY[:20])]
    assert first.blocks[0].bbox is not None and first.blocks[0].bbox[1] < first.blocks[1].bbox[1]
    assert first.text.startswith("Introduction\n\nRevenue grew")


def test_pdf_headings_by_font_size_and_weight(tmp_path: Path) -> None:
    import pymupdf

    doc = pymupdf.open()
    page = doc.new_page()
    y = write_lines(page, 72, "Annual Overview", size=20)
    y = write_lines(page, y, BODY * 2)
    y = write_lines(page, y, "Segment Results", size=14)
    y = write_lines(page, y, BODY)
    y = write_lines(page, y, "Liquidity and Capital Resources", font="hebo")
    y = write_lines(page, y, BODY)
    y = write_lines(page, y, "This bold line is a sentence and ends with a period.", font="hebo")
    write_lines(page, y, BODY)
    doc.save(tmp_path / "fonts.pdf")
    [page] = load("pdf", tmp_path / "fonts.pdf")
    headings = [(b.level, b.text) for b in page.blocks if b.kind == "heading"]
    assert headings == [(1, "Annual Overview"), (2, "Segment Results"), (3, "Liquidity and Capital Resources")]
    assert "This bold line is a sentence" in page.text


def _table_page(page: Any, rows: list[list[str]], y: float) -> float:
    for row in rows:
        for x, text in zip((50, 300, 400), row):
            page.insert_text((x, y), text, fontsize=10)
        y += 13
    return y + 20


def test_pdf_table_rows_and_continuation_gets_the_header(tmp_path: Path) -> None:
    import pymupdf

    doc = pymupdf.open()
    page = doc.new_page()
    y = write_lines(page, 72, BODY)
    _table_page(page, [["(in millions)", "2023", "2022"], ["Net sales", "$ 1,200", "$ 1,100"],
                       ["Cost of sales", "(700)", "(650)"], ["Gross margin", "500", "450"]], y + 580)
    page = doc.new_page()
    y = _table_page(page, [["Operating expenses", "210", "190"], ["Operating income", "290", "260"]], 72)
    write_lines(page, y, BODY)
    doc.save(tmp_path / "table.pdf")
    first, second = load("pdf", tmp_path / "table.pdf")
    [table] = [b for b in first.blocks if b.kind == "table"]
    assert table.header == "| (in millions) | 2023 | 2022 |\n| --- | --- | --- |"
    assert table.text.split("\n") == ["| Net sales | 1,200 | 1,100 |", "| Cost of sales | (700) | (650) |",
                                      "| Gross margin | 500 | 450 |"]
    assert second.blocks[0].kind == "table" and second.blocks[0].header == table.header
    assert second.blocks[0].text.startswith("| Operating expenses | 210 | 190 |")
    assert "Net sales" not in first.blocks[0].text                          # table text is not repeated
    assert [b.kind for b in load("pdf", tmp_path / "table.pdf", pdf_tables="never")[0].blocks] == ["text"] * 2


def test_pdf_running_headers_footers_and_page_numbers_removed(tmp_path: Path) -> None:
    import pymupdf

    doc = pymupdf.open()
    romans = ["i", "ii", "iii", "iv", "v", "vi"]
    words = BODY.split()
    for n in range(6):
        page = doc.new_page()
        page.insert_text((50, 30), "Table of Contents", fontsize=9)
        write_lines(page, 80, f"Body of page {n + 1}: " + " ".join(words[n:] + words[:n]))
        page.insert_text((50, 800), f"Acme Corp. 2021 Form 10-K {romans[n]}", fontsize=9)
        page.insert_text((290, 815), str(n + 1) if n % 2 else f"- {n + 1} -", fontsize=9)
    doc.save(tmp_path / "running.pdf")
    pages = load("pdf", tmp_path / "running.pdf")
    assert len(pages) == 6
    for n, page in enumerate(pages):
        assert page.text.startswith(f"Body of page {n + 1}: "), page.text
        assert len(page.text) > len(BODY)
        assert "Table of Contents" not in page.text and "Acme Corp" not in page.text
        assert not any(b.text.strip("- ") == str(n + 1) for b in page.blocks)


def test_docx_heading_styles_and_table_in_body_order(tmp_path: Path) -> None:
    import docx

    doc = docx.Document()
    doc.core_properties.title = "Quarterly Memo"
    doc.add_heading("Overview", level=1)
    doc.add_paragraph("First paragraph.")
    table = doc.add_table(rows=2, cols=2)
    for r, row in enumerate([["Region", "Sales"], ["North", "12"]]):
        for c, text in enumerate(row):
            table.cell(r, c).text = text
    doc.add_heading("Details", level=2)
    doc.add_paragraph("Second paragraph.")
    doc.save(tmp_path / "memo.docx")
    [page] = load("docx", tmp_path / "memo.docx")
    assert page.title == "Quarterly Memo"
    assert kinds(page) == [("heading", 1, "Overview"), ("text", "First paragraph."), ("table", "| North | 12 |"),
                           ("heading", 2, "Details"), ("text", "Second paragraph.")]
    assert page.blocks[2].header == "| Region | Sales |\n| --- | --- |"


def test_pptx_slide_title_and_table(tmp_path: Path) -> None:
    import pptx
    from pptx.util import Inches

    deck = pptx.Presentation()
    deck.core_properties.title = "Board Update"
    slide = deck.slides.add_slide(deck.slide_layouts[5])              # title only
    slide.shapes.title.text = "Sales by Quarter"
    shape = slide.shapes.add_table(3, 2, Inches(1), Inches(2), Inches(6), Inches(2))
    for r, row in enumerate([["Quarter", "Sales"], ["Q1", "10"], ["Q2", "14"]]):
        for c, text in enumerate(row):
            shape.table.cell(r, c).text = text
    deck.save(tmp_path / "deck.pptx")
    [page] = load("pptx", tmp_path / "deck.pptx")
    assert (page.number, page.title) == (1, "Board Update")
    assert kinds(page) == [("heading", 1, "Sales by Quarter"), ("table", "| Q1 | 10 |\n| Q2 | 1")]
    assert page.blocks[1].header == "| Quarter | Sales |\n| --- | --- |"


def test_markdown_headings_and_table(tmp_path: Path) -> None:
    path = tmp_path / "notes.md"
    path.write_text("# Guide\nIntro text.\n\n```\n# not a heading\n```\n## Prices\n| Plan | Cost |\n|---|--:|\n"
                    "| Basic | 5 |\n| Pro | 9 |\n\nAfter the table.\n", encoding="utf-8")
    [page] = load("md", path)
    assert page.title == "Guide" and page.text == path.read_text()
    assert kinds(page) == [("heading", 1, "Guide"), ("text", "Intro text."), ("text", "```\n# not a heading\n"),
                           ("heading", 2, "Prices"), ("table", "| Basic | 5 |\n| Pro "), ("text", "After the table.")]
    assert page.blocks[4].header == "| Plan | Cost |\n| --- | --- |"
    txt = tmp_path / "plain.txt"
    txt.write_text("# not structure in a .txt\n", encoding="utf-8")
    assert load("txt", txt) == [Page(None, "# not structure in a .txt\n")]
