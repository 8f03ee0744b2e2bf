"""What the document cards cost (issue 41): ingest CPU per page, old code against this code, in one run.

    python bench/card_cost.py --old /tmp/old-checkout [--pdfs DIR] [--files 4] [--rounds 2]

Each round runs `ingest run` of the same files with the null backend (no encoding: loading, chunking and
writing, where the card is made) into a fresh Milvus Lite store, once with each code, alternating, and
takes the CPU seconds of the run's processes, children included (resource.RUSAGE_CHILDREN). OLD is a
checkout whose `ingest/` holds links `loaders` -> ../loaders and `workers` -> ../workers, so that
PYTHONPATH=OLD imports it whole. Prints CPU ms per page of each run and the ratio new / old of the medians.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True)
    ap.add_argument("--pdfs", type=Path, default=ROOT.parent / "shared" / "retrieval-dev" / "pdfs")
    ap.add_argument("--files", type=int, default=4, help="the first N PDFs (by name)")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    import pymupdf

    work = Path(tempfile.mkdtemp(prefix="card-cost-"))
    docs = work / "docs"
    docs.mkdir()
    for p in sorted(args.pdfs.glob("*.pdf"))[:args.files]:
        shutil.copy2(p, docs / p.name)
    pages = sum(pymupdf.open(p).page_count for p in docs.glob("*.pdf"))
    if not pages:
        raise SystemExit(f"no PDFs in {args.pdfs}; pass --pdfs DIR")
    cfg = work / "config.toml"
    cfg.write_text("[cache]\nvectors_mb = 0\n")
    per: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for name, path in (("old", str(args.old)), ("new", str(ROOT))):
            env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=path)
            store = work / f"{name}{r}.db"
            cpu0 = children_cpu()
            proc = subprocess.run([sys.executable, "-m", "ingest.cli", "run", str(docs), "--store", str(store),
                                   "--backend", "null", "--config", str(cfg), "--quiet"], env=env, cwd=work,
                                  capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"{name} run failed: {proc.stderr.strip()[-400:]}")
            ms = (children_cpu() - cpu0) / pages * 1000
            per[name].append(ms)
            print(f"round {r + 1} {name}: {ms:.1f} ms CPU/page ({pages} pages)", flush=True)
    old, new = statistics.median(per["old"]), statistics.median(per["new"])
    print(f"median: old {old:.1f} ms/page, new {new:.1f} ms/page, new/old {new / old:.3f}")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
