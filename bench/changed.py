"""Changed files: a rerun after every file changed, against the first ingest (issue 30, item 3).

    python bench/changed.py                                # 1k, 5k and 20k one-chunk files, Milvus Lite
    python bench/changed.py --sizes 1000,5000 --code 1e9e2d2    # the old code too, in the same run

N one-chunk text files (bench/scale.py's tiny files, 1-2 KB) go into a fresh Milvus Lite store with
`--backend null` (no model: the pipeline's own cost); then every file is rewritten with other words and
the folder ingested again, so each file's old row must go. Printed per size: the first ingest's and the
changed rerun's wall seconds (the CLI, start-up included), the ratio (target <= 2) and the rerun's
milliseconds a file (flat when the rerun grows linearly). Before the fix each changed file cost one
filtered delete, evaluated over the whole store: 234 s for 5,000 files against 5.2 s to ingest them.
--code REV measures git revision REV's code as well (bench/feed.py's `package_of`), at sizes up to
--old-max only (its rerun grows with the square of the size).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from feed import _cpu_name  # noqa: E402
from scale import ingest, make_tiny, work_and_codes  # noqa: E402

TARGET = 2.0             # the changed rerun costs at most twice the first ingest


def measure(label: str, code: Path | None, engine: str, n: int, backend: str, work: Path) -> dict:
    """First ingest of n files, then the rerun after all of them changed, into a fresh store."""
    docs, store = work / f"docs-{label}", work / f"{label}.db"
    shutil.rmtree(docs, ignore_errors=True)
    make_tiny(docs, n, seed=0)
    first = ingest(label, code, engine, docs, store, backend, work)
    make_tiny(docs, n, seed=1)                  # the same names, other words: every file changed
    rerun = ingest(label, code, engine, docs, store, backend, work)
    shutil.rmtree(docs, ignore_errors=True)
    for old in work.glob(f"{label}.db*"):
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    if first["files"] != n or rerun["files"] != n or first["failed"] or rerun["failed"]:
        sys.exit(f"{label}: expected {n} files ingested both times: {first['files']}, {rerun['files']}")
    return {"label": label, "n": n, "first": first["wall"], "rerun": rerun["wall"]}


def show(r: dict) -> None:
    ratio = r["rerun"] / r["first"]
    print(f"{r['label']:<22} {r['n']:>7,} {r['first']:>9.1f} {r['rerun']:>9.1f} {ratio:>6.2f}x "
          f"{r['rerun'] * 1e3 / r['n']:>8.2f}   {'ok' if ratio <= TARGET else 'over target'}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,5000,20000", help="numbers of files, comma-separated")
    ap.add_argument("--engines", default="local")
    ap.add_argument("--backend", default="null")
    ap.add_argument("--code", default="", help="also measure the code of this git revision (same run)")
    ap.add_argument("--old-max", type=int, default=5000, help="largest size measured with --code's revision")
    ap.add_argument("--work", default="", help="folder for the files and stores (default: a temporary one)")
    args = ap.parse_args()
    work, codes = work_and_codes(args, "ingest-changed-")
    print(f"{datetime.date.today()}  machine: {platform.machine()}, {os.cpu_count()} cores, {_cpu_name()}; "
          f"backend {args.backend}, Milvus Lite, one-chunk text files; target: rerun <= {TARGET:g}x the first ingest")
    print(f"{'run':<22} {'files':>7} {'first s':>9} {'rerun s':>9} {'ratio':>7} {'ms/file':>8}")
    for n in (int(s) for s in args.sizes.split(",") if s):
        tag = f"{n // 1000}k" if n % 1000 == 0 else str(n)
        for engine in args.engines.split(","):
            for name, code in codes:
                if code is None or n <= args.old_max:
                    show(measure(f"{name}-{engine}-{tag}", code, engine, n, args.backend, work))
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
