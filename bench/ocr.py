"""OCR throughput against OCR workers, and what a separate OCR pool buys a mixed folder.

    python bench/ocr.py --pages 8 --workers 1 2

Runs the real loader pools (pebble, spawn) with the real loaders and RapidOCR, each OCR
process with the threads `ingest run` gives it (cores / [loaders.ocr] workers):
1. OCR pages/s for each worker count (engines warmed up first, one page per worker).
2. A mixed folder (scanned pages and text PDFs alternating by name, as a real folder would)
   with the same 2 processes arranged two ways: OCR in its own pool beside the PDF-text pool,
   or one shared pool doing both in file order. The figure that matters is when the text PDFs
   are done: behind scans, or not.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(Path(__file__).parent)]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from docs import make_pdf, make_scanned_pdf  # noqa: E402
from ingest.chunk import ChunkSpec  # noqa: E402
from ingest.config import load_config, loader_options, ocr_options  # noqa: E402
from ingest.load import LoadTask, init_loader_process, load_file  # noqa: E402
from ingest.loaders import OcrOptions  # noqa: E402
from ingest.model_ref import resolve_model  # noqa: E402
from ingest.ocr import OcrTask, ocr_page  # noqa: E402
from ingest.workers.failure import Failure  # noqa: E402
from ingest.workers.pool import Pools  # noqa: E402
from pipeline import machine  # noqa: E402

TEXT = "Scanned page {i}: the quick brown fox jumps over the lazy dog near the river bank."


class Runner:
    """Submit tasks to the pools and wait for all of them, noting when each finished."""

    def __init__(self, pools: Pools):
        self.pools, self.done, self.lock = pools, {}, threading.Lock()
        self.all_done = threading.Event()
        self.expected = 0

    def submit(self, pool: str, fn, task, name: str) -> None:
        self.expected += 1

        def finished(future: Future) -> None:
            if isinstance(future.result(), Failure):
                print(f"  {name}: {future.result().error}", file=sys.stderr)
            with self.lock:
                self.done[name] = time.perf_counter()
                if len(self.done) == self.expected:
                    self.all_done.set()
        self.pools.submit(pool, fn, task).add_done_callback(finished)

    def wait(self) -> None:
        self.all_done.wait(timeout=3600)


CFG = load_config()
INITARGS = (tuple(CFG["loaders"]["plugins"]), CFG["limits"]["worker_memory_mb"])     # as `ingest run` does


def ocr_opts(workers: int) -> OcrOptions:
    """What `ingest run` gives each OCR process when `workers` of them may OCR at once."""
    return ocr_options(load_config(overrides={"loaders.ocr.workers": workers}))


def scaling(scan: Path, pages: int, workers: int, spec: ChunkSpec) -> float:
    pools = Pools({"ocr": workers}, {"ocr": 600.0}, init_loader_process, INITARGS)
    opts = ocr_opts(workers)
    warm = Runner(pools)
    for w in range(workers):
        warm.submit("ocr", ocr_page, OcrTask(str(scan), 1, opts, spec), f"warm{w}")
    warm.wait()
    run = Runner(pools)
    start = time.perf_counter()
    for p in range(1, pages + 1):
        run.submit("ocr", ocr_page, OcrTask(str(scan), p, opts, spec), f"p{p}")
    run.wait()
    pools.stop()
    return pages / (time.perf_counter() - start)


def mixed(folder: Path, shared: bool, spec: ChunkSpec) -> tuple[float, float]:
    """Seconds until every text PDF is loaded, and until everything is done."""
    sizes = {"pdf": 2, "ocr": 2} if shared else {"pdf": 1, "ocr": 1}
    pools = Pools(sizes, {"pdf": 600.0, "ocr": 600.0}, init_loader_process, INITARGS)
    ocr, pdf = ocr_opts(2 if shared else 1), loader_options(CFG)   # shared: both processes may OCR at once
    runner = Runner(pools)
    start = time.perf_counter()
    for path in sorted(folder.iterdir()):            # file order: scans and text PDFs alternate
        if path.stem.endswith("-scan"):
            runner.submit("pdf" if shared else "ocr", ocr_page, OcrTask(str(path), 1, ocr, spec), path.name)
        else:
            runner.submit("pdf", load_file, LoadTask(str(path), "pdf", pdf, spec), path.name)
    runner.wait()
    pools.stop()
    text_done = max(t for n, t in runner.done.items() if n.endswith("-text.pdf")) - start
    return text_done, max(runner.done.values()) - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=8)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--mixed", type=int, default=6, help="scanned pages (and as many text PDFs) in the mixed folder")
    args = ap.parse_args()
    ref = resolve_model("default")
    spec = ChunkSpec(ref.tokenizer_file, ref.max_seq_length, 200, 30)
    work = Path(tempfile.mkdtemp(prefix="ingest-ocr-bench-"))
    scan = make_scanned_pdf(work / "scan.pdf", [TEXT.format(i=i) for i in range(args.pages)])
    print(f"machine: {machine()}; RapidOCR at {CFG['loaders']['ocr']['dpi']} dpi")
    print(f"{'OCR workers':>11} {'threads each':>13} {'pages/s':>8} {'speed-up':>9}")
    base = None
    for w in args.workers:
        rate = scaling(scan, args.pages, w, spec)
        base = base or rate
        print(f"{w:>11} {ocr_opts(w).threads:>13} {rate:>8.2f} {rate / base:>8.2f}x")

    folder = work / "mixed"
    folder.mkdir()
    for i in range(args.mixed):
        make_scanned_pdf(folder / f"{2 * i:03d}-scan.pdf", [TEXT.format(i=i)])
        make_pdf(folder / f"{2 * i + 1:03d}-text.pdf", [TEXT.format(i=i), "A second page of plain text."])
    own = mixed(folder, shared=False, spec=spec)
    same = mixed(folder, shared=True, spec=spec)
    print(f"mixed folder: {args.mixed} scanned pages + {args.mixed} text PDFs, 2 loader processes in all")
    print(f"{'arrangement':>30} {'text PDFs done (s)':>19} {'all done (s)':>13}")
    print(f"{'OCR in its own pool (1 + 1)':>30} {own[0]:>19.1f} {own[1]:>13.1f}")
    print(f"{'one shared pool (2)':>30} {same[0]:>19.1f} {same[1]:>13.1f}")
    print(f"text PDFs finish {same[0] / max(own[0], 1e-9):.1f}x sooner with OCR in its own pool")


if __name__ == "__main__":
    main()
