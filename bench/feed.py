"""The host side's cost per chunk: `ingest run` with the null backend (no model) on text documents,
into Milvus Lite and into a real Milvus server started here on loopback.

    python bench/feed.py                          # 600 documents, Lite and (if installed) milvus-server
    python bench/feed.py --docs 400 --stores lite
    python bench/feed.py --stores null            # into the null store (null://): the host with no store's limit
    python bench/feed.py --backend openvino --code 6746f18    # another commit's code, beside this one
    python bench/feed.py --stores null --backend stub --code e78c4ab --old-backend openvino
                # the stub backend: vectors back, the vector cache, reuse, as in a GPU run, at no model cost

Each configuration runs twice, on --small and on --docs documents, each into a fresh store, and
the figures are the differences, so start-up (imports, spawns, the store's opening) drops out:
chunks/s in steady state, and CPU microseconds per chunk for the whole process tree (what the
kernel charged to `ingest run` and every descendant it reaped, the Milvus server's own process
excluded) and per stage, from sampling each process by its name (ingest-txt, ingest-encode,
ingest-writer, ingest-lite, ...). With a real backend, "host" is the tree less the encode
workers. 16 cores then feed at most 16e6 / (host us per chunk) chunks/s.

--code REV runs the same measurement on the code of git revision REV too (copied into a temporary
package beside this one), in the same run, so the ratio is fair; REV may also be a source tree (a
folder holding ingest/, loaders/ and workers/: a revision with some files changed), and several,
comma-separated, are measured in turn, each against the first. Old code has no null backend:
give both a real one (--backend), and its encode workers are told apart by the runtime they load.
`pip install milvus` (2.3.5) provides `milvus-server`, a real Milvus standalone.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from proctree import sampled_run  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
WORDS = ("river mountain engine harbour lantern orchard copper glacier violin meadow falcon circuit "
         "canyon archive thunder pepper compass marble ribbon saddle quartz tunnel beacon walnut").split()


def make_docs(folder: Path, n: int, paragraphs: int = 16) -> None:
    """n documents of `paragraphs` paragraphs of ~150 words: one ~190-token chunk each."""
    folder.mkdir(parents=True)
    rng = random.Random(0)
    for i in range(n):
        paras = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(140, 160))) + "." for _ in range(paragraphs)]
        (folder / f"doc{i:05d}.txt").write_text("\n\n".join(paras))


def measured_run(argv: list[str], cwd: Path, env: dict) -> dict:
    """Run `ingest run`; sample its process tree's CPU by role every 0.1 s."""
    run = sampled_run(argv, cwd, env)
    if run["rc"] != 0:
        sys.exit(f"ingest run failed ({run['rc']}): {run['stderr'].strip().splitlines()[-3:]}")
    report = json.loads((cwd / "report.json").read_text())
    return {"wall": run["wall"], "tree": run["tree"], "stages": run["stages"], "chunks": report["totals"]["chunks"],
            "rates": report["totals"].get("chunks_per_s", {})}


def start_server(data: Path) -> tuple[subprocess.Popen, str]:
    exe = shutil.which("milvus-server") or str(Path(sys.executable).parent / "milvus-server")
    if not Path(exe).exists():
        raise FileNotFoundError("milvus-server not found: pip install milvus  (2.3.5 ships Milvus standalone)")
    log = open(data.parent / "milvus-server.log", "ab")
    proc = subprocess.Popen([exe, "--data", str(data)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", 19530)) == 0:
                time.sleep(2)             # the port opens before the server answers
                return proc, "http://127.0.0.1:19530"
        time.sleep(0.5)
    stop_server(proc)
    raise RuntimeError(f"milvus-server did not start; see {data.parent / 'milvus-server.log'}")


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL after a short grace (it does not always exit on its own)."""
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            return
        os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            pass


def package_of(rev: str, into: Path) -> Path:
    """The ingest package of git revision `rev` (or of a source tree: a folder holding ingest/, loaders/ and
    workers/), laid out as installed (loaders/ and workers/ inside)."""
    src = into / "src"
    if Path(rev).is_dir():
        src = Path(rev)
    else:
        src.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", rev, "ingest", "loaders", "workers"], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    pkg = into / "pkg"
    shutil.copytree(src / "ingest", pkg / "ingest")
    shutil.copytree(src / "loaders", pkg / "ingest" / "loaders")
    shutil.copytree(src / "workers", pkg / "ingest" / "workers")
    return pkg


def measure(label: str, code: Path | None, uri: str, backend: str, docs: Path, small: Path, work: Path,
            writers: int, writers_16: int) -> dict:
    """One code's steady state (`writers` writer processes here; the projection: `writers_16` on 16 cores)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if code is not None:
        env["PYTHONPATH"] = str(code)
    runs = []
    for n, (folder, tag) in enumerate(((small, "small"), (docs, "big"))):
        store = uri if "://" in uri else str(work / f"{label}-{tag}.db")
        collection = f"feed_{label.replace('-', '_')}_{tag}_{os.getpid()}"
        config = work / "config.toml"
        cache = work / f"cache-{label}-{tag}.sqlite"   # a fresh vector cache a run (the stub backend fills it)
        config.write_text((f"[store]\nwriters = {writers}\n" if code is None else "") + f'[cache]\npath = "{cache}"\n')
        argv = [sys.executable, "-m", "ingest.cli", "run", str(folder), "--store", store, "--collection", collection,
                "--backend", backend, "--report", str(work / "report.json"), "--quiet", "--config", str(config)]
        runs.append(measured_run(argv, work, env))
    small_run, big = runs
    chunks = big["chunks"] - small_run["chunks"]
    stages = {k: (big["stages"].get(k, 0) - small_run["stages"].get(k, 0)) * 1e6 / chunks
              for k in sorted(set(big["stages"]) | set(small_run["stages"]))}
    tree = (big["tree"] - small_run["tree"]) * 1e6 / chunks
    host = tree - (stages.get("encode", 0.0) if backend not in ("null", "stub") else 0.0)
    return {"label": label, "chunks": big["chunks"], "rate": chunks / (big["wall"] - small_run["wall"]),
            "whole_rate": big["chunks"] / big["wall"], "tree_us": tree, "host_us": host, "stages_us": stages,
            "report_rates": big["rates"], "startup_s": _startup(small_run, stages, small_run["chunks"]),
            "projection": projection(stages, writers_16)}


LOADERS = ("txt", "pdf", "docx", "pptx", "ocr")


def writers_16(store: str, configured: int) -> int:
    """The writer processes of the projection's 16-core host: what [store] writers = "auto" gives the null
    store and Milvus Lite there (ingest/store/writers.py); the server's: --writers."""
    from ingest.store import milvus, null
    from ingest.store.writers import writer_processes

    caps = {"null": null.CAPS, "lite": milvus.LITE}.get(store)
    return writer_processes("auto", caps, 16) if caps else configured


def projection(stages_us: dict[str, float], writers: int, cores: int = 16) -> dict[str, float]:
    """What a `cores`-core host sustains, from the per-role CPU us a chunk measured here: the loaders on every
    core but the supervisor's, the supervisor and the encode worker's host side (one process each), the
    writers: min(15 / loader us, 1 / supervisor us, 1 / encode us, writers / writer us), in chunks/s."""
    def cap(processes: float, us: float) -> float:     # under 0.5 us a chunk is below the sampling's resolution
        return processes * 1e6 / us if us >= 0.5 else float("inf")

    caps = {"loaders": cap(cores - 1, sum(stages_us.get(k, 0.0) for k in LOADERS)),
            "supervisor": cap(1, stages_us.get("supervisor", 0.0)), "encode": cap(1, stages_us.get("encode", 0.0)),
            "writers": cap(writers, stages_us.get("writer", 0.0))}
    return {**caps, "sustained": min(caps.values()), "bound_by": min(caps, key=caps.get)}


def _startup(small: dict, stages_us: dict[str, float], chunks: int) -> dict[str, float]:
    """Start-up, measured apart: the small run's CPU seconds by role less its chunks at the steady cost."""
    return {k: round(v - stages_us.get(k, 0.0) * chunks / 1e6, 2) for k, v in small["stages"].items()
            if k in ("supervisor", "encode", "writer", *LOADERS)}


def show(r: dict) -> None:
    stages = ", ".join(f"{k} {v:,.0f}" for k, v in r["stages_us"].items() if abs(v) >= 5)
    print(f"{r['label']:<22} {r['chunks']:>6} chunks  {r['rate']:>7,.0f} chunks/s  tree {r['tree_us']:>6,.0f} us/chunk"
          f"  host {r['host_us']:>6,.0f} us/chunk  -> 16 cores feed {16e6 / r['host_us']:>7,.0f} chunks/s")
    print(f"{'':<22} CPU us/chunk by stage: {stages}; whole run {r['whole_rate']:,.0f} chunks/s")
    p = r["projection"]
    caps = ", ".join(f"{k} {p[k]:,.0f}" if p[k] != float("inf") else f"{k} (unmeasurably small)"
                     for k in ("loaders", "supervisor", "encode", "writers"))
    print(f"{'':<22} 16-core projection: {p['sustained']:,.0f} chunks/s, bound by {p['bound_by']} ({caps})")
    print(f"{'':<22} start-up CPU s by role (apart): {r['startup_s']}")
    print(f"{'':<22} report's stage rates (chunks/s of busy time): {r['report_rates']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=600)
    ap.add_argument("--small", type=int, default=100, help="documents of the start-up run (subtracted); enough that "
                    "every writer process gets a batch in it too (its client's import and connection are start-up: "
                    "with 20 documents, one batch, the second writer's were counted as cost per chunk)")
    ap.add_argument("--paragraphs", type=int, default=16, help="paragraphs (chunks) per document")
    ap.add_argument("--backend", default="null", help="null, stub (null's vectors cached and reused like a model's), "
                    "or a real backend")
    ap.add_argument("--old-backend", default="", help="the backend of the --code revisions (default: --backend; "
                    "revisions before the stub backend need a real one for the stub's measure)")
    ap.add_argument("--stores", default="lite,server", help="comma list of lite, server, null (the null store: "
                    "what the host does with no store's limit; not in code older than issue 38)")
    ap.add_argument("--writers", type=int, default=2, help="[store] writers for the server")
    ap.add_argument("--json", default="", help="also write the results to this JSON file")
    ap.add_argument("--rounds", type=int, default=1, help="measure every code this many times, in turn")
    ap.add_argument("--code", default="", help="also measure the code of these git revisions or source trees "
                    "(comma-separated; same run, before this working tree)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ingest-feed-"))
    make_docs(work / "docs", args.docs, args.paragraphs)
    make_docs(work / "small", args.small, args.paragraphs)
    codes: list[tuple[str, Path | None]] = [("this", None)]
    for i, rev in enumerate(args.code.split(",") if args.code else []):
        name = Path(rev).name if Path(rev).is_dir() else rev[:7]
        codes.insert(i, (name, package_of(rev, work / f"old{i}")))
    print(f"machine: {os.cpu_count()} cores, {_cpu_name()}; backend {args.backend}; documents {args.docs} "
          f"of {args.paragraphs} chunks (start-up run: {args.small}, subtracted)", flush=True)
    results = []
    server = None
    try:
        for store in args.stores.split(","):
            uri = "null://" if store == "null" else "lite"      # null: the null store, the host alone
            if store == "server":
                try:
                    server, uri = start_server(work / "milvus")
                except (FileNotFoundError, RuntimeError) as exc:
                    print(f"server: skipped: {exc}")
                    continue
            for r in range(args.rounds):
                for name, code in codes:
                    label = f"{name}-{store}" + (f"-r{r + 1}" if args.rounds > 1 else "")
                    backend = args.old_backend or args.backend if code is not None else args.backend
                    results.append(measure(label, code, uri, backend, work / "docs", work / "small", work,
                                           args.writers, writers_16(store, args.writers)))
                    show(results[-1])
            if server is not None:
                stop_server(server)
                server = None
    finally:
        if server is not None:
            stop_server(server)
    for i in range(0, len(results), len(codes)):
        old = results[i]
        for new in results[i + 1:i + len(codes)]:
            sup = old["stages_us"].get("supervisor", 0) / max(new["stages_us"].get("supervisor", 0), 1e-9)
            print(f"{new['label']} / {old['label']}: host cost {old['host_us'] / new['host_us']:.2f}x lower, "
                  f"supervisor {sup:.2f}x lower, chunks/s {new['rate'] / old['rate']:.2f}x (steady), "
                  f"{new['whole_rate'] / old['whole_rate']:.2f}x (whole run)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    shutil.rmtree(work, ignore_errors=True)
    return 0


def _cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
