"""`ingest watch`: how soon a new file is recorded, idle CPU, and memory over many syncs (issue 32, items 4 and 5).

    python bench/watch_latency.py                       # this code and 3001e04's, 20 files, then 1,000 syncs
    python bench/watch_latency.py --code '' --syncs 200 # this code only, fewer syncs

Latency: `ingest watch docs --debounce 0.5` (the default backend unless --backend) on a folder of a few small
files; once its first sync is reported and SETTLE_S have passed (the model loaded), --files small files are
added one by one, each once the previous one is recorded: from the end of a file's write to its manifest
entry (polled every 10 ms, read-only), median and p95. --code REV measures that revision's code too, in the
same run (bench/feed.py's package_of), before this code's.
Idle: the watch tree's CPU seconds over IDLE_S with nothing changing. Memory: this code only, a second watch
(--debounce 0.1) whose one file is rewritten --syncs times, each once the previous version is recorded (the
manifest stays one file); the RSS of the watch's whole process tree every --every syncs.
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).parent))
from feed import package_of  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SETTLE_S = 20.0          # after the first sync: the encode workers load the model (this code starts them then)
IDLE_S = 10.0
TEXT = "Penguins huddle together through the long polar night, taking turns at the windy edge. "


def start(work: Path, code: Path | None, debounce: float, backend: str | None) -> subprocess.Popen:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    argv = [sys.executable, "-m", "ingest.cli", "watch", "docs", "--store", "store.db", "--quiet",
            "--debounce", str(debounce), *(["--backend", backend] if backend else [])]
    err = open(work / "watch.err", "w")
    return subprocess.Popen(argv, cwd=work, env=env, stdout=err, stderr=err, start_new_session=True)


def recorded(work: Path, source: str) -> int | None:
    """The manifest's mtime_ns of `source`, or None."""
    db = work / "store.db.documents.manifest.sqlite"
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1)
        try:
            row = con.execute("SELECT mtime_ns FROM files WHERE source=?", (source,)).fetchone()
        finally:
            con.close()
        return row[0] if row else None
    except sqlite3.Error:
        return None


def wait_for(work: Path, proc: subprocess.Popen, source: str, mtime_ns: int | None, timeout: float = 120) -> float:
    """Poll until the manifest records `source` (with `mtime_ns`, if given); the time then."""
    deadline = time.monotonic() + timeout
    while True:
        got = recorded(work, source)
        if got is not None and (mtime_ns is None or got == mtime_ns):
            return time.monotonic()
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit(f"watch ended or stalled ({proc.poll()}) before {source}: {(work / 'watch.err').read_text()[-2000:]}")
        time.sleep(0.01)


def tree(proc: subprocess.Popen) -> list[psutil.Process]:
    p = psutil.Process(proc.pid)
    return [p, *p.children(recursive=True)]


def tree_rss_mb(proc: subprocess.Popen) -> dict[str, float]:
    """RSS in MB of the watch's processes by name (ingest-<role>; "python": watch itself and the resource tracker)."""
    out: dict[str, float] = {}
    for p in tree(proc):
        try:
            out[p.name()] = out.get(p.name(), 0.0) + p.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            pass
    return out


def tree_cpu(proc: subprocess.Popen) -> float:
    total = 0.0
    for p in tree(proc):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def stop(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, 15)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


def latency(label: str, code: Path | None, base: Path, files: int, backend: str | None) -> dict:
    work = base / label
    (work / "docs").mkdir(parents=True)
    for i in range(3):
        (work / "docs" / f"seed{i}.txt").write_text(TEXT * 5 + f"Seed {i}.")
    proc = start(work, code, 0.5, backend)
    try:
        wait_for(work, proc, "seed2.txt", None, timeout=300)
        time.sleep(SETTLE_S)
        cpu0, idle0 = tree_cpu(proc), time.monotonic()
        time.sleep(IDLE_S)
        idle_cpu = (tree_cpu(proc) - cpu0) / (time.monotonic() - idle0)
        took = []
        for i in range(files):
            path = work / "docs" / f"new{i:02d}.txt"
            path.write_text(TEXT * 3 + f"File {i}.")
            written = time.monotonic()
            took.append(wait_for(work, proc, path.name, None) - written)
            time.sleep(0.7)           # its sync's report, then the next file on its own
    finally:
        stop(proc)
    took.sort()
    return {"label": label, "median": statistics.median(took), "p95": took[int(round(0.95 * (len(took) - 1)))],
            "max": took[-1], "idle_cpu": idle_cpu, "all": [round(t, 2) for t in took]}


def memory(base: Path, syncs: int, every: int, backend: str | None) -> list[tuple[int, dict[str, float]]]:
    work = base / "memory"
    (work / "docs").mkdir(parents=True)
    churn = work / "docs" / "churn.txt"
    churn.write_text(TEXT)
    proc = start(work, None, 0.1, backend)
    samples = []
    try:
        wait_for(work, proc, churn.name, None, timeout=300)
        for i in range(1, syncs + 1):
            churn.write_text(TEXT * (1 + i % 3) + f"Version {i}.")
            wait_for(work, proc, churn.name, churn.stat().st_mtime_ns)
            if i % every == 0 or i == 1:
                samples.append((i, tree_rss_mb(proc)))
                print(f"  sync {i:5d}: watch tree RSS {sum(samples[-1][1].values()):.0f} MB", flush=True)
    finally:
        stop(proc)
    return samples


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=20, help="files added one by one (0: no latency part)")
    ap.add_argument("--syncs", type=int, default=1000, help="syncs of the memory watch (0: none)")
    ap.add_argument("--every", type=int, default=100, help="RSS sampled every this many syncs")
    ap.add_argument("--backend", default=None, help="encode backend (default: the config's, auto)")
    ap.add_argument("--code", default="3001e04", help="also measure this git revision's code ('' for none)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="watch-latency-") as tmp:
        base = Path(tmp)
        runs = [(args.code[:7], package_of(args.code, base / "old"))] if args.code else []
        runs.append(("this", None))
        for label, code in runs if args.files else ():
            r = latency(label, code, base, args.files, args.backend)
            print(f"{r['label']:>8}: write -> recorded, {args.files} files: median {r['median']:.2f} s, "
                  f"p95 {r['p95']:.2f} s, max {r['max']:.2f} s; idle CPU {r['idle_cpu'] * 100:.1f}% of a core; "
                  f"all {r['all']}", flush=True)
        if args.syncs:
            samples = memory(base, args.syncs, args.every, args.backend)
            (_, first), (n, last) = samples[0], samples[-1]
            print(f"memory: watch tree RSS {sum(first.values()):.0f} MB after sync 1, {sum(last.values()):.0f} MB after "
                  f"sync {n} ({sum(last.values()) - sum(first.values()):+.0f} MB); by process: " + ", ".join(
                      f"{k} {first.get(k, 0):.0f} -> {v:.0f}" for k, v in sorted(last.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
