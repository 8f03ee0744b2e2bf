"""The encode pool and `ingest run` on one device, every measurement in a subprocess of its own, one JSON.

    python bench/gpu.py --device cuda:0 --n 100000 --out result.json --model .device/model   # a GPU machine
    python bench/gpu.py --device cpu --n 1000 --out result.json                              # the rehearsal
    python bench/gpu.py --probe                     # do the imports this needs work here? (seconds)

Measurements, in this order, on the same synthetic chunks of ~183 tokens (common words, one token
each, so their token ids are made by numpy in well under a second and equal the tokenizer's):
  forward_only       the model alone on pre-tokenized batches of rows of one length, already on the
                     device: a cold pass (every shape new) and a warm one (the compute limit)
  worker_start_s     an EncodePool's start to its first vector
  pool_pretokenized  our pool fed token ids (Pretokenized groups of 512), as `ingest run` feeds it
  pool_real_lengths  the same on chunks whose lengths are drawn from bench/real_chunk_lengths.json
  pool_raw_texts     encode_multi_process on raw texts (the pool's tokenizer processes)
  ingest_run         `ingest run` of a generated folder of text files into each store of --stores
                     (Milvus Lite, the null store): whole-run and steady chunks/s, the device's busy
                     share, CPU per chunk by process role, the report's timeline (bench/gpu_ingest.py)
  bare_encode        SentenceTransformer.encode at its best batch size (the first --peer-n chunks)
  st_pool            sentence-transformers' own multi-process pool, 1 and 2 processes (--peer-n chunks)

--set issue38 measures the first six (issue 38's); --set all (the default) every one.

Each runs with its own time limit, inside one budget (--budget-s). The JSON is rewritten (atomically)
as each ends, so a killed run keeps every finished measurement. A measurement that outlives its
limit is written down as "timeout" with the stack of every Python process in its tree: py-spy's
where it is installed, and always faulthandler's (each process of the tree registers SIGUSR1 through
a sitecustomize this script puts on PYTHONPATH), then the tree is killed.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).parent))
from gpu_ingest import STORES, stores_of  # noqa: E402
from gpu_measures import ORDER, measure  # noqa: E402

LIMITS_S = {"forward_only": 120, "worker_start_s": 60, "pool_pretokenized": 120, "pool_real_lengths": 120,
            "pool_raw_texts": 120, "ingest_run": 240, "bare_encode": 120, "st_pool": 150}
SETS = {"all": ORDER, "issue38": ORDER[:6]}
SITECUSTOMIZE = """import faulthandler, importlib.machinery, os, runpy, signal, sys
_d = os.environ.get("GPU_BENCH_STACKS")
if _d:
    _stacks = open(os.path.join(_d, "%d.txt" % os.getpid()), "w")
    faulthandler.register(signal.SIGUSR1, file=_stacks, all_threads=True)
    _next = importlib.machinery.PathFinder.find_spec(      # the sitecustomize this one hides, if any
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != os.path.abspath(_d)])
    if _next is not None and _next.origin:
        runpy.run_path(_next.origin, run_name="sitecustomize")
"""


# --- the driver -----------------------------------------------------------------------------------------

def tree(pid: int) -> list:
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _clip(text: str, head: int = 4000, tail: int = 2000) -> str:
    """A long dump's head (its threads' headers and innermost frames) and tail (the outermost frames)."""
    if len(text) <= head + tail:
        return text
    return text[:head] + f"\n[... {len(text) - head - tail} characters left out ...]\n" + text[-tail:]


def stacks_of(pid: int, stacks_dir: Path) -> list[dict]:
    """The stack of every Python process under `pid`: py-spy where it is installed, and faulthandler's."""
    procs, found = tree(pid), []
    for p in procs:
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except OSError:
            pass
    time.sleep(1.0)
    spy = shutil.which("py-spy")
    for p in procs:
        entry = {"pid": p.pid}
        try:
            entry["cmdline"] = " ".join(p.cmdline())[:300]
            entry["name"] = p.name()
        except Exception as e:          # gone meanwhile
            entry["gone"] = type(e).__name__
        if spy:
            out = subprocess.run([spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True, timeout=20)
            entry["py_spy"] = _clip(out.stdout or out.stderr)
        dumped = stacks_dir / f"{p.pid}.txt"
        if dumped.exists():
            entry["faulthandler"] = _clip(dumped.read_text())
        found.append(entry)
    return found


def kill_tree(pid: int) -> None:
    for p in reversed(tree(pid)):
        try:
            p.kill()
        except Exception:
            pass


def meta(a) -> dict:
    import psutil

    info = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv[1:], "device": a.device, "dtype": a.dtype, "n": a.n, "run_chunks": a.run_chunks,
            "peer_n": a.peer_n, "model": a.model_path, "python": platform.python_version(),
            "cpu_cores": len(os.sched_getaffinity(0)), "cpu_model": platform.processor() or platform.machine(),
            "memory_gb": round(psutil.virtual_memory().total / 2**30, 1)}
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    info["commit"] = git.stdout.strip() or None
    probe = subprocess.run([sys.executable, "-c", "import torch, json; print(json.dumps([torch.__version__, "
                            "torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name(0)]))"],
                           capture_output=True, text=True, timeout=120)
    info["torch"], info["cuda"], info["device_name"] = json.loads(probe.stdout) if probe.returncode == 0 else [None] * 3
    smi = shutil.which("nvidia-smi") and subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30).stdout.strip()
    info["driver"] = smi.splitlines()[0].split(", ")[1] if smi else None
    info["gpus"] = smi.splitlines() if smi else []
    return info


def save(path: Path, doc: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.replace(tmp, path)


def summary(results: dict) -> dict:
    rate = {k: v.get("chunks_per_s") for k, v in results.items() if v.get("status") == "ok"}
    out = {k: round(v, 1) for k, v in rate.items() if v}
    for store, run in results.get("ingest_run", {}).get("stores", {}).items():
        for key in ("chunks_per_s", "steady_chunks_per_s", "gpu_busy_share"):
            if run.get(key) is not None:
                out[f"ingest_run_{store}_{key}"] = round(run[key], 3 if "share" in key else 1)
        if rate.get("pool_pretokenized") and run.get("steady_chunks_per_s"):
            out[f"ingest_run_{store}_steady_over_pool_pretokenized"] = round(
                run["steady_chunks_per_s"] / rate["pool_pretokenized"], 3)
    if results.get("forward_only", {}).get("cold_chunks_per_s"):
        out["forward_only_cold"] = round(results["forward_only"]["cold_chunks_per_s"], 1)
    if rate.get("forward_only") and rate.get("pool_pretokenized"):
        out["pool_pretokenized_over_forward_only"] = round(rate["pool_pretokenized"] / rate["forward_only"], 3)
    if rate.get("pool_raw_texts") and rate.get("pool_pretokenized"):
        out["pool_raw_texts_over_pool_pretokenized"] = round(rate["pool_raw_texts"] / rate["pool_pretokenized"], 3)
    if results.get("worker_start_s", {}).get("status") == "ok":
        out["worker_start_s"] = round(results["worker_start_s"]["first_vector_s"], 2)
    return out


def drive(a) -> int:
    out = Path(a.out)
    names = [m for m in SETS[a.set] if m in a.only] if a.only else list(SETS[a.set])
    doc = {"meta": meta(a), "measurements": {}, "summary": {}}
    save(out, doc)
    stacks_dir = Path(tempfile.mkdtemp(prefix="gpu-bench-stacks-"))
    (stacks_dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, GPU_BENCH_STACKS=str(stacks_dir), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(stacks_dir), os.environ.get("PYTHONPATH")])))
    deadline = time.monotonic() + a.budget_s
    common = ["--device", a.device, "--dtype", a.dtype, "--n", str(a.n), "--model", a.model_path,
              "--run-chunks", str(a.run_chunks), "--peer-n", str(a.peer_n), "--forward-batch", str(a.forward_batch),
              "--bare-batch-sizes", ",".join(map(str, a.bare_batch_sizes)), "--stores", a.stores,
              "--run-backend", a.run_backend]
    common += ["--tokenizer-workers", str(a.tokenizer_workers)] if a.tokenizer_workers else []
    common += ["--batch-size", str(a.batch_size)] if a.batch_size else []
    for name in names:
        wanted = a.limits.get(name, LIMITS_S[name])
        limit = min(wanted, deadline - time.monotonic() - 5)
        if limit < min(wanted, 10):
            doc["measurements"][name] = {"status": "skipped", "why": "the budget (--budget-s) was spent"}
            save(out, doc)
            continue
        result_file = stacks_dir / f"{name}.json"
        print(f"{name}: up to {limit:.0f} s ...", flush=True)
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, __file__, "--measure", name, "--result", str(result_file), *common],
                                env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        log: list[str] = []
        reader = threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=limit)
            entry = {"status": "ok", **json.loads(result_file.read_text())} if rc == 0 and result_file.exists() \
                else {"status": "error", "exit_code": rc}
        except subprocess.TimeoutExpired:
            entry = {"status": "timeout", "limit_s": round(limit, 1), "stacks": stacks_of(proc.pid, stacks_dir)}
            kill_tree(proc.pid)
            proc.wait()
        reader.join(timeout=5)
        entry["seconds"] = round(time.perf_counter() - started, 2)
        if entry["status"] != "ok":
            entry["output_tail"] = "".join(log)[-4000:]
        doc["measurements"][name] = entry
        doc["summary"] = summary(doc["measurements"])
        save(out, doc)
        shown = entry.get("chunks_per_s") or entry.get("first_vector_s")
        print(f"{name}: {entry['status']} in {entry['seconds']} s" + (f", {shown:,.1f}" if shown else ""), flush=True)
    shutil.rmtree(stacks_dir, ignore_errors=True)
    print(json.dumps(doc["summary"], indent=1))
    return 0


PROBE = ("torch", "sentence_transformers", "transformers", "tokenizers", "numpy", "psutil", "pymilvus",
         "pebble", "langchain_text_splitters", "langchain_core", "charset_normalizer", "tqdm", "ingest.cli")
STORE_MODULES = {"milvus-lite": "milvus_lite", "lancedb": "lancedb"}     # what a store of --stores imports


def probe(stores: str) -> int:
    """Import what the measurements, and the stores of `stores`, need; one line each; exit 1 if any is missing."""
    import importlib

    missing = 0
    for name in PROBE + tuple(STORE_MODULES[s] for s, _ in stores_of(stores, 0) if s in STORE_MODULES):
        try:
            mod = importlib.import_module(name)
            print(f"ok       {name} {getattr(mod, '__version__', '')}")
        except Exception as e:          # a missing or broken package: say which
            missing += 1
            print(f"MISSING  {name}: {type(e).__name__}: {e}")
    print(f"py-spy: {shutil.which('py-spy') or 'absent (stacks from faulthandler only)'}")
    return 1 if missing else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda:0", help="cuda:N or cpu")
    ap.add_argument("--n", type=int, default=100_000, help="chunks for forward_only and the pools")
    ap.add_argument("--out", default="gpu-bench.json")
    ap.add_argument("--model", dest="model_path", default=None,
                    help="model directory (default: the packaged model; .device/model on a GPU machine)")
    ap.add_argument("--dtype", default=None, help="default float16 on CUDA, float32 on the CPU")
    ap.add_argument("--run-chunks", type=int, default=None, help="ingest_run's chunks (default: max(n, 200000) on "
                    "CUDA, n on the CPU)")
    ap.add_argument("--peer-n", type=int, default=None, help="chunks for bare_encode and st_pool (default min(n, 20000))")
    ap.add_argument("--forward-batch", default=None, help="forward_only rows per batch, a comma list (default "
                    "128,256,512,1024 CUDA; 64 CPU)")
    ap.add_argument("--bare-batch-sizes", default=None, help="comma list (default 64,128,256,512 CUDA; 32 CPU)")
    ap.add_argument("--tokenizer-workers", type=int, default=None, help="our pool's (default: the pool's own)")
    ap.add_argument("--batch-size", type=int, default=None, help="our pool's rows per batch (default: the pool's)")
    ap.add_argument("--stores", default=None, help="ingest_run's stores, name[:chunks] each (default "
                    "milvus-lite:30000,null on CUDA, milvus-lite,null on the CPU; no count: --run-chunks); names: "
                    + ", ".join(STORES))
    ap.add_argument("--run-backend", default="torch", help="ingest_run's --backend (null: the host alone)")
    ap.add_argument("--set", default="all", choices=sorted(SETS), help="which measurements (before --only)")
    ap.add_argument("--only", default=None, help=f"comma list of: {','.join(ORDER)}")
    ap.add_argument("--limit", action="append", default=[], metavar="NAME=S", help="one measurement's time limit")
    ap.add_argument("--budget-s", type=float, default=450, help="all measurements together (default 450)")
    ap.add_argument("--probe", action="store_true", help="check the imports and exit")
    ap.add_argument("--measure", choices=ORDER, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.probe:
        return probe(a.stores or "milvus-lite,null")
    cuda = a.device.startswith("cuda")
    if a.model_path is None:
        from ingest.model_ref import resolve_model

        a.model_path = resolve_model("default").path
    elif Path(a.model_path).exists():
        a.model_path = str(Path(a.model_path).resolve())      # ingest_run runs in its own folder
    a.dtype = a.dtype or ("float16" if cuda else "float32")
    a.run_chunks = a.run_chunks or (max(a.n, 200_000) if cuda else a.n)
    a.peer_n = a.peer_n or min(a.n, 20_000)
    a.forward_batch = a.forward_batch or ("128,256,512,1024" if cuda else "64")
    a.bare_batch_sizes = [int(b) for b in (a.bare_batch_sizes or ("64,128,256,512" if cuda else "32")).split(",")]
    a.stores = a.stores or ("milvus-lite:30000,null" if cuda else "milvus-lite,null")
    try:
        stores_of(a.stores, a.run_chunks)                # an unknown store: refused now, in one line
    except ValueError as e:
        ap.error(str(e))
    if a.measure:
        return measure(a)
    a.only = [m.strip() for m in a.only.split(",")] if a.only else None
    a.limits = {k: float(v) for k, _, v in (item.partition("=") for item in a.limit)}
    return drive(a)


if __name__ == "__main__":
    sys.exit(main())
