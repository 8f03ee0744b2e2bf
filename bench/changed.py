"""Changed files: a rerun after every file changed, against the first ingest (issues 30 and 40).

    python bench/changed.py                                 # 1k, 5k and 20k one-chunk files, Milvus Lite
    python bench/changed.py --sizes 3000 --stores milvus-lite,postgresql,qdrant-local --code 6793432
    python bench/changed.py --reads 3000 --stores milvus-lite,postgresql,qdrant-local   # reuse reads alone

N one-chunk text files (bench/scale.py's tiny files, 1-2 KB) go into a fresh store (--stores: bench/stores.py's
milvus-lite, postgresql, qdrant-local, lancedb) with `--backend null` (no model: the pipeline's own cost); then every
file is rewritten with other words and the folder ingested again, so each file's old row must go. Printed per
size: the first ingest's and the changed rerun's wall seconds (the CLI, start-up included), the ratio (target
<= 2) and the rerun's milliseconds a file (flat when the rerun grows linearly). Before issue 30 each changed
file cost one filtered delete, evaluated over the whole store: 234 s for 5,000 files against 5.2 s to ingest
them; before issue 40, one read of its previous rows for reuse (153 s for 3,000 files against 10 s), and on
Qdrant's local mode filtered deletes evaluated in Python over every point, one SQLite commit a point (402 s
for 6,000 files against 129 s).
--code REV measures git revision REV's code as well (bench/feed.py's `package_of`), at sizes up to --old-max.

--reads N: the reuse reads alone, with no pipeline (the null backend skips them): a store of N one-row
sources, then the previous rows (source, search_text, element, vector) of all N read one call a source (as
before issue 40) and in calls of --batch sources (`rows(fields, sources=...)`, as reuse now reads them).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from feed import _cpu_name  # noqa: E402
from scale import ingest, make_tiny, work_and_codes  # noqa: E402
from stores import COLLECTION, lancedb, milvus_lite, postgresql, qdrant_local  # noqa: E402

TARGET = 2.0             # the changed rerun costs at most twice the first ingest
STORES = {"milvus-lite": milvus_lite, "postgresql": postgresql, "qdrant-local": qdrant_local, "lancedb": lancedb}
FIELDS = ["source", "search_text", "element", "vector"]


def measure(label: str, code: Path | None, engine: str, n: int, backend: str, work: Path, store: str) -> dict:
    """First ingest of n files, then the rerun after all of them changed, into a fresh store."""
    docs = work / f"docs-{label}"
    shutil.rmtree(docs, ignore_errors=True)
    with STORES[store](work / label) as (uri, _):
        make_tiny(docs, n, seed=0)
        first = ingest(label, code, engine, docs, uri, backend, work)
        make_tiny(docs, n, seed=1)                  # the same names, other words: every file changed
        rerun = ingest(label, code, engine, docs, uri, backend, work)
    shutil.rmtree(docs, ignore_errors=True)
    shutil.rmtree(work / label, ignore_errors=True)
    if first["files"] != n or rerun["files"] != n or first["failed"] or rerun["failed"]:
        sys.exit(f"{label}: expected {n} files ingested both times: {first['files']}, {rerun['files']}")
    return {"label": label, "n": n, "first": first["wall"], "rerun": rerun["wall"]}


def show(r: dict) -> None:
    ratio = r["rerun"] / r["first"]
    print(f"{r['label']:<34} {r['n']:>7,} {r['first']:>9.1f} {r['rerun']:>9.1f} {ratio:>6.2f}x "
          f"{r['rerun'] * 1e3 / r['n']:>8.2f}   {'ok' if ratio <= TARGET else 'over target'}", flush=True)


def reads(store: str, n: int, batch: int, work: Path, one_by_one_max: int) -> None:
    """Seconds to read the previous rows of n changed sources: one call a source, and `batch` a call."""
    from ingest.store.rows import Row, Rows
    from ingest.store.factory import open_store
    from ingest.store.writers import Ack, Batch, Segment, upsert

    with STORES[store](work / f"reads-{store}") as (uri, _):
        s = open_store(uri, COLLECTION)
        s.lock()
        s.ensure_collection("m", 384, "null")
        rng = np.random.default_rng(0)
        sources = [f"docs/d{i // 100:04d}/f{i:06d}.txt" for i in range(n)]
        for i in range(0, n, 512):
            segs = tuple(Segment(src, "txt", "v1", 0, Rows.of([Row(None, f"text of {src}", "", "", "text", "", "")]),
                                 rng.standard_normal((1, 384)).astype(np.float32)) for src in sources[i:i + 512])
            assert isinstance(upsert(s, Batch(segs)), Ack)
        s.flush()
        t = time.perf_counter()
        got = sum(len(s.rows(FIELDS, sources=sources[i:i + batch])) for i in range(0, n, batch))
        batched = time.perf_counter() - t
        assert got == n, got
        m = min(n, one_by_one_max)
        t = time.perf_counter()
        got = sum(len(s.rows(FIELDS, sources=[src])) for src in sources[:m])
        single = (time.perf_counter() - t) * n / m
        assert got == m, got
        s.close()
    shutil.rmtree(work / f"reads-{store}", ignore_errors=True)
    print(f"{store:<14} {n:>7,} {single:>12.1f}{'*' if m < n else ' '} {batched:>12.2f} {single / batched:>8.0f}x",
          flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,5000,20000", help="numbers of files, comma-separated")
    ap.add_argument("--stores", default="milvus-lite", help=f"comma-separated, of {', '.join(STORES)}")
    ap.add_argument("--engines", default="local")
    ap.add_argument("--backend", default="null")
    ap.add_argument("--code", default="", help="also measure the code of this git revision (same run)")
    ap.add_argument("--old-max", type=int, default=5000, help="largest size measured with --code's revision")
    ap.add_argument("--reads", type=int, default=0, help="measure only the reuse reads of this many sources")
    ap.add_argument("--batch", type=int, default=256, help="--reads: sources of one batched call")
    ap.add_argument("--one-by-one-max", type=int, default=1000,
                    help="--reads: sources read one call each (extrapolated to all, marked *)")
    ap.add_argument("--work", default="", help="folder for the files and stores (default: a temporary one)")
    args = ap.parse_args()
    work, codes = work_and_codes(args, "ingest-changed-")
    stores = [s for s in args.stores.split(",") if s]
    print(f"{datetime.date.today()}  machine: {platform.machine()}, {os.cpu_count()} cores, {_cpu_name()}")
    if args.reads:
        print(f"reuse reads of {args.reads:,} changed one-row sources (dim 384): one call a source against "
              f"{args.batch} sources a call")
        print(f"{'store':<14} {'sources':>7} {'one a call s':>13} {'batched s':>12} {'ratio':>9}")
        for store in stores:
            reads(store, args.reads, args.batch, work, args.one_by_one_max)
    else:
        print(f"backend {args.backend}, one-chunk text files; target: rerun <= {TARGET:g}x the first ingest")
        print(f"{'run':<34} {'files':>7} {'first s':>9} {'rerun s':>9} {'ratio':>7} {'ms/file':>8}")
        for n in (int(s) for s in args.sizes.split(",") if s):
            tag = f"{n // 1000}k" if n % 1000 == 0 else str(n)
            for store in stores:
                for engine in args.engines.split(","):
                    for name, code in codes:
                        if code is None or n <= args.old_max:
                            show(measure(f"{name}-{store}-{engine}-{tag}", code, engine, n, args.backend, work,
                                         store))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
