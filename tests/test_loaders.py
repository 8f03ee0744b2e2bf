"""Every loader, in process, on real documents built by tests/docs.py."""
from __future__ import annotations

import dataclasses
import os
import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

import docs
from conftest import needs_soffice
from ingest import loaders
from ingest.config import load_config, loader_options, ocr_options
from ingest.loaders import LoaderError, LoaderOptions, OcrOptions, Unsupported, formats, loader_for, pool_for, register
from ingest.loaders.ocr import ocr_page, reading_order
from ingest.loaders.pdf import needs_ocr
from ingest.sniff import detect_format


def opts(**overrides: Any) -> LoaderOptions:
    """Loader options as the supervisor builds them from the default config, with `overrides`."""
    return dataclasses.replace(loader_options(load_config()), **overrides)


def ocr_opts(**overrides: Any) -> OcrOptions:
    """OCR options as the supervisor builds them from the default config, with `overrides`."""
    return dataclasses.replace(ocr_options(load_config()), **overrides)


def load(path: Path, **overrides: Any) -> list[loaders.Page]:
    """detect_format, then that format's loader with the default options (+ overrides)."""
    return list(loader_for(detect_format(path))(path, opts(**overrides)))


def words(text: str) -> str:
    return " ".join(text.split()).lower()


# ---- registry ------------------------------------------------------------------------------------

def test_every_format_is_registered_in_its_pool() -> None:
    pools = {fmt: pool_for(fmt) for fmt in formats()}
    assert pools == {"txt": "txt", "md": "txt", "pdf": "pdf", "image": "pdf", "docx": "docx",
                     "pptx": "pptx", "doc": "docx", "ppt": "pptx"}


def test_registry_refuses_duplicates() -> None:
    with pytest.raises(ValueError, match="format 'txt' is already registered"):
        register("txt", (".text",), "txt")(lambda path, options: iter(()))
    with pytest.raises(ValueError, match="extension '.pdf' is already registered"):
        register("pdf2", (".PDF",), "pdf")(lambda path, options: iter(()))
    assert "pdf2" not in formats()


# ---- text ----------------------------------------------------------------------------------------

ENGLISH = "Plain text survives every round trip: naïve café, Zoë's résumé.\nSecond line."
CHINESE = "这是一个用于测试的中文段落。我们希望编码检测能够正确识别简体中文文本，而不会误认为其他编码。"
JAPANESE = "これは日本語のテキストです。文字コードの自動判別が正しく動作するかどうかを確認します。"
WESTERN = "Prima di tutto, la città è bella. Perché no? Déjà vu à la française, “quoted” – 5 €."


@pytest.mark.parametrize("text, encoding", [
    (ENGLISH, "utf-8"), (ENGLISH, "utf-8-sig"), (ENGLISH + CHINESE, "utf-16"), (ENGLISH, "utf-16-le"),
    (ENGLISH, "utf-16-be"), (ENGLISH + JAPANESE, "utf-32"), (CHINESE, "gbk"), (CHINESE, "gb18030"),
    (JAPANESE, "shift_jis"), (WESTERN, "cp1252"), ("Ça va? Déjà vu, über naïve Jürgen, señor.", "latin-1"),
])
def test_text_encodings_are_detected(tmp_path: Path, text: str, encoding: str) -> None:
    path = docs.write_text(tmp_path / "note.txt", text, encoding)
    assert load(path) == [loaders.Page(None, text)]


def test_markdown_title_is_first_h1_outside_code(tmp_path: Path) -> None:
    md = "Intro line\n```bash\n# not a title\n```\n## Sub\n# Real Title #\nBody\n# Later\n"
    [page] = load(docs.write_text(tmp_path / "readme.md", md, "utf-8"))
    assert (page.number, page.title, page.text) == (None, "Real Title", md)
    [page] = load(docs.write_text(tmp_path / "plain.markdown", "no heading\r\nhere", "utf-8"))
    assert (page.title, page.text) == (None, "no heading\nhere")


def test_oversized_text_is_refused_without_reading(tmp_path: Path) -> None:
    path = docs.make_big_text(tmp_path / "huge.txt", 200)
    start = time.perf_counter()
    with pytest.raises(LoaderError, match=r"text file is 200\.0 MB, over \[limits\] max_text_mb = 64; raise"):
        list(loader_for("txt")(path, opts()))
    assert time.perf_counter() - start < 1
    small = docs.write_text(tmp_path / "small.txt", "x" * 5000, "utf-8")
    with pytest.raises(LoaderError, match="max_text_mb = 0.001"):
        list(loader_for("txt")(small, opts(max_text_mb=0.001)))


# ---- sniff ---------------------------------------------------------------------------------------

def test_detect_format_accepts_matching_content(tmp_path: Path) -> None:
    assert detect_format(docs.make_png(tmp_path / "scan.JPG", "x")) == "image"      # any image kind
    assert detect_format(docs.write_text(tmp_path / "u16.txt", ENGLISH, "utf-16-le")) == "txt"
    assert detect_format(docs.write_text(tmp_path / "bmw.md", "BMW cars\n", "utf-8")) == "md"
    assert detect_format(docs.make_pdf(tmp_path / "a.pdf", ["x"])) == "pdf"


@pytest.mark.parametrize("name, content, message", [
    ("noise.txt", random.Random(7).randbytes(4096), "binary content in a .txt file"),
    ("fake.pdf", b"PK\x03\x04" + bytes(100), "not a valid ZIP file"),
    ("fake.docx", b"just text", "content does not look like a .docx file"),
    ("old.docx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(600), "damaged legacy Office file"),
])
def test_detect_format_refuses_contradicting_content(tmp_path: Path, name: str, content: bytes,
                                                     message: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(LoaderError, match=re.escape(message)):
        detect_format(path)


def test_detect_format_unsupported_and_unreadable(tmp_path: Path) -> None:
    (tmp_path / "data.xyz").write_bytes(b"abc")
    with pytest.raises(Unsupported, match=r"unsupported file type \.xyz"):
        detect_format(tmp_path / "data.xyz")
    (tmp_path / "a.txt").symlink_to(tmp_path / "b.txt")
    (tmp_path / "b.txt").symlink_to(tmp_path / "a.txt")
    with pytest.raises(LoaderError, match="symlink loop"):
        detect_format(tmp_path / "a.txt")
    os.mkfifo(tmp_path / "pipe.md")
    with pytest.raises(LoaderError, match="not a regular file"):
        detect_format(tmp_path / "pipe.md")
    if os.geteuid() != 0:                         # root reads everything
        locked = docs.write_text(tmp_path / "locked.txt", "secret", "utf-8")
        locked.chmod(0)
        with pytest.raises(LoaderError, match="permission denied; check the file's permissions"):
            detect_format(locked)


# ---- PDF -----------------------------------------------------------------------------------------

SMALL_PAGE = (595.0, 300.0)   # scans for OCR are kept small: OCR time grows with the pixel count


@pytest.fixture(scope="module")
def mixed_pdf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return docs.make_mixed_pdf(tmp_path_factory.mktemp("pdf") / "mixed.pdf", "Typed quarterly summary",
                               "扫描文件中的中文识别测试", SMALL_PAGE)


def test_pdf_text_pages_numbered_from_one(tmp_path: Path) -> None:
    path = docs.make_pdf(tmp_path / "report.pdf", ["First page text", "第二页：中文内容", "Third"], title="Annual Report")
    pages = load(path)
    assert [(p.number, p.text.strip(), p.title, p.needs_ocr) for p in pages] == [
        (1, "First page text", "Annual Report", False), (2, "第二页：中文内容", "Annual Report", False),
        (3, "Third", "Annual Report", False)]


@pytest.mark.parametrize("mode, expected", [
    ("auto", [(1, "Typed quarterly summary", False), (2, "", True)]),
    ("always", [(1, "", True), (2, "", True)]),
    ("never", [(1, "Typed quarterly summary", False), (2, "", False)]),
])
def test_pdf_ocr_decision(mixed_pdf: Path, mode: str, expected: list[tuple[int, str, bool]]) -> None:
    assert [(p.number, p.text.strip(), p.needs_ocr) for p in load(mixed_pdf, pdf_ocr=mode)] == expected


def test_scan_with_a_few_stray_characters_needs_ocr(tmp_path: Path) -> None:
    import pymupdf

    scanned = docs.make_scanned_pdf(tmp_path / "scan.pdf", ["A scanned letter"], SMALL_PAGE)
    with pymupdf.open(scanned) as doc:
        doc[0].insert_text((20, 290), "p. 12", fontsize=8)      # a page number in the text layer
        doc.save(tmp_path / "stamped.pdf")
    [page] = load(tmp_path / "stamped.pdf")
    assert (page.text, page.needs_ocr) == ("", True)


def test_unreadable_glyphs_need_ocr(tmp_path: Path) -> None:
    import pymupdf

    with pymupdf.open(docs.make_pdf(tmp_path / "t.pdf", ["x"])) as doc:
        page = doc[0]
        assert needs_ocr(page, "\ue001\ue002\ue003 \ufffd\ufffd\x01\x02 ab")
        assert not needs_ocr(page, "Short")                    # little text, but no image: keep it
        assert not needs_ocr(page, "A normal line of text with one \ufffd in it")


def test_blank_pages_skip_ocr_and_pages_with_marks_do_not(tmp_path: Path) -> None:
    import pymupdf

    doc = pymupdf.open()
    for _ in range(5):
        doc.new_page(width=300, height=400)
    doc[1].draw_rect(pymupdf.Rect(20, 20, 280, 20.7), color=None, fill=(0.6, 0.6, 0.6))    # a thin rule
    doc[2].draw_rect(pymupdf.Rect(50, 50, 150, 90), color=None, fill=(0, 0, 0))            # a box: may be a logo
    doc[3].add_ink_annot([[(50, 50), (100, 80), (150, 60)]])                                # a signature
    doc[4].insert_image(pymupdf.Rect(0, 0, 30, 30), filename=str(docs.make_png(tmp_path / "x.png", "x")))  # an image
    doc.save(tmp_path / "marks.pdf")
    with pymupdf.open(tmp_path / "marks.pdf") as pdf:
        assert [needs_ocr(pdf[i], pdf[i].get_text()) for i in range(5)] == [False, False, True, True, True]
    pages = list(load(tmp_path / "marks.pdf"))
    assert [(p.number, p.text, p.needs_ocr) for p in pages[:2]] == [(1, "", False), (2, "", False)]
    assert [p.needs_ocr for p in pages[2:]] == [True, True, True]


def test_pdf_encrypted(tmp_path: Path) -> None:
    path = docs.make_encrypted_pdf(tmp_path / "locked.pdf", ["Classified memo"], password="hunter2")
    with pytest.raises(LoaderError, match=r"^PDF is encrypted; add its password to \[loaders.pdf\] passwords$"):
        load(path)
    [page] = load(path, passwords=("wrong", "hunter2"))
    assert page.text.strip() == "Classified memo"


def test_pdf_truncated_or_garbage(tmp_path: Path) -> None:
    with pytest.raises(LoaderError, match=r"PDF is truncated \(no %%EOF at its end\)"):
        load(docs.make_truncated_pdf(tmp_path / "cut.pdf", ["one", "two"]))
    garbage = tmp_path / "garbage.pdf"
    garbage.write_bytes(b"%PDF-1.7\n" + os.urandom(2000) + b"\n%%EOF\n")
    with pytest.raises(LoaderError, match="cannot open the PDF: damaged or not a PDF"):
        load(garbage)


# ---- images and OCR ------------------------------------------------------------------------------

def test_image_frames_need_ocr(tmp_path: Path) -> None:
    assert load(docs.make_png(tmp_path / "a.png", "x")) == [loaders.Page(1, "", needs_ocr=True)]
    tiff = docs.make_tiff(tmp_path / "fax.tiff", ["one", "two", "three"])
    assert [(p.number, p.needs_ocr) for p in load(tiff)] == [(1, True), (2, True), (3, True)]
    broken = tmp_path / "broken.png"
    broken.write_bytes((tmp_path / "a.png").read_bytes()[:200])
    with pytest.raises(LoaderError, match="frame 1 of the image is damaged"):
        load(broken)


def test_ocr_reads_english_chinese_and_png(tmp_path: Path, mixed_pdf: Path) -> None:
    scanned = docs.make_scanned_pdf(tmp_path / "scan.pdf", ["Invoice number 4471 is overdue"], SMALL_PAGE)
    png = docs.make_png(tmp_path / "sign.png", "Meeting moved to Friday")
    timings = {}
    for name, path, page in [("english pdf", scanned, 1), ("chinese pdf", mixed_pdf, 2), ("png", png, 1)]:
        start = time.perf_counter()
        timings[name] = (ocr_page(path, page, ocr_opts()), time.perf_counter() - start)
    print("OCR seconds:", {k: round(t, 2) for k, (_, t) in timings.items()})
    assert words(timings["english pdf"][0].text) == "invoice number 4471 is overdue"
    assert timings["chinese pdf"][0].text.replace(" ", "") == "扫描文件中的中文识别测试"
    assert timings["png"][0] == loaders.Page(1, "Meeting moved to Friday")


def test_ocr_paddle_without_models_says_how(tmp_path: Path) -> None:
    png = docs.make_png(tmp_path / "a.png", "x")
    with pytest.raises(LoaderError, match=r"pip install paddleocr.*\[loaders.ocr\] paddle_model_dir"):
        ocr_page(png, 1, ocr_opts(backend="paddleocr"))
    with pytest.raises(LoaderError, match="page 2 does not exist"):
        ocr_page(png, 2, ocr_opts())


def test_reading_order_rows_then_columns() -> None:
    def box(x: float, y: float, w: float = 50, h: float = 20) -> list[list[float]]:
        return [[x, y], [x + w, y], [x + w, y + h], [x, y + h]]

    lines = [(box(200, 102), "right"), (box(10, 160), "second row"), (box(10, 100), "left")]
    assert reading_order(lines) == "left right\nsecond row"


# ---- DOCX / PPTX ---------------------------------------------------------------------------------

def test_docx_keeps_every_part_in_order(tmp_path: Path) -> None:
    path = docs.make_docx(
        tmp_path / "memo.docx", ["Opening paragraph", "Second paragraph"], heading="Project Plan",
        table_rows=[["Owner", "Task"], ["Ana", "Budget"]], header="ACME Confidential", footer="Page footer text",
        after_table=["Closing paragraph"], nested_rows=[["inner a", "inner b"]], content_control="Signed by Bo",
        first_page_header="ACME Confidential")
    [page] = load(path)
    assert page.number is None and page.title == "Project Plan"
    assert page.text.split("\n\n") == [
        "ACME Confidential", "Project Plan", "Opening paragraph", "Second paragraph",
        "| Owner | Task |\n| --- | --- |\n| Ana | Budget inner a \\| inner b |", "Closing paragraph", "Signed by Bo",
        "Page footer text"]
    assert [b.kind for b in page.blocks if b.kind == "table"] == ["table"]


def test_docx_title_and_header_variants(tmp_path: Path) -> None:
    path = docs.make_docx(tmp_path / "t.docx", ["Body"], heading="Heading", header="Every page",
                          first_page_header="Cover page only", title="Core Title", table_rows=[["a", "b"]],
                          table_style="Table Grid")
    [page] = load(path)
    assert page.title == "Core Title"
    assert page.text.split("\n\n") == ["Every page", "Cover page only", "Heading", "Body", "| a | b |"]


def test_docx_zip_bomb_and_non_zip(tmp_path: Path) -> None:
    bomb = docs.make_zip_bomb_docx(tmp_path / "bomb.docx", 3)
    with pytest.raises(LoaderError, match=r"DOCX unzips to 3\.\d MB, over \[limits\] max_unzipped_mb = 1"):
        load(bomb, max_unzipped_mb=1)
    assert load(bomb) == [loaders.Page(None, "")]
    fake = tmp_path / "fake.docx"
    fake.write_bytes(b"PK\x03\x04" + os.urandom(300))
    with pytest.raises(LoaderError, match="not a valid DOCX file"):
        load(fake)
    deck = docs.make_pptx(tmp_path / "deck.docx", [{"title": "x"}])
    assert load(deck) == [loaders.Page(1, "x", blocks=(loaders.Block("heading", "x", level=1),))]  # by its content


def test_pptx_slides_groups_tables_notes(tmp_path: Path) -> None:
    path = docs.make_pptx(tmp_path / "deck.pptx", [
        docs.Slide(title="Roadmap 2025", body="Ship the loader", group=["grouped left", "grouped right"],
                   table=[["Quarter", "Goal"], ["Q1", "Beta"]], notes="Mention the budget"),
        {"body": "Untitled slide text"},
    ])
    first, second = load(path)
    assert (first.number, first.title, first.blocks[0]) == (1, None, loaders.Block("heading", "Roadmap 2025", 1))
    assert first.text.split("\n\n") == ["Roadmap 2025", "Ship the loader", "grouped left", "grouped right",
                                        "| Quarter | Goal |\n| --- | --- |\n| Q1 | Beta |", "Mention the budget"]
    assert first.blocks[4] == loaders.Block("table", "| Q1 | Beta |", header="| Quarter | Goal |\n| --- | --- |")
    assert second == loaders.Page(2, "Untitled slide text", blocks=(loaders.Block("text", "Untitled slide text"),))


# ---- legacy (LibreOffice) ------------------------------------------------------------------------

@pytest.mark.slow
@needs_soffice
def test_doc_and_ppt_via_libreoffice(tmp_path: Path) -> None:
    doc = docs.make_doc(tmp_path / "old.doc", ["Legacy body text"], heading="Old Heading",
                        table_rows=[["k", "v"]], header="Old header")
    [page] = load(doc)
    assert page.text.split("\n\n") == ["Old header", "Old Heading", "Legacy body text", "| k | v |"]
    ppt = docs.make_ppt(tmp_path / "old.ppt", [docs.Slide(title="Old deck", group=["in a group"],
                                                          table=[["c1", "c2"]], notes="old notes")])
    [slide] = load(ppt)
    assert (slide.number, slide.title, slide.text.split("\n\n")) == (1, None, ["Old deck", "in a group", "| c1 | c2 |",
                                                                             "old notes"])
    assert slide.blocks[0] == loaders.Block("heading", "Old deck", 1)


@needs_soffice
def test_legacy_too_slow(tmp_path: Path) -> None:
    doc = tmp_path / "x.doc"
    doc.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(600))
    with pytest.raises(LoaderError, match=r"LibreOffice did not convert the \.doc within 0\.01 s"):
        load(doc, convert_timeout_s=0.01)


def test_legacy_without_soffice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = tmp_path / "x.doc"
    doc.write_bytes(b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(600))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(Unsupported, match=r"^legacy \.doc needs LibreOffice \(soffice\) on PATH; install"):
        load(doc)
