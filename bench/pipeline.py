"""End-to-end `ingest run` chunks/s against bare `model.encode` on the same chunks.

    python bench/pipeline.py --docs 40

Builds N text documents (about 3 chunks of ~183 tokens each), runs the real CLI on them
with a fresh Milvus Lite store, then encodes the very same chunks with
SentenceTransformer.encode in this process, and prints both rates and their ratio.
The pipeline's time includes everything: process start-up, loading, chunking, encoding,
writing and flushing Milvus. Goal on a 2-core CPU: ratio >= 0.90.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
WORDS = ("river mountain engine harbour lantern orchard copper glacier violin meadow falcon circuit "
         "canyon archive thunder pepper compass marble ribbon saddle quartz tunnel beacon walnut").split()


def make_docs(folder: Path, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    for i in range(n):
        paras = [" ".join(rng.choice(WORDS) for _ in range(150)) + "." for _ in range(3)]
        (folder / f"doc{i:05d}.txt").write_text("\n\n".join(paras))


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=40)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ingest-bench-"))
    (work / "docs").mkdir()
    make_docs(work / "docs", args.docs)

    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db",
                           "--report", "report.json", "--quiet"], cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"ingest run failed: {proc.stderr.strip().splitlines()[-1:]}")
    report = json.loads((work / "report.json").read_text())
    chunks = report["totals"]["chunks"]

    from ingest.chunk import ChunkSpec, split_text
    from ingest.model_ref import resolve_model
    from sentence_transformers import SentenceTransformer

    ref = resolve_model("default")
    spec = ChunkSpec(ref.tokenizer_file, ref.max_seq_length, 200, 30)
    texts = [c for p in sorted((work / "docs").iterdir()) for c in split_text(p.read_text(), spec)]
    assert len(texts) == chunks, (len(texts), chunks)
    model = SentenceTransformer(ref.path, device="cpu")
    model.encode(texts[:8])                                   # warm-up
    t0 = time.perf_counter()
    model.encode(texts, batch_size=64)
    bare = time.perf_counter() - t0

    pipe_rate, bare_rate = chunks / wall, chunks / bare
    print(f"machine: {machine()}")
    print(f"documents: {args.docs}, chunks: {chunks}")
    print(f"ingest run (end to end, incl. start-up): {wall:7.1f} s  {pipe_rate:7.1f} chunks/s")
    print(f"bare model.encode (model already loaded): {bare:7.1f} s  {bare_rate:7.1f} chunks/s")
    print(f"ratio pipeline / bare encode: {pipe_rate / bare_rate:.2f}")
    print(f"stage rates from the report (chunks/s): {report['totals']['chunks_per_s']}")


if __name__ == "__main__":
    main()
