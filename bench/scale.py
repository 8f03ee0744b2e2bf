"""Scale: many tiny files and one big file through `ingest run`, per engine (issue 22's benchmark).

    python bench/scale.py                                  # 1k, 10k, 100k tiny files and a 50 MB text, local and ray
    python bench/scale.py --sizes 1000,10000 --big-mb 0 --engines local
    python bench/scale.py --sizes 10000 --code 1a34fe4     # another commit's code too, in the same run

Tiny files are 1-2 KB of text (one chunk each), 1,000 to a directory. Each run goes into a fresh
Milvus Lite store with `--backend null` by default (no model: the pipeline's own cost), then runs
again unchanged. Printed per engine and size: files/s and chunks/s (wall clock of the CLI, start-up
included), CPU per file (the whole process tree: what the kernel charged to `ingest run` and
every descendant, sampled by process kind), time to first stored row (the report's `first_row_s`:
from the run's start until the store first acknowledged rows), peak RSS of one process per kind
(supervisor, lite, writer, txt, encode, ray, ...), and the unchanged rerun's wall time; the
issue's targets beside them. --code REV measures the code of git revision REV as well (copied
into a temporary package, bench/feed.py's `package_of`), so a before/after ratio comes from one run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from feed import _cpu_name, package_of  # noqa: E402
from proctree import sampled_run  # noqa: E402

WORDS = ("river mountain engine harbour lantern orchard copper glacier violin meadow falcon circuit canyon "
         "archive thunder pepper compass marble ribbon saddle quartz tunnel beacon walnut").split()
PER_DIR = 1000
TARGETS = {"files/s": ">= 500 (100k)", "CPU ms/file": "<= 2.5", "first row s": "<= 5 (10 for the big file)",
           "supervisor MB": "<= 300", "rerun s": "<= 5 at 50k", "ray/local": ">= 0.9"}


def make_tiny(folder: Path, n: int, seed: int = 0) -> None:
    """n text files of 1-2 KB, PER_DIR to a directory."""
    rng = random.Random(seed)
    for i in range(n):
        d = folder / f"d{i // PER_DIR:04d}"
        if i % PER_DIR == 0:
            d.mkdir(parents=True, exist_ok=True)
        words, size, target = [], 0, rng.randint(1024, 2048)
        while size < target:
            w = rng.choice(WORDS)
            words.append(w)
            size += len(w) + 1
        (d / f"f{i:06d}.txt").write_text(" ".join(words) + f" file {i}.")


def make_big(folder: Path, mb: int, seed: int = 1) -> None:
    """One text file of `mb` MB: paragraphs of ~150 words."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    with open(folder / "big.txt", "w") as out:
        written = 0
        while written < mb * 1_000_000:
            para = " ".join(rng.choice(WORDS) for _ in range(150)) + ".\n\n"
            out.write(para)
            written += len(para)


def ingest(label: str, code: Path | None, engine: str, folder: Path, store: Path, backend: str, work: Path) -> dict:
    """One `ingest run` (the store as it is), sampled: the row of the table."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    report_path = work / "report.json"
    report_path.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "ingest.cli", "run", str(folder), "--store", str(store), "--backend", backend,
            "--engine", engine, "--report", str(report_path), "--quiet"]
    run = sampled_run(argv, work, env)
    if run["rc"] not in (0, 1):
        sys.exit(f"{label}: ingest run failed ({run['rc']}): {run['stderr'].strip().splitlines()[-3:]}")
    totals = json.loads(report_path.read_text())["totals"]
    files = totals.get("files", 0)
    return {"label": label, "files": files, "chunks": totals.get("chunks", 0), "wall": run["wall"],
            "cpu_ms_file": run["tree"] * 1e3 / max(files, 1), "first_row_s": totals.get("first_row_s"),
            "peak_mb": {k: v / 1e6 for k, v in sorted(run["peak_rss"].items())}, "failed": run["rc"] == 1}


def measure(label: str, code: Path | None, engine: str, folder: Path, backend: str, work: Path) -> dict:
    store = work / f"{label}.db"
    first = ingest(label, code, engine, folder, store, backend, work)
    rerun = ingest(label, code, engine, folder, store, backend, work)
    for old in work.glob(f"{label}.db*"):           # the stores of 100k files are large
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    return {**first, "rerun_s": rerun["wall"]}


def show(r: dict) -> None:
    first = "-" if r["first_row_s"] is None else f"{r['first_row_s']:.1f}"
    peaks = ", ".join(f"{k} {v:,.0f}" for k, v in r["peak_mb"].items() if v >= 1)
    print(f"{r['label']:<24} {r['files']:>7,} {r['files'] / r['wall']:>8,.0f} {r['chunks'] / r['wall']:>9,.0f} "
          f"{r['cpu_ms_file']:>8.2f} {first:>7} {r['rerun_s']:>8.1f}   {peaks}{'  (files failed)' if r['failed'] else ''}",
          flush=True)


def work_and_codes(args: argparse.Namespace, prefix: str) -> tuple[Path, list[tuple[str, Path | None]]]:
    """The work folder (--work, else a new temporary one) and the code to measure: this tree, and --code's
    revision copied into work/old (first, so both run in the same conditions)."""
    work = Path(args.work or tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    codes: list[tuple[str, Path | None]] = [("this", None)]
    if args.code:
        shutil.rmtree(work / "old", ignore_errors=True)
        codes.insert(0, (args.code[:7], package_of(args.code, work / "old")))
    return work, codes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000", help="numbers of tiny files, comma-separated")
    ap.add_argument("--big-mb", type=int, default=50, help="size of the one big text file (0: none)")
    ap.add_argument("--engines", default="local,ray")
    ap.add_argument("--backend", default="null")
    ap.add_argument("--code", default="", help="also measure the code of this git revision (same run)")
    ap.add_argument("--work", default="", help="folder for the files and stores (default: a temporary one)")
    args = ap.parse_args()
    work, codes = work_and_codes(args, "ingest-scale-")
    print(f"{datetime.date.today()}  machine: {platform.machine()}, {os.cpu_count()} cores, {_cpu_name()}; "
          f"backend {args.backend}")
    print("targets (issue 22, 2 cores): " + "; ".join(f"{k} {v}" for k, v in TARGETS.items()))
    print(f"{'run':<24} {'files':>7} {'files/s':>8} {'chunks/s':>9} {'CPU ms/f':>8} {'1st row':>7} {'rerun s':>8}"
          "   peak RSS MB of one process, by kind")
    results: dict[tuple[str, str, str], dict] = {}
    inputs = [(f"{int(n) // 1000}k" if int(n) % 1000 == 0 else n, int(n)) for n in args.sizes.split(",") if n]
    inputs += [(f"big{args.big_mb}MB", 0)] if args.big_mb else []
    for tag, n in inputs:
        folder = work / f"docs-{tag}"
        if not folder.exists():
            make_tiny(folder, n) if n else make_big(folder, args.big_mb)
        for engine in args.engines.split(","):
            for name, code in codes:
                r = measure(f"{name}-{engine}-{tag}", code, engine, folder, args.backend, work)
                results[(name, engine, tag)] = r
                show(r)
    for (name, engine, tag), r in results.items():
        local = results.get((name, "local", tag))
        if engine != "local" and local:
            print(f"{name} {tag}: {engine}/local files/s {local['wall'] / r['wall']:.2f}x (target >= 0.9)")
        if len(codes) == 2 and name == "this" and (old := results.get((codes[0][0], engine, tag))):
            print(f"{engine} {tag}: this/{codes[0][0]} files/s {old['wall'] / r['wall']:.2f}x, "
                  f"CPU per file {r['cpu_ms_file'] / old['cpu_ms_file']:.2f}x")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
