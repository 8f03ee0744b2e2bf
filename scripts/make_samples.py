"""Rebuild samples/: one small file per format, each holding a distinctive phrase (listed in
samples/README.md) to try `ingest search` with.

    python scripts/make_samples.py [OUT_DIR]      # default: samples/ next to this script's parent
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import docs  # noqa: E402  (the test suite's document builders)

# file name -> (what it is, its phrase)
PHRASES = {
    "lighthouse.txt": ("UTF-8 text", "The lighthouse keeper logs every passing ship"),
    "field-notes.md": ("Markdown", "Migratory cranes return to the marsh in early March"),
    "yangtze-gbk.txt": ("Chinese text in GBK", "长江是亚洲最长的河流"),
    "quarterly-report.pdf": ("PDF with a text layer", "Quarterly revenue grew by eleven percent"),
    "scanned-letter.pdf": ("scanned PDF page (OCR)", "Invoices are archived in the basement"),
    "parking-sign.png": ("PNG image (OCR)", "Parking is free after six"),
    "office-memo.docx": ("DOCX with header and table", "The blue meeting room seats twelve people"),
    "mascot-deck.pptx": ("PPTX with group shape, table, notes", "Our mascot is a purple octopus"),
    "legacy-minutes.doc": ("Word 97 document", "The orchard committee approved new ladders"),
    "legacy-slides.ppt": ("PowerPoint 97 deck", "Volunteers repaint the harbour fence"),
}


def build(out: Path) -> None:
    p = {name: phrase for name, (_, phrase) in PHRASES.items()}
    docs.write_text(out / "lighthouse.txt", f"Coastal log.\n{p['lighthouse.txt']}, day and night.\n", "utf-8")
    docs.write_text(out / "field-notes.md", f"# Field Notes\n\n{p['field-notes.md']}.\n\n## Gear\n\n- binoculars\n", "utf-8")
    docs.write_text(out / "yangtze-gbk.txt", f"{p['yangtze-gbk.txt']}，全长约六千三百公里，流经十一个省级行政区。\n", "gbk")
    docs.make_pdf(out / "quarterly-report.pdf", [f"{p['quarterly-report.pdf']} this quarter.",
                                                 "第二页：年度预算摘要。"], title="Quarterly Report")
    docs.make_scanned_pdf(out / "scanned-letter.pdf", [p["scanned-letter.pdf"]], size=(595.0, 300.0))
    docs.make_png(out / "parking-sign.png", p["parking-sign.png"])
    docs.make_docx(out / "office-memo.docx", [f"{p['office-memo.docx']}.", "Book it a day ahead."],
                   heading="Room Guide", table_rows=[["Room", "Seats"], ["Blue", "12"], ["Green", "6"]],
                   header="Internal memo - do not forward", footer="Facilities team")
    docs.make_pptx(out / "mascot-deck.pptx", [docs.Slide(
        title="Brand Update", body="New colours for spring", group=[p["mascot-deck.pptx"], "named Inky"],
        table=[["Item", "Status"], ["Logo", "Done"]], notes="Mention the octopus plush toys")])
    if shutil.which("soffice") is None:
        print("no LibreOffice (soffice) on PATH: skipping the .doc and .ppt samples")
        return
    docs.make_doc(out / "legacy-minutes.doc", [f"{p['legacy-minutes.doc']}."], heading="Minutes")
    docs.make_ppt(out / "legacy-slides.ppt", [docs.Slide(title="Harbour Day", body=p["legacy-slides.ppt"],
                                                         notes="Paint is in the shed")])


def readme(out: Path) -> str:
    rows = "\n".join(f"| `{name}` | {what} | {phrase} |" for name, (what, phrase) in PHRASES.items()
                     if (out / name).exists())
    return f"""# Sample documents

One small file per format, made by `python scripts/make_samples.py`. Ingest them and search for a
phrase:

    ingest run samples/
    ingest search "purple octopus"

This README is ingested too, so it matches every phrase as well; the hit to look for is the
file named in the table.

| file | format | phrase to search for |
| --- | --- | --- |
{rows}
"""


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "samples"
    out.mkdir(parents=True, exist_ok=True)
    build(out)
    (out / "README.md").write_text(readme(out), encoding="utf-8")
    total = sum(f.stat().st_size for f in out.iterdir())
    print(f"wrote samples to {out} ({total / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
