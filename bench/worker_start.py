"""An encode worker's start, old code against new, in one run (issue 38, item 4: a worker up in <= 5 s).

    python bench/worker_start.py                    # old = 6793432, best of 3, interleaved
    python bench/worker_start.py --device cuda:0 --old 6793432 --repeat 3

Each figure is a fresh interpreter (as a user's first call): from `EncodePool(...)` to the first vector
of one pretokenized chunk back (spawn, imports, model load, warm-up, first batch), the worker's own
start (launch to ready), and the CPU seconds the worker spent by then (user + system: what a shared
machine's load does not inflate as it does wall time). Beside them, what the worker imports to load the model, each in a fresh
interpreter: torch alone, the old worker's sentence-transformers, the new worker's torch_model module.
Prints seconds (each the best of --repeat) and new / old ratios.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from feed import package_of  # noqa: E402

FIRST_VECTOR = r"""
import json, os, sys, time
started = time.perf_counter()
import ingest
assert ingest.__file__.startswith(os.environ.get("PYTHONPATH") or os.path.dirname(ingest.__file__)), ingest.__file__
import numpy as np
from ingest.api import EncodePool, Pretokenized
from ingest.model_ref import resolve_model
ref = resolve_model("default")
pool = EncodePool(ref, devices=[sys.argv[1]], pretokenized=True)
ids = np.array([101] + [2000] * 180 + [102], dtype=np.int32)
[(_, rows)] = list(pool.encode_groups([(0, Pretokenized(["x"], ids, np.array([len(ids)], np.int32)))]))
first = time.perf_counter() - started
import psutil
cpu = psutil.Process(pool.worker_pids[0]).cpu_times()
print(json.dumps({"first_vector_s": first, "worker_startup_s": pool.startup_seconds[0],
                  "worker_cpu_s": cpu.user + cpu.system}))
pool.close()
"""

IMPORT = r"""
import sys, time
started = time.perf_counter()
import torch
torch_s = time.perf_counter() - started
exec(sys.argv[1])
print(f"{torch_s} {time.perf_counter() - started}")
"""
IMPORTS = {"torch alone": "pass",
           "old worker: sentence_transformers": "from sentence_transformers import SentenceTransformer",
           "new worker: torch_model (BERT in torch)": "from ingest.workers.encode import torch_model"}


def run(code: str, args: list[str], pkg: Path | None, cwd: Path) -> str:
    env = dict(os.environ)
    if pkg is not None:
        env["PYTHONPATH"] = str(pkg)
    # cwd: not the checkout, whose ingest/ a `-c` interpreter would import before PYTHONPATH's
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=900,
                         cwd=cwd)
    if out.returncode:
        raise SystemExit(f"failed:\n{out.stderr[-3000:]}")
    return out.stdout.strip().splitlines()[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default="6793432", help="git revision (or source tree) of the old code")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", default="", help="write the figures here too")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-worker-start-"))
    old = package_of(args.old, work / "old")
    best: dict[str, dict] = {}
    imports: dict[str, float] = {}
    for _ in range(args.repeat):                # interleaved: a shared machine's drift hits both alike
        for label, pkg in ((f"old ({args.old})", old), ("new", None)):
            r = json.loads(run(FIRST_VECTOR, [args.device], pkg, work))
            best[label] = {k: min(v, best.get(label, {}).get(k, float("inf"))) for k, v in r.items()}
        for label, code in IMPORTS.items():
            torch_s, total = map(float, run(IMPORT, [code], None, work).split())
            imports[label] = min(imports.get(label, float("inf")), total)
    print(f"encode worker start on {args.device}, best of {args.repeat}:")
    for label, r in best.items():
        print(f"  {label:<18} first vector {r['first_vector_s']:6.2f} s   worker launch to ready "
              f"{r['worker_startup_s']:6.2f} s   worker CPU {r['worker_cpu_s']:6.2f} s")
    o, n = best[f"old ({args.old})"], best["new"]
    print(f"  new / old: first vector {n['first_vector_s'] / o['first_vector_s']:.2f}, worker start "
          f"{n['worker_startup_s'] / o['worker_startup_s']:.2f}, worker CPU {n['worker_cpu_s'] / o['worker_cpu_s']:.2f}")
    print("imports, each in a fresh interpreter (torch included):")
    for label, seconds in imports.items():
        print(f"  {label:<40} {seconds:6.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"start": best, "imports_s": imports}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
