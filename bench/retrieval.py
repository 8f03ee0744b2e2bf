"""Retrieval quality on a question set, per feature of issue 21, alone and together.

    python bench/retrieval.py                            # ../shared/retrieval-dev, every variant
    python bench/retrieval.py --dev DIR --variants all,none --work /tmp/retrieval
    python bench/retrieval.py --variants all,nocard --hide-names     # the files renamed scan_<8 digits>.pdf

Each variant ingests DIR/pdfs/ into a fresh Milvus Lite file with the default model and settings but
for what it turns off, then runs `ingest eval DIR/questions.jsonl --json` in each search mode:
- structure: the structured loaders (headings, tables, no running headers) or the plain PDF text layer
  (bench/plain_pdf.py, the loader before issue 21);
- context: [chunking] context_tokens = 48 or 0;
- card: [chunking] card_context (issue 41: the document card's label in the context line); `nocard` is the
  defaults without it;
- modes: dense, bm25, hybrid (search only: no re-ingest); dense-plain is dense without the document-aware
  ranking (`--no-doc-rank`, issue 33), so the two rows show what that ranking adds; dense-noterm is dense
  without the term ranking (`--no-term-rank`, issue 41: the question's rare words in a hit's text and headings);
- before: with --before PYTHON (a venv whose `ingest` is the code before issue 21), that code's own
  ingest, searched (dense) by this code's `ingest eval`: an old store stays searchable.
--hide-names ingests a copy of DIR/pdfs/ whose files have meaningless names (ingest.evaluate.hide_names) and
evaluates with `ingest eval --hide-names`: nothing can find a document by its name. The variants share one
vector cache in --work, so a variant whose context lines another already embedded encodes nothing.
It prints doc-hit@5, page-hit@5, doc-hit@10, page-hit@10, MRR@10 per variant and mode, and the ingest's
CPU seconds per page (the run's processes, children included), measured in the same run.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {                     # name: (structured loaders, context_tokens, card_context)
    "none": (False, 0, False),
    "context": (False, 48, False),
    "structure": (True, 0, False),
    "nocard": (True, 48, False),
    "all": (True, 48, True),
}
METRICS = ("doc-hit@5", "page-hit@5", "doc-hit@10", "page-hit@10", "MRR@10")


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dev", type=Path, default=ROOT.parent / "shared" / "retrieval-dev")
    ap.add_argument("--work", type=Path, default=Path("/tmp/ingest-retrieval"))
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--modes", default="dense,dense-noterm,dense-plain,bm25,hybrid")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--before", help="python of a venv with the code before issue 21: adds the variant 'before'")
    ap.add_argument("--hide-names", action="store_true", help="ingest and ask with meaningless file names")
    args = ap.parse_args()
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT / "bench"))
    ingest = [sys.executable, "-m", "ingest.cli"]
    pdfs, questions = args.dev / "pdfs", args.dev / "questions.jsonl"
    pages = _pages(pdfs)
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)           # the runs' cwd: never a checkout (python -m imports it)
    hide = ["--hide-names"] if args.hide_names else []
    if args.hide_names:
        from ingest.evaluate import hide_names

        hide_names(pdfs, args.work / "hidden")
        pdfs = args.work / "hidden"
    cache = f'[cache]\npath = "{args.work / "vectors.sqlite"}"\n'
    rows = []
    for name in (["before"] if args.before else []) + args.variants.split(","):
        cfg = args.work / f"{name}.toml"
        if name == "before":
            cfg.write_text("")
        else:
            structured, context, card = VARIANTS[name]
            cfg.write_text(f"[chunking]\ncontext_tokens = {context}\ncard_context = {str(card).lower()}\n" + cache
                           + ("" if structured else '[loaders]\nplugins = ["plain_pdf"]\n'))
        tag = f"{name}-hidden" if args.hide_names else name
        store, report = args.work / f"{tag}.db", args.work / f"{tag}.report.json"
        cpu0, wall0 = children_cpu(), time.perf_counter()
        python = [args.before, "-m", "ingest.cli"] if name == "before" else ingest
        proc = subprocess.run([*python, "run", str(pdfs), "--store", str(store), "--config", str(cfg), "--reembed",
                               "--backend", args.backend, "--quiet", "--report", str(report)],
                              env=env, capture_output=True, text=True, cwd=args.work)
        cpu, wall = children_cpu() - cpu0, time.perf_counter() - wall0
        if proc.returncode:
            raise SystemExit(f"ingest run ({name}) failed: {proc.stderr.strip()[-500:]}")
        totals = json.loads(report.read_text())["totals"]
        for mode in ["dense"] if name == "before" else args.modes.split(","):
            how = {"dense-plain": ["--mode", "dense", "--no-doc-rank"],
                   "dense-noterm": ["--mode", "dense", "--no-term-rank"]}.get(mode, ["--mode", mode])
            out = subprocess.run([*ingest, "eval", str(questions), "--store", str(store), *how, *hide, "--json"],
                                 env=env, capture_output=True, text=True, cwd=args.work)
            if out.returncode:
                raise SystemExit(f"ingest eval ({name}, {mode}) failed: {out.stderr.strip()[-500:]}")
            metrics = json.loads(out.stdout)["metrics"]
            rows.append((name, mode, metrics, totals["chunks"], cpu / pages * 1000, wall))
            print(f"{name:<10} {mode:<7} " + " ".join(f"{k} {metrics[k]:.2f}" for k in METRICS)
                  + f" | {totals['chunks']} chunks, ingest CPU {cpu / pages * 1000:.0f} ms/page, wall {wall:.0f} s",
                  flush=True)
    print("\n| variant | mode | " + " | ".join(METRICS) + " | chunks | ingest CPU ms/page |")
    print("|---|---|" + "---|" * (len(METRICS) + 2))
    for name, mode, m, chunks, ms, _ in rows:
        print(f"| {name} | {mode} | " + " | ".join(f"{m[k]:.2f}" for k in METRICS) + f" | {chunks} | {ms:.0f} |")
    return 0


def _pages(pdfs: Path) -> int:
    import pymupdf

    return sum(pymupdf.open(p).page_count for p in pdfs.glob("*.pdf"))


if __name__ == "__main__":
    sys.exit(main())
