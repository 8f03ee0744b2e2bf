"""Issue 9: any file name works, links stay inside the folder, empty files are skipped, and the
content (not the extension) decides a built-in format."""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest

import docs
from conftest import cli_env, needs_soffice, run, search, store_rows
from ingest.files import FileRef
from ingest.loaders import LoaderError, Unsupported
from ingest.scan import printable, scan
from ingest.sniff import detect_format, sniff
from ingest.store import SOURCE_MAX

# name on disk (bytes) -> (its printable source, its text)
NAMED = {
    b'say "hi".txt': ('say "hi".txt', "Walruses haul out on the Arctic ice floes in large groups."),
    b"it's mine.txt": ("it's mine.txt", "Beekeepers smoke the hive gently before opening it."),
    b"back\\slash.txt": ("back\\\\slash.txt", "Lighthouses once burned whale oil to warn passing ships."),
    b"new\nline.txt": ("new\\nline.txt", "Glaciers carve deep U-shaped valleys through the mountains."),
    b"caf\xe9.txt": ("caf\\xe9.txt", "The espresso machine hissed behind the marble counter."),
    "emoji 🦔 notes.md".encode(): ("emoji 🦔 notes.md", "Hedgehogs hibernate in piles of autumn leaves."),
    b"dir\xff/inner.txt": ("dir\\xff/inner.txt", "Volcanic ash makes the surrounding farmland fertile."),
}
SECRET = "Outsidelink confidential payroll figures for the board."
_TEXTS = """
import json, sys
from ingest.store import Store
store = Store(sys.argv[1], "documents")
print(json.dumps(store.rows(["source", "text"])))
"""


def texts_by_source(cwd: Path) -> dict[str, str]:
    """Every stored chunk's text, joined per source (read by a separate process: Milvus Lite locks its file)."""
    proc = subprocess.run([sys.executable, "-c", _TEXTS, str(cwd / "store.db")], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    joined: dict[str, str] = {}
    for row in json.loads(proc.stdout.strip().splitlines()[-1]):
        joined[row["source"]] = joined.get(row["source"], "") + row["text"]
    return joined


def write_named(folder: Path) -> None:
    base = os.fsencode(folder)
    for name, (_, text) in NAMED.items():
        full = os.path.join(base, name)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(text.encode())


@pytest.mark.slow
def test_any_name_links_empty_and_misnamed_office(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = work / "docs"
    write_named(folder)
    (folder / "empty.txt").write_bytes(b"")
    (folder / "blank.txt").write_bytes(b" \n\t \r\n")
    (folder / "spaces.md").write_bytes(b" \n" * 6000)                  # past the sniff's head: the loader decides
    docs.make_docx(folder / "report.doc", ["Quarterly tide tables for the northern harbour."])
    docs.make_pptx(folder / "deck.ppt", [{"title": "Migration routes of arctic terns"}])
    (folder / "target.txt").write_text("Inside target about copper mining in Chile.")
    (folder / "in-link.txt").symlink_to("target.txt")
    (work / "outside.txt").write_text(SECRET)
    (folder / "out-link.txt").symlink_to(work / "outside.txt")
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))        # no LibreOffice for the CLI
    assert shutil.which("soffice") is None and shutil.which("libreoffice") is None

    first = run(folder, work)
    assert first.rc == 0, first.stderr
    files = first.by_path()
    for source, _ in NAMED.values():
        assert files[source]["status"] == "ingested", files[source]
    for name in ("empty.txt", "blank.txt", "spaces.md"):
        assert (files[name]["status"], files[name]["error"]) == ("skipped", "empty file")
    for name, fmt, word in (("report.doc", "docx", "DOCX document"), ("deck.ppt", "pptx", "PPTX presentation")):
        assert (files[name]["status"], files[name]["format"]) == ("ingested", fmt), files[name]
        assert files[name]["warnings"] == [f"content is a {word}; read as {fmt} despite the .{name[-3:]} name"]
    assert files["in-link.txt"]["status"] == "ingested"
    assert files["out-link.txt"]["status"] == "skipped"
    assert files["out-link.txt"]["error"].startswith("link leads outside the folder")
    stored = texts_by_source(work)
    for source, text in NAMED.values():
        assert stored[source] == text
    assert "out-link.txt" not in stored and not any(SECRET in t for t in stored.values())
    assert "copper mining" in stored["in-link.txt"] and "tide tables" in stored["report.doc"]
    for name in (b"caf\xe9.txt", b"new\nline.txt"):
        source, text = NAMED[name]
        assert search(work, text, k=1)[0]["source"] == source

    rows = store_rows(work)
    again = run(folder, work)
    assert again.rc == 0, again.stderr
    ingested = [p for p, f in files.items() if f["status"] == "ingested"]
    assert {p: again.by_path()[p]["status"] for p in ingested} == {p: "unchanged" for p in ingested}
    assert sorted(r["id"] for r in store_rows(work)) == sorted(r["id"] for r in rows)

    os.unlink(os.path.join(os.fsencode(folder), b"caf\xe9.txt"))
    pruned = run(folder, work, "--prune")
    assert pruned.rc == 0, pruned.stderr
    assert pruned.report["totals"]["pruned"] == 1
    left = store_rows(work)
    assert sorted(r["id"] for r in left) == sorted(r["id"] for r in rows if r["source"] != "caf\\xe9.txt")
    assert len(left) < len(rows)


@pytest.mark.slow
def test_follow_symlinks_all_and_none(work: Path) -> None:
    folder = work / "docs"
    (folder / "target.txt").write_text("Inside target about copper mining in Chile.")
    (folder / "in-link.txt").symlink_to("target.txt")
    (work / "outside.txt").write_text(SECRET)
    (folder / "out-link.txt").symlink_to(work / "outside.txt")
    refs = {ref.source: (ref, outcome) for ref, outcome in scan(folder, "none")}
    for name in ("in-link.txt", "out-link.txt"):
        assert refs[name][1] is not None and refs[name][1].status == "skipped"
        assert refs[name][1].error.startswith("symlink; set [run] follow_symlinks")
    assert refs["target.txt"][1] is None

    res = run(folder, work, config='[run]\nfollow_symlinks = "all"\n')
    assert res.rc == 0, res.stderr
    assert {p: f["status"] for p, f in res.by_path().items()} == {
        "in-link.txt": "ingested", "out-link.txt": "ingested", "target.txt": "ingested"}
    assert texts_by_source(work)["out-link.txt"] == SECRET


# ---- in process: the scan ------------------------------------------------------------------------

def test_printable_is_lossless_and_printable() -> None:
    names = [b"plain.txt", b"caf\xe9.txt", "café.txt".encode(), b"a\\xe9.txt", b"a\\\\b", b"tab\there", b"cr\r",
             b"nul\x01\x7f", "\u0085".encode(), b"\xed\xa0\x80", "🦔 \"q\" 'a'".encode()]
    out = [printable(os.fsdecode(n)) for n in names]
    assert out[:4] == ["plain.txt", "caf\\xe9.txt", "café.txt", "a\\\\xe9.txt"]
    assert out[4:9] == ["a\\\\\\\\b", "tab\\there", "cr\\r", "nul\\x01\\x7f", "\\u0085"]
    assert out[9:] == ["\\xed\\xa0\\x80", "🦔 \"q\" 'a'"]
    assert len(set(out)) == len(out)
    assert all(s.isprintable() and s.encode() for s in out)


def test_scan_sources_links_and_long_paths(tmp_path: Path) -> None:
    base = os.fsencode(tmp_path)
    deep = os.path.join(base, *[b"\xff" * 200] * 6)                   # 1.2 kB on disk, 4.8 kB printable
    os.makedirs(deep)
    with open(os.path.join(deep, b"x.txt"), "wb") as f:
        f.write(b"x")
    with open(os.path.join(base, b"caf\xe9.txt"), "wb") as f:
        f.write(b"coffee")
    os.symlink(os.path.join(base, b"caf\xe9.txt"), os.path.join(base, b"link.txt"))
    refs = {ref.source: (ref, outcome) for ref, outcome in scan(tmp_path, "inside")}
    ref, outcome = refs["caf\\xe9.txt"]
    assert outcome is None and ref.path == os.fsdecode(os.path.join(base, b"caf\xe9.txt")) and ref.size == 6
    link, outcome = refs["link.txt"]
    assert outcome is None and link.path == os.path.realpath(ref.path)      # what is opened is what was checked
    [(long_ref, long_outcome)] = [v for k, v in refs.items() if k.endswith("x.txt")]
    assert len(long_ref.source.encode()) > SOURCE_MAX
    assert long_outcome is not None and long_outcome.status == "failed"
    assert "too long for the store" in long_outcome.error and "shorten" in long_outcome.error


# ---- in process: the sniff -----------------------------------------------------------------------

NOSTREAM = 0xFFFFFFFF


def make_cfb(path: Path, names: list[str]) -> Path:
    """A minimal compound file (512-byte sectors) whose root storage holds empty streams `names`.

    Sector 0 is the FAT; the directory fills sectors 1..n, chained through it, the names as a
    right-leaning sibling tree.
    """
    entries = [("Root Entry", 5, NOSTREAM, 1 if names else NOSTREAM)]
    entries += [(name, 2, i + 2 if i + 1 < len(names) else NOSTREAM, NOSTREAM) for i, name in enumerate(names)]
    entries += [("", 0, NOSTREAM, NOSTREAM)] * (-len(entries) % 4)
    directory = bytearray()
    for name, kind, right, child in entries:
        raw = name.encode("utf-16-le") + b"\0\0" if name else b""
        entry = bytearray(128)
        entry[:len(raw)] = raw
        struct.pack_into("<HBB", entry, 64, len(raw), kind, 1)
        struct.pack_into("<III", entry, 68, NOSTREAM, right, child)
        struct.pack_into("<I", entry, 116, 0xFFFFFFFE)
        directory += entry
    dir_sectors = len(directory) // 512
    fat = [0xFFFFFFFD] + [s + 1 for s in range(1, dir_sectors)] + [0xFFFFFFFE]
    fat += [NOSTREAM] * (128 - len(fat))
    header = bytearray(512)
    header[:8] = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
    struct.pack_into("<HHHHH", header, 0x18, 0x3E, 3, 0xFFFE, 9, 6)
    struct.pack_into("<8I", header, 0x2C, 1, 1, 0, 4096, 0xFFFFFFFE, 0, 0xFFFFFFFE, 0)
    struct.pack_into("<109I", header, 0x4C, 0, *[NOSTREAM] * 108)
    path.write_bytes(bytes(header) + struct.pack("<128I", *fat) + bytes(directory))
    return path


def make_zip(path: Path, parts: list[str]) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for part in parts:
            z.writestr(part, "<x/>")
    return path


@pytest.fixture(scope="module")
def legacy(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("legacy")
    return {"doc": docs.make_doc(folder / "real.doc", ["Word 97 body"]),
            "ppt": docs.make_ppt(folder / "real.ppt", [{"title": "PowerPoint 97 slide"}])}


def copy(src: Path, to: Path) -> Path:
    return Path(shutil.copyfile(src, to))


@needs_soffice
def test_content_beats_extension_of_legacy_office(tmp_path: Path, legacy: dict[str, Path]) -> None:
    assert detect_format(copy(legacy["doc"], tmp_path / "word.ppt")) == "doc"
    assert detect_format(copy(legacy["ppt"], tmp_path / "deck.doc")) == "ppt"
    assert detect_format(copy(legacy["doc"], tmp_path / "no-extension")) == "doc"


def test_content_beats_extension(tmp_path: Path) -> None:
    assert detect_format(docs.make_pdf(tmp_path / "pdf.txt", ["x"])) == "pdf"
    assert detect_format(copy(docs.make_png(tmp_path / "scan.png", "x"), tmp_path / "png.pdf")) == "image"
    assert detect_format(docs.make_docx(tmp_path / "docx.pptx", ["x"])) == "docx"
    assert detect_format(docs.make_pptx(tmp_path / "pptx.docx", [{"title": "x"}])) == "pptx"
    assert detect_format(make_cfb(tmp_path / "synthetic.ppt", [f"s{i}" for i in range(9)] + ["WordDocument"])) == "doc"
    (tmp_path / "rtf.pdf").write_bytes(b"{\\rtf1\\ansi Hello}")
    assert detect_format(tmp_path / "rtf.pdf") == "doc"
    (tmp_path / "notes.md").write_text("# Title\n")
    assert detect_format(tmp_path / "notes.md") == "md"


@pytest.mark.parametrize("name, build, error, message", [
    ("text.pdf", lambda p: p.write_text("just some text"), LoaderError,
     "content does not look like a .pdf file (it is plain text); rename it to .txt"),
    ("sheet.docx", lambda p: make_zip(p, ["[Content_Types].xml", "xl/workbook.xml"]), Unsupported,
     "content is an Excel workbook (XLSX), which is not supported"),
    ("book.epub.pdf", lambda p: make_zip(p, ["mimetype", "META-INF/container.xml"]), Unsupported,
     "content is an EPUB e-book"),
    ("sheet.doc", lambda p: make_cfb(p, ["Workbook", "\x05SummaryInformation"]), Unsupported,
     "content is an Excel 97-2003 workbook, which is not supported"),
    ("locked.docx", lambda p: make_cfb(p, ["EncryptionInfo", "EncryptedPackage"]), LoaderError,
     "password-protected Office file; save it without a password"),
    ("noise.pdf", lambda p: p.write_bytes(bytes(range(256)) * 4), LoaderError,
     "content does not look like a .pdf file; the file is damaged or misnamed"),
    ("empty.pdf", lambda p: p.write_bytes(b""), Unsupported, "empty file"),
    ("blank.txt", lambda p: p.write_bytes(b"\r\n \t"), Unsupported, "empty file"),
    ("README", lambda p: p.write_text("plain text without an extension"), Unsupported,
     "unsupported file type (no extension)"),
])
def test_content_refused(tmp_path: Path, name: str, build: Callable[[Path], Any], error: type[Exception],
                         message: str) -> None:
    build(tmp_path / name)
    with pytest.raises(error, match="^" + re.escape(message)):
        detect_format(tmp_path / name)


def test_sniff_reads_by_content_with_a_warning(tmp_path: Path) -> None:
    path = docs.make_docx(tmp_path / "x.doc", ["body"])
    ref = sniff(FileRef(0, "sub/x.doc", str(path), path.stat().st_size), None, "", 100)
    assert isinstance(ref, FileRef) and ref.fmt == "docx"
    assert ref.warnings == ("content is a DOCX document; read as docx despite the .doc name",)
    link = FileRef(0, "link.pdf", str(path), path.stat().st_size)    # a followed link: its own name is the claim
    ref = sniff(link, None, "", 100)
    assert isinstance(ref, FileRef)
    assert ref.warnings == ("content is a DOCX document; read as docx despite the .pdf name",)
