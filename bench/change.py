"""What a change costs (issue 32): `ingest run` after a one-paragraph edit of a big PDF, and over many copies of a
PDF, in CPU seconds of the whole process tree and wall seconds, on the default backend.

    python bench/change.py                         # (a) 300-page PDF, (b) 40 copies of a 20-page PDF
    python bench/change.py --code 3001e04          # the same on another revision's code too, in the same run
    python bench/change.py --pages 60 --copies 8   # smaller, while developing

(a) edit: a PDF of --pages pages is ingested into a fresh store (the first run), then one paragraph of its
    middle page is changed and the run repeated: the rerun's CPU and wall against the first run's
    (goal: <= 25% of the CPU).
(b) copies: one copy of a --copy-pages PDF is ingested into a fresh store, then --copies identical copies
    (copy01.pdf, ...) into another: the copies' CPU and wall against the one copy's (goal: <= 4x). Each copy's
    chunks are embedded under a context line that starts with its own file name, so copies embed different
    texts; the same with [chunking] context_tokens = 0 shows the copies embedded once.
--code REV measures the code of git revision REV (or a source tree) too, beside this working tree
(bench/feed.py's package_of). Each measured run starts from a fresh folder and store; the ONNX export
(default backend "auto") is made before, once. A `--watch` part is not here: bench/watch_latency.py
measures `ingest watch`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from feed import package_of  # noqa: E402
from proctree import sampled_run  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
WORDS = ("river mountain engine harbour lantern orchard copper glacier violin meadow falcon circuit canyon archive "
         "thunder pepper compass marble ribbon saddle quartz tunnel beacon walnut").split()
PARAGRAPHS = 4              # per page, ~70 words each: about two 200-token chunks a page


def make_pdf(path: Path, pages: int, edited: int | None = None, seed: int = 0) -> None:
    """A text PDF of `pages` pages, each a heading and PARAGRAPHS paragraphs; `edited`: that page's second
    paragraph says something else."""
    import pymupdf

    rng = random.Random(seed)
    doc = pymupdf.open()
    for p in range(pages):
        paras = [" ".join(rng.choice(WORDS) for _ in range(70)) + "." for _ in range(PARAGRAPHS)]
        if p == edited:
            paras[1] = "This paragraph was edited: the harbour lantern now burns all night for the late falcon."
        page = doc.new_page()
        page.insert_text((72, 72), f"Chapter {p // 10 + 1}, part {p % 10 + 1}", fontsize=16)
        page.insert_textbox(pymupdf.Rect(72, 96, 540, 770), "\n\n".join(paras), fontsize=10)
    doc.save(path)
    doc.close()


BACKEND: list[str] = []     # --backend X, when given


def measured(code: Path | None, folder: Path, store: Path, work: Path, config: str = "") -> dict:
    """One `ingest run` of `folder` into `store`: wall and CPU of the process tree, chunks, encoded and reused."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    (work / "config.toml").write_text(config)
    argv = [sys.executable, "-m", "ingest.cli", "run", str(folder), "--store", str(store), "--report",
            str(work / "report.json"), "--quiet", "--config", str(work / "config.toml"), *BACKEND]
    run = sampled_run(argv, work, env)
    if run["rc"] != 0:
        sys.exit(f"ingest run failed ({run['rc']}): {run['stderr'].strip().splitlines()[-3:]}")
    t = json.loads((work / "report.json").read_text())["totals"]
    return {"wall": run["wall"], "cpu": run["tree"], "chunks": t["chunks"], "encoded": t.get("encoded_chunks"),
            "reused": t.get("reused_chunks")}


def edit_case(code: Path | None, work: Path, pages: int) -> tuple[dict, dict]:
    """(first run, rerun after a one-paragraph edit) of a `pages`-page PDF."""
    docs = work / "docs"
    docs.mkdir(parents=True)
    make_pdf(docs / "manual.pdf", pages)
    first = measured(code, docs, work / "store.db", work)
    make_pdf(docs / "manual.pdf", pages, edited=pages // 2)
    return first, measured(code, docs, work / "store.db", work)


def copies_case(code: Path | None, work: Path, pages: int, copies: int, config: str = "") -> tuple[dict, dict]:
    """(one copy, `copies` copies) of a `pages`-page PDF, each into a fresh store."""
    one, many = work / "one", work / "many"
    one.mkdir(parents=True)
    many.mkdir()
    make_pdf(one / "copy01.pdf", pages, seed=1)
    for i in range(2, copies + 1):
        shutil.copyfile(one / "copy01.pdf", many / f"copy{i:02d}.pdf")
    shutil.copyfile(one / "copy01.pdf", many / "copy01.pdf")
    return measured(code, one, work / "one.db", work, config), measured(code, many, work / "many.db", work, config)


def line(label: str, base: dict, new: dict) -> str:
    def counts(r: dict) -> str:
        return f"{r['chunks']} chunks" + (f" ({r['encoded']} encoded, {r['reused']} reused)" if r["encoded"] is not None
                                          else "")
    return (f"{label:<34} {base['cpu']:7.1f} -> {new['cpu']:7.1f} CPU-s ({new['cpu'] / base['cpu']:6.1%}), wall "
            f"{base['wall']:6.1f} -> {new['wall']:6.1f} s ({new['wall'] / base['wall']:6.1%}); {counts(base)} -> "
            f"{counts(new)}")


def warm_export() -> None:
    """Make the default backend's choice (the ONNX export and its timing) before anything is measured."""
    from ingest.backends import choose
    from ingest.model_ref import resolve_model

    print(f"default backend here: {choose('auto', resolve_model('default'))}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=300, help="pages of the edited PDF (a)")
    ap.add_argument("--copy-pages", type=int, default=20, help="pages of the copied PDF (b)")
    ap.add_argument("--copies", type=int, default=40)
    ap.add_argument("--backend", default="", help="a backend instead of the default (auto)")
    ap.add_argument("--parts", default="edit,copies,copies-nocontext", help="which to run (comma-separated)")
    ap.add_argument("--code", default="", help="also measure the code of these git revisions or source trees "
                    "(comma-separated; same run, before this working tree)")
    args = ap.parse_args()
    BACKEND.extend(["--backend", args.backend] if args.backend else [])
    root = Path(tempfile.mkdtemp(prefix="ingest-change-"))
    codes: list[tuple[str, Path | None]] = [("this", None)]
    for i, rev in enumerate(args.code.split(",") if args.code else []):
        codes.insert(i, (Path(rev).name if Path(rev).is_dir() else rev[:7], package_of(rev, root / f"old{i}")))
    if not args.backend:
        warm_export()
    print(f"machine: {os.cpu_count()} cores; backend {args.backend or 'default'}; (a) {args.pages}-page PDF, one paragraph edited; (b) {args.copies} "
          f"copies of a {args.copy_pages}-page PDF; CPU of the whole process tree", flush=True)
    try:
        for name, code in codes:
            parts = args.parts.split(",")
            if "edit" in parts:
                first, rerun = edit_case(code, root / f"{name}-edit", args.pages)
                print(line(f"{name}: (a) edit, rerun / first", first, rerun), flush=True)
            if "copies" in parts:
                one, many = copies_case(code, root / f"{name}-copies", args.copy_pages, args.copies)
                print(line(f"{name}: (b) {args.copies} copies / 1", one, many), flush=True)
            if "copies-nocontext" in parts:
                one, many = copies_case(code, root / f"{name}-copies0", args.copy_pages, args.copies,
                                        "[chunking]\ncontext_tokens = 0\n")
                print(line(f"{name}: (b) same, context_tokens = 0", one, many), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
