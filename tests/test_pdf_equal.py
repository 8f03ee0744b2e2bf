"""Issue 45 item 2: the PDF loader made cheaper must give the same chunks. A PDF built here (headings by
outline and by font, body text over many pages, a running header and footer with page numbers, a ruled
table, tables of aligned figures, one continued on the next page, a page for OCR) is loaded whole and
by page ranges, with tables "auto" and "always"; its pages (blocks, bboxes, running lines) and its chunks
(texts, pages, headings, element, bboxes, token ids) must equal tests/pdf_equal.json, recorded from the code
before the change (`python tests/test_pdf_equal.py --write` records it again from the importable code).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

import pytest

FIXTURE = Path(__file__).with_name("pdf_equal.json")
WORDS = ("revenue margin customer region growth capital liquidity segment pricing demand supply contract "
         "network service quarter dividend pension inventory lease obligation credit market risk water").split()
CASES = (("whole", 1000, "auto"), ("ranges", 8, "auto"), ("always", 1000, "always"))   # name, range pages, tables
ALWAYS_PAGES = 14           # find_tables is slow: "always" reads a shorter PDF


def _para(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words)).capitalize() + "."


def _text(page: Any, y: float, text: str, size: float = 10, font: str = "helv", x: float = 50) -> float:
    """Text wrapped at ~95 characters from y; returns the y after it."""
    line = ""
    for word in text.split():
        if len(line) + len(word) > 95:
            page.insert_text((x, y), line, fontsize=size, fontname=font)
            y, line = y + size * 1.3, ""
        line = f"{line} {word}".strip()
    page.insert_text((x, y), line, fontsize=size, fontname=font)
    return y + size * 2.4


def _figures(page: Any, y: float, rows: list[list[str]], xs: tuple = (50, 330, 430)) -> float:
    for row in rows:
        for x, text in zip(xs, row):
            page.insert_text((x, y), text, fontsize=9.5)
        y += 12.5
    return y + 18


def _ruled(page: Any, y: float, rows: list[list[str]]) -> float:
    """A table drawn with lines: a grid of cells with their text."""
    xs = (50, 200, 330, 460)
    for r, row in enumerate(rows):
        top = y + r * 18
        for c, text in enumerate(row):
            page.draw_rect((xs[c], top, xs[c + 1], top + 18), color=(0, 0, 0), width=0.6)
            page.insert_text((xs[c] + 4, top + 13), text, fontsize=9, fontname="hebo" if r == 0 else "helv")
    return y + 18 * len(rows) + 22


def build(path: Path, pages: int = 40) -> None:
    import pymupdf

    rng = random.Random(45)
    doc = pymupdf.open()
    toc = []
    for n in range(pages):
        page = doc.new_page()
        if n == 17:                                             # no text, a box (a logo, a scan): for OCR
            page.draw_rect(pymupdf.Rect(100, 100, 300, 200), color=None, fill=(0, 0, 0))
            continue
        page.insert_text((50, 32), "Acme Water Corporation | 2023 Annual Report on Form 10-K", fontsize=8)
        footer = f"Page {n + 1} of {pages}" if n % 3 else f"- {n + 1} -"
        page.insert_text((280, 815), footer, fontsize=8)
        if n % 2:
            page.insert_text((50, 815), "Acme Water Corporation", fontsize=8)
        y = 70.0
        if n % 5 == 0:
            title = f"Item {n // 5 + 1}. " + " ".join(rng.choice(WORDS) for _ in range(3)).title()
            y = _text(page, y, title, size=18, font="hebo")
            toc.append([1, title, n + 1])
        if n % 4 == 1:
            y = _text(page, y, " ".join(rng.choice(WORDS) for _ in range(4)).title(), size=13)
        if n == 12:                                               # the table continued: the page's first lines
            y = _figures(page, 60, [["Other income", "210", "190"], ["Net income", "290", "260"],
                                    ["Per share", "1.25", "1.05"]])
        y = _text(page, y, " ".join(_para(rng, rng.randint(8, 20)) for _ in range(rng.randint(3, 8))))
        if n % 6 == 2:
            y = _text(page, y, "Results of " + rng.choice(WORDS).title() + " Operations", font="hebo")
            toc.append([2, "Results of Operations", n + 1]) if n == 8 else None
        if n % 7 == 3:
            y = _ruled(page, y, [["Segment", "Customers", "Revenue"], ["Regulated", "1,520", "3,210"],
                                 ["Market-based", "210", "(45)"], ["Total", "1,730", "3,165"]])
        if n % 5 == 4:
            rows = [["(in millions)", "2023", "2022"]] + [[f"{rng.choice(WORDS).title()} {rng.choice(WORDS)}",
                                                          f"$ {rng.randint(10, 9999):,}", f"({rng.randint(1, 999)})"]
                                                         for _ in range(rng.randint(3, 9))]
            y = _figures(page, y, rows)
        y = _text(page, y, " ".join(_para(rng, rng.randint(8, 24)) for _ in range(rng.randint(2, 6))))
        if n in (11, 29):                                         # a table at the foot, continued overleaf
            _figures(page, 700, [["Segment", "2023", "2022"], ["Water sales", "1,200", "1,100"],
                                 ["Wastewater", "(700)", "(650)"]])
    doc.set_toc(toc)
    doc.set_metadata({"title": "Acme Water 10-K", "author": "Acme Water Corporation", "subject": "Annual report"})
    doc.save(path)


def _digest(text: str) -> str:
    """A chunk's text in the fixture: its start and a hash of all of it (the blocks hold the full texts)."""
    return text[:24] + "#" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _box(b: Any) -> list | None:
    return None if b is None else [round(v, 3) for v in b]


def record(folder: Path) -> dict:
    """What the importable code makes of the built PDF: its loader pages and its chunks, per case."""
    from ingest import load as L
    from ingest.config import chunk_spec, load_config, loader_options
    from ingest.loaders import pdf
    from ingest.model_ref import resolve_model

    for name, pages in (("acme.pdf", 40), ("short.pdf", ALWAYS_PAGES)):
        if not (folder / name).exists():
            build(folder / name, pages)
    cfg = load_config()
    spec = chunk_spec(cfg, resolve_model(cfg["model"]["name"]))
    L.import_plugins(())
    out: dict = {}
    for name, range_pages, tables in CASES:
        options = dataclasses.replace(loader_options(cfg), pdf_tables=tables)
        path = folder / ("short.pdf" if tables == "always" else "acme.pdf")
        pages = [dict(number=p.number, text=p.text, title=p.title, ocr=p.needs_ocr, meta=[list(m) for m in p.meta],
                      running=list(p.running),
                      blocks=[[b.kind, b.text, b.level, b.header, _box(b.bbox)] for b in p.blocks])
                 for p in pdf.load_pages(path, options, 0, None)] if range_pages > 100 else []
        saved = L.RANGE_PAGES
        L.RANGE_PAGES = range_pages
        try:
            task = L.LoadTask(str(path), "pdf", options, spec, source="acme.pdf")
            first = L.load_file(task)
            parts = [first] + [L.load_file(dataclasses.replace(task, doc=first.doc, range=r)) for r in first.ranges]
        finally:
            L.RANGE_PAGES = saved
        chunks = []
        for part in parts:
            assert not hasattr(part, "error"), part
            chunks += [dict(page=pc.page, segment=pc.segment, headings=pc.headings, element=pc.element,
                            texts=[_digest(t) for t in pc.chunks], bboxes=list(pc.bboxes), title=pc.title,
                            ids=hashlib.sha256(pc.ids.tobytes()).hexdigest()[:16], lengths=pc.lengths.tolist())
                       for pc in part.pages]
            chunks.append(dict(ocr=[[n, list(h)] for n, h in part.ocr_pages]))
        out[name] = dict(pages=pages, chunks=chunks, parts=len(parts), doc=repr(first.doc))
    return out


@pytest.mark.slow
def test_pdf_chunks_equal_the_recorded_ones(tmp_path: Path) -> None:
    expected = json.loads(FIXTURE.read_text())
    got = json.loads(json.dumps(record(tmp_path)))
    for name, *_ in CASES:
        assert got[name]["parts"] == expected[name]["parts"], name
        assert got[name]["doc"] == expected[name]["doc"], name
        for g, e in zip(got[name]["pages"], expected[name]["pages"], strict=True):
            assert g == e, (name, e["number"])
        for g, e in zip(got[name]["chunks"], expected[name]["chunks"], strict=True):
            assert g == e, (name, e.get("page"))


def test_the_built_pdf_has_every_structure(tmp_path: Path) -> None:
    """The fixture exercises what the loader decides: headings, tables, running lines, an OCR page, ranges."""
    expected = json.loads(FIXTURE.read_text())
    blocks = [b for p in expected["whole"]["pages"] for b in p["blocks"]]
    assert {b[0] for b in blocks} == {"heading", "text", "table"}
    first_tables = [p["blocks"][0] for p in expected["whole"]["pages"] if p["blocks"] and p["blocks"][0][0] == "table"]
    assert any(b[1].startswith("| Other income") and b[3].startswith("| Segment | 2023") for b in first_tables)
    assert any(p["running"] for p in expected["whole"]["pages"])
    assert any(p["ocr"] for p in expected["whole"]["pages"])
    assert expected["ranges"]["parts"] == 5
    assert not any("Acme Water Corporation |" in b[1] for b in blocks)


if __name__ == "__main__" and "--write" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        FIXTURE.write_text(json.dumps(record(Path(tmp)), indent=0, sort_keys=True) + "\n")
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size:,} bytes)")
