"""Peak RSS of the whole `ingest run` process tree as the folder grows.

    python bench/memory.py --sizes 2000 20000

For each size, builds that many small text documents, runs the real CLI on a fresh store,
and samples the summed RSS of the supervisor and all its workers every 0.2 s. Memory should
stay flat: bounded queues, a bounded reorder window and batched writes, whatever the size.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from pipeline import WORDS, machine  # noqa: E402


def tree_rss(proc: psutil.Process) -> int:
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def measure(n: int) -> tuple[float, float, int]:
    work = Path(tempfile.mkdtemp(prefix=f"ingest-mem{n}-"))
    docs = work / "docs"
    for i in range(n):
        sub = docs / f"d{i // 1000:03d}"
        sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:06d}.txt").write_text(f"Note {i}: {WORDS[i % len(WORDS)]} {WORDS[(i * 7) % len(WORDS)]} log.")
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db",
                             "--report", "report.json", "--quiet"], cwd=work,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    ps, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(ps))
        time.sleep(0.2)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"ingest run failed with exit code {proc.returncode}")
    chunks = json.loads((work / "report.json").read_text())["totals"]["chunks"]
    return peak / 2**20, wall, chunks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[2000, 20000])
    sizes = ap.parse_args().sizes
    print(f"machine: {machine()}")
    print(f"{'documents':>10} {'chunks':>8} {'seconds':>8} {'peak RSS of tree (MiB)':>24}")
    peaks = []
    for n in sizes:
        peak, wall, chunks = measure(n)
        peaks.append(peak)
        print(f"{n:>10} {chunks:>8} {wall:>8.1f} {peak:>24.0f}")
    print(f"peak RSS ratio {sizes[-1]} / {sizes[0]} documents: {peaks[-1] / peaks[0]:.2f}")


if __name__ == "__main__":
    main()
