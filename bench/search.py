"""Wall clock of `ingest search` per backend (median of --repeat), and of a one-file `ingest run`.

    python bench/search.py                 # backends torch, onnx, onnx-int8, openvino
    python bench/search.py --repeat 9
    python bench/search.py --store DB --old DIR [--query Q]    # an existing store: this code against OLD's

For each backend: ingest the bundled samples into a fresh Milvus Lite file, then time
`ingest search` as a user types it (a new process each time, so imports and model loading
count). A torch collection's query goes through the guarded ONNX fp32 export; --torch-query
also times the plain torch query path for comparison. Then a fresh one-file folder is
ingested with each backend (exports already cached: that is a second run's cost).
Goals: search <= 2.0 s (moonshot 1 s); one-file run with onnx-int8 <= 4 s.
With --store and --old (a checkout importable with PYTHONPATH=OLD, as bench/card_cost.py's), it only times
`ingest search` on that store, this code and OLD's code alternating, --repeat times each (issue 41: what the
ranking costs end to end, old beside new in one run).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def wall(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    seconds = time.perf_counter() - started
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)} failed: {proc.stderr.strip()}")
    return seconds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--backends", default="torch,onnx,onnx-int8,openvino")
    ap.add_argument("--torch-query", action="store_true", help="also time a torch query without the ONNX stand-in")
    ap.add_argument("--store", help="an existing store: time only its search, this code against --old")
    ap.add_argument("--old", type=Path, help="with --store: a checkout of the old code (PYTHONPATH=OLD imports it)")
    ap.add_argument("--query", default="What is Lockheed Martin's FY2021 net working capital?")
    args = ap.parse_args()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if args.store:
        return versus(args, env)
    ingest = [sys.executable, "-m", "ingest.cli"]
    print(f"{len(os.sched_getaffinity(0))} CPU cores; {args.repeat} searches per backend; median wall seconds")
    with tempfile.TemporaryDirectory() as tmp:
        one = Path(tmp) / "one"
        one.mkdir()
        (one / "note.txt").write_text("The lighthouse keeper logs every passing ship, day and night. " * 20)
        for backend in args.backends.split(","):
            store = str(Path(tmp) / f"{backend}.db")
            wall([*ingest, "run", str(ROOT / "samples"), "--store", store, "--backend", backend, "--quiet",
                  "--report", str(Path(tmp) / "r.json")], env)
            query = [*ingest, "search", "who keeps the lighthouse", "--store", store]
            wall(query, env)                                        # the first search may export once
            times = [wall(query, env) for _ in range(args.repeat)]
            print(f"ingest search, {backend:<9} collection: {statistics.median(times):5.2f} s "
                  f"(min {min(times):.2f}, max {max(times):.2f})", flush=True)
            if backend == "torch" and args.torch_query:
                code = ("import sys; from ingest.search import embed_query; from ingest.model_ref import resolve_model;"
                        "import ingest.search as s; s._fp32_if_exact = lambda ref: '';"
                        f"from ingest.store import Store; st = Store({store!r}, 'documents');"
                        "print(st.search(embed_query(resolve_model(), 'torch', 'who keeps the lighthouse').tolist(), 5))")
                times = [wall([sys.executable, "-c", code], env) for _ in range(args.repeat)]
                print(f"  torch query path (no ONNX stand-in): {statistics.median(times):5.2f} s", flush=True)
        for backend in args.backends.split(","):
            times = []
            for i in range(args.repeat):
                store = str(Path(tmp) / f"one-{backend}-{i}.db")
                times.append(wall([*ingest, "run", str(one), "--store", store, "--backend", backend, "--quiet",
                                   "--report", str(Path(tmp) / "r.json")], env))
            print(f"one-file ingest run, {backend:<9}: {statistics.median(times):5.2f} s "
                  f"(min {min(times):.2f}, max {max(times):.2f})", flush=True)
    return 0


def versus(args: argparse.Namespace, env: dict[str, str]) -> int:
    """`ingest search` on args.store, this code and args.old's alternating; medians, minimums and their ratio."""
    if args.old is None:
        raise SystemExit("--store needs --old DIR (a checkout of the code to compare with)")
    codes = {"new": ROOT, "old": args.old.resolve()}
    times: dict[str, list[float]] = {name: [] for name in codes}
    with tempfile.TemporaryDirectory() as tmp:          # the cwd: never a checkout (python -m imports it)
        for _ in range(args.repeat):
            for name, code in codes.items():
                argv = [sys.executable, "-m", "ingest.cli", "search", args.query, "--store", args.store]
                started = time.perf_counter()
                proc = subprocess.run(argv, capture_output=True, text=True, cwd=tmp, timeout=900,
                                      env=dict(env, PYTHONPATH=str(code)))
                times[name].append(time.perf_counter() - started)
                if proc.returncode:
                    raise SystemExit(f"ingest search ({name}) failed: {proc.stderr.strip()[-500:]}")
    for name, ts in times.items():
        print(f"ingest search, {name}: median {statistics.median(ts):.2f} s, min {min(ts):.2f} s ({len(ts)} runs)")
    print(f"new / old: median {statistics.median(times['new']) / statistics.median(times['old']):.3f}, "
          f"min {min(times['new']) / min(times['old']):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
