"""What the document cards cost (issue 41): make_card's CPU per file, and ingest CPU per page, old code against
this code, in one run.

    python bench/card_cost.py [--card-old e78c4ab] [--texts 500] [--pdfs DIR] [--rounds 5]
    python bench/card_cost.py --old /tmp/old-checkout [--pdfs DIR] [--files 4] [--rounds 2]

make_card: ingest/doc_card.py of git revision --card-old (or a file of that name; e78c4ab is the last before its
speed-up) is loaded as a module beside this checkout's, and both make the cards of --texts text files written as
bench/feed.py's make_docs writes them (16 paragraphs of random words, ~15 KB; the card reads the first 6,000
characters) and of the first pages of every PDF in --pdfs, as ingest.doc_card.file_doc calls it; each round times
each code on all of them (time.process_time), alternating; prints the median ms per card and the ratio.

With --old, then: each round runs `ingest run` of the same files with the null backend (no encoding: loading,
chunking and writing, where the card is made) into a fresh Milvus Lite store, once with each code, alternating, and
takes the CPU seconds of the run's processes, children included (resource.RUSAGE_CHILDREN). OLD is a
checkout whose `ingest/` holds links `loaders` -> ../loaders and `workers` -> ../workers, so that
PYTHONPATH=OLD imports it whole. Prints CPU ms per page of each run and the ratio new / old of the medians.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def card_module(rev: str):
    """ingest/doc_card.py of git revision `rev` (or the file `rev`), imported as a module of its own."""
    path = Path(rev)
    if not path.is_file():
        path = Path(tempfile.mkdtemp(prefix="card-old-")) / "doc_card_old.py"
        path.write_text(subprocess.run(["git", "show", f"{rev}:ingest/doc_card.py"], cwd=ROOT, check=True,
                                       capture_output=True, text=True).stdout)
    spec = importlib.util.spec_from_file_location("doc_card_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def card_inputs(n_texts: int, pdfs: Path) -> dict[str, list[tuple]]:
    """make_card's arguments for each text file and each PDF, as file_doc passes them."""
    from itertools import islice
    from pathlib import PurePosixPath

    from ingest.config import DEFAULTS, loader_options
    from ingest.doc_card import FIRST_PAGES
    from ingest.loaders import loader_for
    from ingest.sections import document_title
    sys.path.insert(0, str(ROOT / "bench"))
    from feed import make_docs
    sets: dict[str, list[tuple]] = {"texts": [], "pdfs": []}
    opts = loader_options(DEFAULTS)
    with tempfile.TemporaryDirectory() as tmp:
        make_docs(Path(tmp) / "docs", n_texts)
        files = [(p, "txt") for p in sorted((Path(tmp) / "docs").glob("*.txt"))] + \
            [(p, "pdf") for p in sorted(pdfs.glob("*.pdf"))]
        for path, fmt in files:
            first = list(islice(loader_for(fmt)(path, opts), FIRST_PAGES))
            title = document_title(first[0], path.name)
            sets["texts" if fmt == "txt" else "pdfs"].append((
                [p.text for p in first], "" if title == PurePosixPath(path.name).name else title, dict(first[0].meta),
                fmt, [t for p in first for t in p.running]))
    return sets


def card_cost(rev: str, n_texts: int, pdfs: Path, rounds: int) -> None:
    import ingest.doc_card as new
    old = card_module(rev)
    for name, inputs in card_inputs(n_texts, pdfs).items():
        if not inputs:
            print(f"make_card, {name}: none (no PDFs in {pdfs}?)")
            continue
        seen = lambda c: (c.title, c.orgs, c.short, c.kind, c.year, c.quarter, c.date, c.label())  # noqa: E731
        same = sum(seen(old.make_card(*a)) == seen(new.make_card(*a)) for a in inputs)
        per: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(rounds):
            for code, module in (("old", old), ("new", new)):
                cpu0 = time.process_time()
                for a in inputs:
                    module.make_card(*a)
                per[code].append((time.process_time() - cpu0) / len(inputs) * 1000)
        o, n = statistics.median(per["old"]), statistics.median(per["new"])
        print(f"make_card, {len(inputs)} {name}: old {o:.3f} ms/card, new {n:.3f} ms/card, old/new {o / n:.1f}x "
              f"(same card: {same}/{len(inputs)})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--card-old", default="e78c4ab", help="git revision (or file) of the old ingest/doc_card.py")
    ap.add_argument("--texts", type=int, default=500, help="text files (bench/feed.py's make_docs) for make_card")
    ap.add_argument("--old", type=Path, help="an old checkout: also measure `ingest run` CPU per page")
    ap.add_argument("--pdfs", type=Path, default=ROOT.parent / "shared" / "retrieval-dev" / "pdfs")
    ap.add_argument("--files", type=int, default=4, help="the first N PDFs (by name), for --old")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (5 for make_card, 2 for --old)")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    card_cost(args.card_old, args.texts, args.pdfs, args.rounds or 5)
    if args.old is None:
        return 0
    args.rounds = args.rounds or 2
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
