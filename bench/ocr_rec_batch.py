"""RapidOCR's text-line batch (loaders/ocr.py REC_BATCH): CPU and accuracy of batches of 6 (RapidOCR's default)
against 1, on real filing pages rendered as a scan would be (200 dpi, the OCR default), each page's text layer
the truth.

    python bench/ocr_rec_batch.py [--dev ../shared/retrieval-dev/pdfs] [--batches 6,1]

Per page: the lines found, word F1 against the text layer (words lowercased, as multisets: reading order
aside), and the CPU of one OCR call (warm engines, one thread, this process's user + system time).
"""
from __future__ import annotations

import argparse
import resource
import sys
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PAGES = [("AMERICANEXPRESS_2022_10K.pdf", 100), ("LOCKHEEDMARTIN_2021_10K.pdf", 80), ("AMD_2015_10K.pdf", 40),
         ("COCACOLA_2017_10K.pdf", 70), ("VERIZON_2022_10K.pdf", 55), ("JPMORGAN_2022Q2_10Q.pdf", 10)]


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def f1(found: str, truth: str) -> float:
    a, t = Counter(found.lower().split()), Counter(truth.lower().split())
    return 2 * sum((a & t).values()) / max(1, sum(a.values()) + sum(t.values()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", type=Path, default=ROOT.parent / "shared" / "retrieval-dev" / "pdfs")
    ap.add_argument("--batches", default="6,1")
    args = ap.parse_args()
    import pymupdf
    from rapidocr_onnxruntime import RapidOCR

    from ingest.workers.limits import keep_heap
    keep_heap()                                   # as an OCR worker runs
    batches = [int(b) for b in args.batches.split(",")]
    engines = {b: RapidOCR(intra_op_num_threads=1, rec_batch_num=b) for b in batches}
    total = dict.fromkeys(batches, 0.0)
    print("| page | lines | " + " | ".join(f"batch {b}: word F1, CPU s" for b in batches) + " |")
    print("|---|---|" + "---|" * len(batches))
    for name, number in PAGES:
        with pymupdf.open(args.dev / name) as doc:
            truth = doc[number].get_text()
            pix = doc[number].get_pixmap(dpi=200)
        image = np.ascontiguousarray(np.frombuffer(pix.samples, np.uint8).reshape(pix.h, pix.w, pix.n)[:, :, ::-1])
        cells, lines = [], 0
        for b, engine in engines.items():
            engine(image)                         # warm for this page's shapes
            start = cpu()
            result, _ = engine(image)
            spent = cpu() - start
            total[b] += spent
            lines = len(result or [])
            cells.append(f"{f1(' '.join(r[1] for r in result or []), truth):.3f}, {spent:.1f}")
        print(f"| {name} p.{number + 1} | {lines} | " + " | ".join(cells) + " |")
    print("| all | | " + " | ".join(f"{total[b]:.1f} s" for b in batches) + " |")


if __name__ == "__main__":
    main()
