"""RapidOCR's bundled models against the same models rewritten (loaders/ocr_graph.py): the text and boxes of
every line, and the CPU, on real filing pages rendered as a scan would be (200 dpi, the OCR default) and on the
development set's scanned letter pages.

    python bench/ocr_graph.py [--dev ../shared/retrieval-dev/pdfs] [--json FILE]

Per page: the lines found by each, how many are equal (text and box), word F1 against the page's text layer
(words lowercased, as multisets; the scanned pages have none) and the CPU of one OCR call (warm engines,
one thread, this process's user + system time). Then each model alone on a 2,240-pixel-wide text line
(a full line of a letter at 200 dpi), and the rewrite's own cost (once per machine).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from ocr_rec_batch import PAGES as FILING_PAGES, ROOT, cpu, f1  # noqa: E402

PAGES = FILING_PAGES + [("AMERICANWATERWORKS_2021_10K.pdf", 150), ("AMERICANWATERWORKS_2021_10K.pdf", 152),
                        ("AMERICANWATERWORKS_2021_10K.pdf", 154)]          # 0-based; the last three are scans


def models_alone(fast: dict[str, str]) -> dict[str, float]:
    """ms of one inference, bundled and rewritten, on a recognizer's long line and a detector's page strip."""
    import onnxruntime as ort
    import rapidocr_onnxruntime

    bundled = Path(rapidocr_onnxruntime.__file__).parent / "models"
    opts = ort.SessionOptions()
    opts.intra_op_num_threads, opts.log_severity_level = 1, 4
    out = {}
    for kind, shape in (("rec", (1, 3, 48, 2240)), ("det", (1, 3, 736, 1696))):
        x = np.random.default_rng(0).uniform(-1, 1, shape).astype(np.float32)
        for label, path in (("bundled", str(next(bundled.glob(f"*_{kind}_infer.onnx")))),
                            ("rewritten", fast[f"{kind}_model_path"])):
            session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            feed = {session.get_inputs()[0].name: x}
            session.run(None, feed)
            start = cpu()
            for _ in range(3):
                session.run(None, feed)
            out[f"{kind} {label} ms"] = round(1000 * (cpu() - start) / 3, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dev", type=Path, default=ROOT.parent / "shared" / "retrieval-dev" / "pdfs")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import pymupdf
    from rapidocr_onnxruntime import RapidOCR

    from ingest.loaders.ocr_graph import fast_models
    from ingest.workers.limits import keep_heap
    keep_heap()                                   # as an OCR worker runs
    with tempfile.TemporaryDirectory() as cache:
        start = cpu()
        fast = fast_models(cache)
        rewrite_s = cpu() - start
        engines = {"bundled": RapidOCR(intra_op_num_threads=1, rec_batch_num=1),
                   "rewritten": RapidOCR(intra_op_num_threads=1, rec_batch_num=1, **fast)}
        total, rows = Counter(), []
        print("| page | lines | equal lines | word F1 | bundled CPU s | rewritten CPU s |")
        print("|---|---:|---:|---:|---:|---:|")
        for name, number in PAGES:
            with pymupdf.open(args.dev / name) as doc:
                truth = doc[number].get_text()
                pix = doc[number].get_pixmap(dpi=200)
            image = np.ascontiguousarray(np.frombuffer(pix.samples, np.uint8).reshape(pix.h, pix.w, pix.n)[:, :, ::-1])
            found, secs = {}, {}
            for label, engine in engines.items():
                engine(image)                     # warm for this page's shapes
                start = cpu()
                result, _ = engine(image)
                secs[label] = cpu() - start
                total[label] += secs[label]
                found[label] = [(np.asarray(box).round(2).tolist(), text) for box, text, _ in result or []]
            old, new = found["bundled"], found["rewritten"]
            equal = sum(a == b for a, b in zip(old, new)) if len(old) == len(new) else 0
            score = f"{f1(chr(10).join(t for _, t in old), truth):.3f}" if truth.strip() else "(scan)"
            rows.append(dict(page=f"{name} p.{number + 1}", lines=len(old), equal=equal, f1=score, **secs))
            print(f"| {name} p.{number + 1} | {len(old)} | {equal} | {score} | {secs['bundled']:.1f} | "
                  f"{secs['rewritten']:.1f} |")
        alone = models_alone(fast)
    print(f"| all | {sum(r['lines'] for r in rows)} | {sum(r['equal'] for r in rows)} | | "
          f"{total['bundled']:.1f} | {total['rewritten']:.1f} ({total['rewritten'] / total['bundled']:.2f}x) |")
    print("one inference, one thread:", alone, f"; the rewrite and its check, once: {rewrite_s:.2f} CPU-s")
    if args.json:
        args.json.write_text(json.dumps(dict(pages=rows, total=dict(total), alone=alone, rewrite_s=rewrite_s), indent=1))


if __name__ == "__main__":
    main()
