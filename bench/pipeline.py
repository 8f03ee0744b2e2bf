"""`ingest run` chunks/s in steady state against bare `model.encode` on the same chunks.

    python bench/pipeline.py --docs 1500 --small 100

Builds text documents (about 3 chunks of ~183 tokens each) and runs the real CLI twice, on
--small and on --docs of them, each into a fresh Milvus Lite store: the difference is the
steady state (start-up, the model's load and the last flush drop out). Then encodes the very
same chunks with SentenceTransformer.encode in this process at each --bare-batch-sizes and
takes the best. With --repeat N, N rounds follow (pipeline pair, then bare encode at that best
batch size), so each ratio compares runs minutes apart, not a whole bench apart: this box's
speed drifts by several percent between minutes. Prints the rates, each round's ratio and their
median, and the end-to-end rate of the big run. Goal on a 2-core CPU: steady state >= 0.95 x bare encode.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
WORDS = ("river mountain engine harbour lantern orchard copper glacier violin meadow falcon circuit "
         "canyon archive thunder pepper compass marble ribbon saddle quartz tunnel beacon walnut").split()


def make_docs(folder: Path, n: int, seed: int = 0) -> None:
    folder.mkdir(parents=True)
    rng = random.Random(seed)
    for i in range(n):
        paras = [" ".join(rng.choice(WORDS) for _ in range(150)) + "." for _ in range(3)]
        (folder / f"doc{i:05d}.txt").write_text("\n\n".join(paras))


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def ingest_run(folder: Path, work: Path, backend: str) -> tuple[float, dict]:
    for old in work.glob(f"{folder.name}.db*"):              # a fresh store and manifest: a rerun skips every file
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ingest.cli", "run", str(folder), "--store", str(work / f"{folder.name}.db"),
                           "--report", str(work / "report.json"), "--backend", backend, "--quiet"],
                          cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"ingest run failed: {proc.stderr.strip().splitlines()[-1:]}")
    return wall, json.loads((work / "report.json").read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--small", type=int, default=40, help="documents of the start-up run (subtracted)")
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--bare-batch-sizes", default="16,32,64")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of pipeline pair + bare encode")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    make_docs(work / "docs", args.docs)
    make_docs(work / "small", args.small)

    def steady_state() -> tuple[float, float, dict]:
        small_wall, small = ingest_run(work / "small", work, args.backend)
        wall, report = ingest_run(work / "docs", work, args.backend)
        return (report["totals"]["chunks"] - small["totals"]["chunks"]) / (wall - small_wall), wall, report

    from sentence_transformers import SentenceTransformer

    from ingest.chunk import ChunkSpec, page_chunks
    from ingest.model_ref import resolve_model

    ref = resolve_model("default")
    spec = ChunkSpec(ref.tokenizer_file, ref.max_seq_length, 200, 30)
    texts = [c for p in sorted((work / "docs").iterdir()) for c in page_chunks(None, p.read_text(), spec).chunks]
    model = SentenceTransformer(ref.path, device="cpu")
    model.encode(texts[:64])                                  # warm-up

    def bare(batch: int) -> float:
        t0 = time.perf_counter()
        model.encode(texts, batch_size=batch)
        return len(texts) / (time.perf_counter() - t0)

    steady, wall, report = steady_state()
    chunks = report["totals"]["chunks"]
    assert len(texts) == chunks, (len(texts), chunks)
    rates = {b: bare(b) for b in (int(x) for x in args.bare_batch_sizes.split(","))}
    best = max(rates, key=rates.get)
    rounds = [(steady, rates[best])]
    for _ in range(args.repeat - 1):
        rounds.append((steady_state()[0], bare(best)))

    print(f"machine: {machine()}; backend {args.backend}")
    print(f"documents: {args.docs} ({chunks} chunks); start-up run: {args.small} documents, subtracted")
    print(f"ingest run, steady state: {steady:7.1f} chunks/s   (end to end incl. start-up: {chunks / wall:.1f})")
    print("bare model.encode: " + ", ".join(f"batch {b} {r:.1f}" for b, r in rates.items()) + " chunks/s")
    for i, (pipe, ref_rate) in enumerate(rounds, 1):
        print(f"round {i}: steady state {pipe:6.1f}, bare encode (batch {best}) {ref_rate:6.1f}: ratio {pipe / ref_rate:.3f}")
    print(f"ratio steady state / best bare encode, median of {len(rounds)} round(s): "
          f"{statistics.median(p / r for p, r in rounds):.3f}")
    print(f"stage rates from the report (chunks/s of busy time): {report['totals']['chunks_per_s']}")


if __name__ == "__main__":
    main()
