"""How OCR workers run RapidOCR (loaders/ocr.py rapidocr_engine): without its angle classifier (a line it cannot
read is turned half round instead), and where it finds text lines (DET_SIDE): its own detector input (the page
at up to 2,000 pixels) against the page scaled down to a longest side of N pixels for detection only (the lines
are still cut from the page at full resolution for recognition). Word F1 and CPU on filing pages rendered as a scan would be
(200 dpi), each page's text layer the truth.

    python bench/ocr_det_side.py [--sides 960,1280,1600] [--dev ../shared/retrieval-dev/pdfs] [--json FILE]

Two sets of pages, chosen apart: "tuned" is bench/ocr_rec_batch.py's six pages, where the side was chosen;
"held out" is 12 other pages (seed 7: one page of each of 12 other filings, from the middle 80 %), where it is
checked. The development set's three scanned letter pages have no text layer: for them the table gives the
characters read (spaces aside), since the OCR found there has no truth to score against.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from ocr_graph import PAGES, ROOT, cpu, f1  # noqa: E402

SCANS = [p for p in PAGES if p[0].startswith("AMERICANWATERWORKS_2021")]
TUNED = [p for p in PAGES if p not in SCANS]


def held_out(dev: Path) -> list[tuple[str, int]]:
    import pymupdf

    rng = random.Random(7)
    names = sorted(p.name for p in dev.glob("*.pdf") if p.name not in {n for n, _ in PAGES})
    pages = []
    for name in rng.sample(names, min(12, len(names))):
        with pymupdf.open(dev / name) as doc:
            pages.append((name, rng.randrange(doc.page_count // 10, doc.page_count * 9 // 10)))
    return pages


def engines(sides: list[int]) -> dict[str, object]:
    """The old engine (RapidOCR's detector input and its angle classifier, the rewritten models), this code's
    without the classifier at RapidOCR's detector input, and this code's at each side."""
    import dataclasses
    import tempfile

    from rapidocr_onnxruntime import RapidOCR

    from ingest.config import load_config, ocr_options
    from ingest.loaders.ocr import rapidocr_engine
    from ingest.loaders.ocr_graph import fast_models
    options = dataclasses.replace(ocr_options(load_config()), threads=1, model_cache=tempfile.mkdtemp())
    fast = fast_models(options.model_cache)
    out = {"old: classifier, 2000 px": (RapidOCR(intra_op_num_threads=1, rec_batch_num=1, **fast), True),
           "no classifier, 2000 px": (rapidocr_engine(options, 10**6), False)}
    for side in sides:
        out[f"no classifier, {side} px"] = (rapidocr_engine(options, side), False)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", type=Path, default=ROOT.parent / "shared" / "retrieval-dev" / "pdfs")
    ap.add_argument("--sides", default="960,1280,1600")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import pymupdf

    from ingest.workers.limits import keep_heap
    keep_heap()
    kinds = engines([int(s) for s in args.sides.split(",")])
    sets = {"tuned": TUNED, "held out": held_out(args.dev), "scans": SCANS}
    result: dict = defaultdict(lambda: defaultdict(list))
    with pymupdf.open(args.dev / TUNED[0][0]) as doc:
        pix = doc[TUNED[0][1]].get_pixmap(dpi=200)
    warm = np.ascontiguousarray(np.frombuffer(pix.samples, np.uint8).reshape(pix.h, pix.w, pix.n)[:, :, ::-1])
    for engine, cls in kinds.values():
        engine(warm, use_cls=cls)                              # ONNX Runtime's first runs apart
    for set_name, pages in sets.items():
        for name, number in pages:
            with pymupdf.open(args.dev / name) as doc:
                truth = doc[number].get_text()
                pix = doc[number].get_pixmap(dpi=200)
            image = np.ascontiguousarray(np.frombuffer(pix.samples, np.uint8).reshape(pix.h, pix.w, pix.n)[:, :, ::-1])
            cells = []
            for kind, (engine, cls) in kinds.items():
                start = cpu()
                lines, _ = engine(image, use_cls=cls)
                spent = cpu() - start
                text = "\n".join(t for _, t, _ in lines or [])
                score = f1(text, truth) if set_name != "scans" else len("".join(text.split()))
                result[set_name][kind].append((score, spent))
                cells.append(f"{kind}: {score:.3f}" if set_name != "scans" else f"{kind}: {score} chars")
            print(f"{set_name:8} {name} p.{number + 1}: " + " | ".join(cells), flush=True)
    print("\n| pages | " + " | ".join(kinds) + " |")
    print("|---|" + "---:|" * len(kinds))
    for set_name in sets:
        label = "chars read" if set_name == "scans" else "mean word F1"
        agg = (sum if set_name == "scans" else statistics.mean)
        print(f"| {set_name} ({len(sets[set_name])}): {label}, CPU s | " + " | ".join(
            f"{agg(s for s, _ in result[set_name][k]):.3f}, {sum(c for _, c in result[set_name][k]):.1f}"
            for k in kinds) + " |")
    if args.json:
        args.json.write_text(json.dumps({"pages": {k: v for k, v in sets.items()},
                                         "results": {s: dict(v) for s, v in result.items()}}, indent=1))


if __name__ == "__main__":
    main()
