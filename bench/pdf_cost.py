"""What loading a PDF costs (issue 45 item 2): CPU ms per page of the PDF loader processes (ingest-pdf) and
of the whole process tree, user and system apart, old code beside this working tree, in one run.

    python bench/pdf_cost.py                         # HEAD against the working tree, the development PDFs
    python bench/pdf_cost.py --rev e78c4ab --rounds 3 --pdfs DIR --ocr never

Each round runs `ingest run DIR --store null:// --backend null` once with each code, in turn (old first),
sampling every process of the tree by its name (bench/proctree.py's roles: pdf, ocr, supervisor, ...) every
0.1 s for its user and system CPU seconds; the tree's totals are the kernel's (RUSAGE_CHILDREN). The old code
is `git archive REV ingest loaders workers` laid out as installed (bench/feed.py's `package_of`); the new is a
copy of this working tree laid out the same way, so both import alike. `--ocr never` leaves the OCR pool out
(pages without a text layer are then read as they are, by both codes alike): the loaders' own cost alone.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from feed import _cpu_name, package_of  # noqa: E402
from proctree import sampled_run  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PDFS = ROOT.parent / "shared" / "retrieval-dev" / "pdfs"


def sampled(argv: list[str], cwd: Path, env: dict) -> dict:
    """Run `argv` to its end (bench/proctree.py): wall seconds, the tree's (user, system) CPU seconds, and
    (user, system) by role."""
    run = sampled_run(argv, cwd, env)
    if run["rc"] != 0:
        sys.exit(f"ingest run failed ({run['rc']}): {run['stderr'].strip().splitlines()[-3:]}")
    roles = {k: v for k, v in run["split"].items() if k != "tree"}
    return {"wall": run["wall"], "tree": run["split"]["tree"], "roles": roles}


def page_count(folder: Path) -> int:
    import pymupdf

    total = 0
    for p in folder.glob("*.pdf"):
        with pymupdf.open(p) as doc:
            total += doc.page_count
    return total


def row(label: str, r: dict, pages: int) -> dict:
    ms = 1000 / pages
    pdf_u, pdf_s = r["roles"].get("pdf", (0.0, 0.0))
    ocr = sum(r["roles"].get("ocr", (0.0, 0.0)))
    out = {"label": label, "pdf_user": pdf_u * ms, "pdf_sys": pdf_s * ms, "tree_user": r["tree"][0] * ms,
           "tree_sys": r["tree"][1] * ms, "ocr": ocr * ms, "wall": r["wall"]}
    out["pdf"] = out["pdf_user"] + out["pdf_sys"]
    out["tree"] = out["tree_user"] + out["tree_sys"]
    return out


def show(r: dict) -> None:
    print(f"{r['label']:<12} pdf loaders {r['pdf']:6.2f} ms/page (user {r['pdf_user']:5.2f}, sys {r['pdf_sys']:5.2f})"
          f"   tree {r['tree']:6.2f} ms/page (user {r['tree_user']:5.2f}, sys {r['tree_sys']:5.2f}; "
          f"ocr workers {r['ocr']:5.2f})   wall {r['wall']:5.1f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="HEAD", help="the old code: a git revision (or a source tree folder)")
    ap.add_argument("--pdfs", type=Path, default=PDFS)
    ap.add_argument("--files", type=int, default=0, help="only the first N PDFs by name (0: all)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--ocr", choices=("auto", "never"), default="auto", help="[loaders.pdf] ocr of both runs")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pdf-cost-"))
    try:
        docs = args.pdfs
        if args.files:
            docs = work / "docs"
            docs.mkdir()
            for p in sorted(args.pdfs.glob("*.pdf"))[:args.files]:
                shutil.copy2(p, docs / p.name)
        pages = page_count(docs)
        if not pages:
            raise SystemExit(f"no PDFs in {args.pdfs}; pass --pdfs DIR")
        codes = {"old " + args.rev[:10]: package_of(args.rev, work / "old"), "new (tree)": package_of(str(ROOT), work / "new")}
        config = work / "config.toml"
        config.write_text(f'[loaders.pdf]\nocr = "{args.ocr}"\n[cache]\nvectors_mb = 0\n')
        print(f"machine: {os.cpu_count()} cores, {_cpu_name()}, {_simd()}; {pages} pages in "
              f"{len(list(docs.glob('*.pdf')))} PDFs; ocr {args.ocr}; CPU ms per page", flush=True)
        results: dict[str, list[dict]] = {k: [] for k in codes}
        for n in range(args.rounds):
            for label, pkg in codes.items():
                env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(pkg))
                argv = [sys.executable, "-m", "ingest.cli", "run", str(docs), "--store", "null://", "--backend", "null",
                        "--quiet", "--config", str(config), "--report", str(work / "report.json")]
                results[label].append(row(f"{label[:10]} r{n + 1}", sampled(argv, work, env), pages))
                show(results[label][-1])
        (old_label, old), (new_label, new) = results.items()
        med = {k: {f: statistics.median(r[f] for r in rs) for f in ("pdf", "pdf_user", "pdf_sys", "tree", "tree_user",
                                                                   "tree_sys", "ocr")} for k, rs in results.items()}
        print("median ms/page         old      new   new/old")
        for f in ("pdf", "pdf_user", "pdf_sys", "tree", "tree_user", "tree_sys", "ocr"):
            o, w = med[old_label][f], med[new_label][f]
            print(f"  {f:<16} {o:8.2f} {w:8.2f}   {w / o if o else float('nan'):6.3f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def _simd() -> str:
    try:
        flags = next(line for line in open("/proc/cpuinfo") if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return "flags unknown"
    return "avx2 " + ("yes" if "avx2" in flags else "no") + ", avx512f " + ("yes" if "avx512f" in flags else "no")


if __name__ == "__main__":
    sys.exit(main())
