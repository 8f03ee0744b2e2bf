"""What one loader process costs to start, per pool (issue 45: <= 1 CPU-s each), old code beside new.

    python bench/loader_start.py --code e78c4ab            # this tree and e78c4ab, each pool, 3 rounds
    python bench/loader_start.py --rounds 5 --json bench/results/loader-start-DATE.json

Each round runs `ingest run` (null backend, into null://) once per format on a folder holding one tiny file of
it, every pool at one worker, and samples the process tree by role (bench/proctree.py: ingest-txt, ingest-pdf,
ingest-docx, ingest-pptx, ingest-ocr). A pool's figure is its one process's CPU: its start (interpreter,
imports, the chunker's tokenizer, an OCR engine) and one tiny file, whose own cost is a few ms. The scanned
page goes to the OCR pool after the pdf pool reads it; the OCR process's start is its CPU with one scanned page
less the cost of a page (from a 3-page scan: (3 pages - 1 page) / 2). The median of the rounds is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from feed import package_of  # noqa: E402
from proctree import sampled_run  # noqa: E402

POOLS = {"txt": ("txt",), "pdf": ("pdf",), "docx": ("docx",), "pptx": ("pptx",), "scan": ("pdf", "ocr"),
         "scan3": ("ocr",)}
CONFIG = "".join(f"[loaders.{p}]\nworkers = 1\n" for p in ("txt", "pdf", "docx", "pptx", "ocr"))
TEXT = "Rivers carve canyons over millions of years of patient erosion. " * 8


def make_files(root: Path) -> dict[str, Path]:
    """One folder per case, each with one tiny file."""
    import docx
    import pptx
    import pymupdf
    folders = {name: root / name for name in POOLS}
    for f in folders.values():
        f.mkdir(parents=True)
    (folders["txt"] / "a.txt").write_text(TEXT)
    with pymupdf.open() as doc:
        doc.new_page().insert_text((72, 72), TEXT[:80])
        doc.save(folders["pdf"] / "a.pdf")
    d = docx.Document()
    d.add_paragraph(TEXT)
    d.save(folders["docx"] / "a.docx")
    p = pptx.Presentation()
    slide = p.slides.add_slide(p.slide_layouts[1])
    slide.shapes.title.text, slide.placeholders[1].text = "Rivers", TEXT
    p.save(folders["pptx"] / "a.pptx")
    with pymupdf.open() as src:               # a scan: the text as an image only
        src.new_page().insert_text((72, 72), "Rivers carve canyons", fontsize=24)
        pix = src[0].get_pixmap(dpi=100)
    for name, pages in (("scan", 1), ("scan3", 3)):
        with pymupdf.open() as doc:
            for _ in range(pages):
                page = doc.new_page()
                page.insert_image(page.rect, pixmap=pix)
            doc.save(folders[name] / "scan.pdf")
    return folders


def one(case: str, folder: Path, code: Path | None, work: Path) -> dict[str, float]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    config = work / "config.toml"
    config.write_text(CONFIG)
    argv = [sys.executable, "-m", "ingest.cli", "run", str(folder), "--store", "null://", "--backend", "null",
            "--report", str(work / "report.json"), "--quiet", "--config", str(config)]
    run = sampled_run(argv, work, env)
    if run["rc"] != 0:
        sys.exit(f"ingest run failed on {case} ({run['rc']}): {run['stderr'].strip().splitlines()[-3:]}")
    report = json.loads((work / "report.json").read_text())
    assert report["totals"]["by_status"].get("ingested") == 1, report["totals"]
    return {pool: round(run["stages"].get(pool, 0.0), 3) for pool in POOLS[case]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", default="", help="also measure this git revision (or source tree), beside this one")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="", help="write the figures here too")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="loader-start-"))
    folders = make_files(root / "docs")
    codes: dict[str, Path | None] = {"new": None}
    if args.code:
        codes[args.code] = package_of(args.code, root / "old")
    got: dict[str, dict[str, list[float]]] = {label: {} for label in codes}
    for _ in range(args.rounds):
        for label, code in codes.items():            # old and new in turn, round after round
            for case, folder in folders.items():
                work = root / "work" / label / case
                work.mkdir(parents=True, exist_ok=True)
                for pool, cpu in one(case, folder, code, work).items():
                    got[label].setdefault(f"{case}:{pool}", []).append(cpu)
    med = {label: {k: statistics.median(v) for k, v in rows.items()} for label, rows in got.items()}
    for m in med.values():
        m["ocr:start"] = m["scan:ocr"] - (m["scan3:ocr"] - m["scan:ocr"]) / 2
    names = {"txt:txt": "txt", "pdf:pdf": "pdf", "docx:docx": "docx", "pptx:pptx": "pptx", "scan:pdf": "pdf (a scan)",
             "scan:ocr": "ocr, 1 page", "scan3:ocr": "ocr, 3 pages", "ocr:start": "ocr start"}
    print(f"{'pool':<14}" + "".join(f"{label:>12}" for label in codes) + "   CPU-s of one loader process, median")
    for key, name in names.items():
        print(f"{name:<14}" + "".join(f"{med[label][key]:>12.2f}" for label in codes))
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": got, "median": med}, indent=1))


if __name__ == "__main__":
    main()
