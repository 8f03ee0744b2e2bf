"""The Ray engine against the local engine on one machine, and on a simulated 2-node Ray cluster.

    python bench/ray.py                       # 200 and 600 files, torch, then the 2-node cluster (~4 min on 2 cores)
    python bench/ray.py --files 8             # a quick check that everything works (~1.5 min)
    python bench/ray.py --files 100 --backend openvino --pdf-every 0 --repeat 2

The bench builds its own corpus: text files of distinct sentences (about 3 chunks each) and,
every --pdf-every files, a 2-page PDF with a text layer (pymupdf; ~1 chunk a page). It starts one
Milvus server on loopback (`milvus-lite server`), and every run writes a fresh collection there.

1. One machine. `ingest run` with the local engine and with the Ray engine (`[ray] address = ""`:
   the run starts its own Ray, as a user on one machine does), same backend, on --files and on
   3 x --files files. The rate of each engine is the difference (chunks / seconds between its two
   runs, end to end), so start-up (imports, Ray's start, the model's load, the last flush) drops out;
   the end-to-end seconds are printed too, and each engine's start-up (the intercept: the small run's
   seconds less its chunks at the steady rate). Goal: Ray >= 0.8 x the local engine's chunks/s. Both
   engines' collections of the same corpus must hold the same ids. --repeat R interleaves R rounds
   (local pair, ray pair, local pair, ...) and takes each engine's median, for a shared or noisy machine.
2. A simulated 2-node cluster in this process (`ray.cluster_utils.Cluster`): a head with 2 CPUs
   and no GPU, and two nodes with 1 CPU and 1 logical GPU each. `ingest run` joins it with
   `encode_gpus = 1` and `encode_actors = "auto"`: one encode actor per GPU node (torch sees no
   CUDA there, so each encodes on the CPU). The report's `rows_by_encoder_node` must show rows
   from two distinct nodes, and the ids must match the local engine's on the same files.

The machine may be shared: a thread samples every process twice a second, and CPU time taken by
processes that are not this bench's descendants is reported (a WARNING when they took >= 5 % of the
machine during an engine's two runs).
After each one-machine run the bench waits for the processes that run started and that outlive it
(printed), so the next run starts on idle cores. A run whose local Ray does not start (with a Milvus
server URI the driver holds a gRPC channel, and a fork that starts a Ray process can abort) is
printed as a NOTE and run once more, into another collection.
Needs the ray extra (pip install -e '.[ray]'). Ray usage stats are off; the cluster runs with
RAY_AUTH_MODE=disabled (Ray 2.60's token auth would otherwise refuse the driver): a throwaway cluster
of the bench's own, gone when it ends.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

# This file is named like the ray package: with its own folder first on sys.path, `import ray` finds it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
WORDS = ("river mountain engine harbour lantern orchard copper glacier violin meadow falcon circuit canyon archive "
         "thunder pepper compass marble ribbon saddle quartz tunnel beacon walnut amber willow signal kettle").split()


# -- corpus -----------------------------------------------------------------------------------
def sentence(rng: random.Random, doc: int, n: int) -> str:
    """A sentence no other file or line has: its file and line numbers, then 12 random words."""
    return f"Entry {doc} line {n}: " + " ".join(rng.choice(WORDS) for _ in range(12)) + "."


def make_corpus(folder: Path, files: int, pdf_every: int) -> None:
    """`files` files: text files of 30 sentences (~3 chunks of 200 tokens) and, every `pdf_every`-th,
    a 2-page PDF with a text layer (15 sentences a page: ~1 chunk each). File i is the same in any corpus."""
    import pymupdf

    folder.mkdir(parents=True)
    for i in range(files):
        rng = random.Random(i)
        if pdf_every and i % pdf_every == pdf_every - 1:
            doc = pymupdf.open()
            for page_no in range(2):
                page = doc.new_page()
                text = " ".join(sentence(rng, i, page_no * 15 + n) for n in range(15))
                page.insert_textbox(pymupdf.Rect(50, 50, 545, 790), text, fontsize=9)
            doc.save(folder / f"doc{i:05d}.pdf")
            doc.close()
        else:
            paras = [" ".join(sentence(rng, i, p * 10 + n) for n in range(10)) for p in range(3)]
            (folder / f"doc{i:05d}.txt").write_text("\n\n".join(paras) + "\n")


# -- other processes' CPU: the machine may be shared -----------------------------------------
class Others(threading.Thread):
    """Samples every process twice a second; `cpu` is the CPU seconds of those that are not this bench or
    its descendants (a Ray started by a run, the store, ...): another user's load, which skews the figures."""

    def __init__(self) -> None:
        super().__init__(name="others", daemon=True)
        self.cpu, self.halt = 0.0, threading.Event()
        self.seen: dict[tuple[int, float], float] = {}    # (pid, create time) -> CPU seconds at the last sample
        self.by_name: dict[str, float] = {}
        self.mine: set[tuple[int, float]] = set()
        self.begun, self.lock = time.time(), threading.Lock()
        self.sample(count=False)

    def run(self) -> None:
        while not self.halt.wait(0.5):
            self.sample()

    def sample(self, count: bool = True) -> None:
        with self.lock:
            self._sample(count)

    def _sample(self, count: bool) -> None:
        procs = {p.pid: p.info for p in psutil.process_iter(["ppid", "create_time", "cpu_times", "name"])}
        me = os.getpid()
        for pid, info in procs.items():
            if info["cpu_times"] is None or info["create_time"] is None:
                continue
            key, cpu = (pid, info["create_time"]), info["cpu_times"].user + info["cpu_times"].system
            if key in self.mine:
                continue
            ancestor, root, hops = pid, pid, 0
            while ancestor not in (me, 0, 1) and ancestor in procs and hops < 64:
                if (ancestor, procs[ancestor]["create_time"]) in self.mine:
                    ancestor = me
                    break
                root, ancestor, hops = ancestor, procs[ancestor]["ppid"], hops + 1
            if ancestor == me:         # once ours, always, with what it starts: a stopped Ray leaves orphans
                self.mine.add(key)
                continue
            before = self.seen.get(key, 0.0 if info["create_time"] > self.begun else cpu)
            self.seen[key] = cpu
            if count and cpu > before:
                self.cpu += cpu - before
                name = f"{info['name']} (tree {root})"           # root: its oldest ancestor below init
                self.by_name[name] = self.by_name.get(name, 0.0) + cpu - before

    def mark(self) -> tuple[float, dict[str, float]]:
        return self.cpu, dict(self.by_name)

    def since(self, mark: tuple[float, dict[str, float]] = (0.0, {})) -> tuple[float, str]:
        """Other processes' CPU seconds since `mark`, and the busiest of them."""
        names = sorted(((n, c - mark[1].get(n, 0.0)) for n, c in self.by_name.items()), key=lambda kv: -kv[1])
        return self.cpu - mark[0], ", ".join(f"{n} {c:.1f}" for n, c in names[:4] if c >= 0.1) or "none"


OTHERS = Others()


# -- the store and the runs -------------------------------------------------------------------
def start_lite_server(data: Path) -> tuple[subprocess.Popen, str]:
    """`milvus-lite server` on a free loopback port, once it accepts connections (as tests/conftest.py)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data.mkdir(parents=True)
    with open(data.parent / "milvus-lite.log", "ab") as log:
        proc = subprocess.Popen([str(Path(sys.executable).parent / "milvus-lite"), "server", "--data-dir", str(data),
                                 "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.2)
    stop(proc)
    raise RuntimeError(f"milvus-lite server did not start; see {data.parent / 'milvus-lite.log'}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def ingest(folder: Path, uri: str, collection: str, backend: str, config: str, work: Path,
           settle: bool = True) -> dict:
    """One `ingest run` into a fresh collection: its wall seconds, the report's totals and the collection. With
    `settle`, then wait (up to 30 s) for the processes it started that outlive it, so the next run has the cores.
    A run whose Ray did not start (intermittent here) is said so and run once more, into another collection."""
    for attempt in (1, 2):
        cfg, report = work / f"{collection}.toml", work / f"{collection}.json"
        cfg.write_text(config)
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        born, start, others = time.time(), time.perf_counter(), OTHERS.mark()
        proc = subprocess.run([sys.executable, "-m", "ingest.cli", "run", str(folder), "--store", uri, "--collection",
                               collection, "--backend", backend, "--config", str(cfg), "--report", str(report),
                               "--quiet"], capture_output=True, text=True, cwd=work, env=env)
        wall, others = time.perf_counter() - start, OTHERS.since(others)
        left, lasted = leftovers(born) if settle else (set(), 0.0)
        if proc.returncode == 0:
            break
        error = next((line for line in proc.stderr.splitlines() if line.startswith("ingest: error:")), "")
        if attempt == 1 and "cannot start the Ray engine" in error:
            print(f"{'':>7}NOTE: {collection}: {error[:300]} (after {wall:.0f} s; other processes took "
                  f"{others[0]:.1f} CPU-s meanwhile: {others[1]}); running it again", flush=True)
            collection += "_again"
            continue
        raise RuntimeError(f"ingest run into {collection} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    totals = json.loads(report.read_text())["totals"]
    if set(totals["by_status"]) != {"ingested"}:
        raise RuntimeError(f"{collection}: not every file was ingested: {totals['by_status']}")
    return {"wall": wall, "chunks": totals["chunks"], "totals": totals, "others": others, "leftovers": left,
            "lasted": lasted, "collection": collection}


def leftovers(born: float, limit: float = 30.0) -> tuple[set[str], float]:
    """Names of this bench's processes started since `born` still alive after the run, and how long after
    it the last went (waits up to `limit` s; the store and a cluster are older, so never counted)."""
    OTHERS.sample()                                    # the run's last children, marked as ours
    start, names = time.perf_counter(), set()
    while time.perf_counter() - start < limit:
        mine = set(OTHERS.mine)
        alive = [p for p in psutil.process_iter(["create_time", "name", "status"])
                 if (p.pid, p.info["create_time"]) in mine and (p.info["create_time"] or 0) >= born
                 and p.info["status"] != psutil.STATUS_ZOMBIE]
        if not alive:
            break
        names |= {p.info["name"] for p in alive}
        time.sleep(0.2)
    return names, (time.perf_counter() - start if names else 0.0)


IDS = """import json, sys
from ingest.store import Store
store = Store(sys.argv[1], sys.argv[2])
print(json.dumps([row["id"] for row in store.rows(["id"])]))
store.close()
"""


def ids(uri: str, collection: str) -> set[str]:
    """The collection's ids, read in a child process: a live gRPC channel in this process makes the forks
    that start the cluster's Ray processes abort now and then (gRPC's fork handlers)."""
    out = subprocess.run([sys.executable, "-c", IDS, uri, collection], capture_output=True, text=True, check=True,
                         env=dict(os.environ, HF_HUB_OFFLINE="1")).stdout
    return set(json.loads(out))


def same_ids(uri: str, a: str, b: str, chunks: int) -> str:
    x, y = ids(uri, a), ids(uri, b)
    if x == y and len(x) == chunks:
        return f"same {len(x)} ids"
    return f"DIFFERENT ids: {len(x)} vs {len(y)} ({len(x - y)} only in {a}, {len(y - x)} only in {b}; {chunks} chunks)"


# -- 1. one machine ---------------------------------------------------------------------------
ENGINES = {"local": '[run]\nengine = "local"\n',
           "ray": '[run]\nengine = "ray"\n[ray]\naddress = ""\n'}


def one_machine(uri: str, backend: str, small: Path, big: Path, work: Path, repeat: int) -> tuple[str, bool]:
    """Each engine on both corpora, interleaved by round; returns the local small-corpus collection and
    whether the bench's checks passed."""
    rates: dict[str, list[float]] = {e: [] for e in ENGINES}
    startup: dict[str, list[float]] = {e: [] for e in ENGINES}
    ok, reference = True, ""
    runs: dict[str, tuple[dict, dict]] = {}
    tag = os.getpid()
    for round_no in range(repeat):
        for engine, config in ENGINES.items():
            a = ingest(small, uri, f"{engine}_small_{round_no}_{tag}", backend, config, work)
            b = ingest(big, uri, f"{engine}_big_{round_no}_{tag}", backend, config, work)
            rate = (b["chunks"] - a["chunks"]) / (b["wall"] - a["wall"])
            rates[engine].append(rate)
            startup[engine].append(a["wall"] - a["chunks"] / rate)
            print(f"{engine:>5}: {a['chunks']:>5} chunks in {a['wall']:5.1f} s end to end "
                  f"({a['chunks'] / a['wall']:5.1f} chunks/s), {b['chunks']:>5} in {b['wall']:5.1f} s "
                  f"({b['chunks'] / b['wall']:5.1f} chunks/s); difference: {b['chunks'] - a['chunks']} chunks in "
                  f"{b['wall'] - a['wall']:.1f} s = {rate:.1f} chunks/s"
                  + (f"  [round {round_no + 1}]" if repeat > 1 else ""), flush=True)
            for run, size in ((a, "small"), (b, "big")):
                if run["leftovers"]:
                    print(f"{'':>7}{size} run: its processes outlived it by {run['lasted']:.1f} s (waited for: "
                          f"{', '.join(sorted(run['leftovers']))})", flush=True)
            busy = a["others"][0] + b["others"][0]
            if busy >= 0.05 * (a["wall"] + b["wall"]) * os.cpu_count():
                print(f"{'':>7}WARNING: other processes took {busy:.1f} CPU-s during these runs "
                      f"({busy / (a['wall'] + b['wall']) / os.cpu_count():.0%} of the machine; small run: "
                      f"{a['others'][1]}; big run: {b['others'][1]}): the figures are skewed", flush=True)
            if engine == "ray":
                nodes = b["totals"].get("rows_by_encoder_node", {})
                print(f"{'':>7}report: engine {b['totals'].get('engine')}, rows by encoder node "
                      + ", ".join(f"{n[:8]}: {r}" for n, r in nodes.items()), flush=True)
            runs[engine] = (a, b)
        for size, i in (("small", 0), ("big", 1)):
            local_run, ray_run = runs["local"][i], runs["ray"][i]
            check = same_ids(uri, local_run["collection"], ray_run["collection"], local_run["chunks"])
            ok &= check.startswith("same")
            if round_no == 0 and size == "small":
                reference = local_run["collection"]
            print(f"{'':>7}local and ray collections, {size} corpus: {check}", flush=True)
    local, ray_ = statistics.median(rates["local"]), statistics.median(rates["ray"])
    spread = "" if repeat == 1 else (f" (medians of {repeat} rounds; local {min(rates['local']):.1f}-"
                                     f"{max(rates['local']):.1f}, ray {min(rates['ray']):.1f}-{max(rates['ray']):.1f})")
    print(f"start-up (intercept): local {statistics.median(startup['local']):.1f} s, "
          f"ray {statistics.median(startup['ray']):.1f} s", flush=True)
    print(f"steady state: local {local:.1f} chunks/s, ray {ray_:.1f} chunks/s{spread}; "
          f"ray / local = {ray_ / local:.2f}x (goal >= 0.8: {'met' if ray_ / local >= 0.8 else 'NOT met'})", flush=True)
    return reference, ok


# -- 2. a simulated 2-node cluster --------------------------------------------------------------
def start_cluster() -> tuple[object, float]:
    """A head with 2 CPUs and no GPU, and two nodes of 1 CPU and 1 logical GPU; the Cluster and its start-up
    seconds. A cluster that does not come up (a Ray process whose fork died before its exec) is shut down and
    started once more."""
    from ray.cluster_utils import Cluster

    for attempt in (1, 2):
        start, others, cluster = time.perf_counter(), OTHERS.mark(), None
        try:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
            for _ in range(2):
                cluster.add_node(num_cpus=1, num_gpus=1)
            cluster.wait_for_nodes()
            return cluster, time.perf_counter() - start
        except Exception as exc:
            if cluster is not None:
                cluster.shutdown()
            if attempt == 2:
                raise
            print(f"{'':>7}the cluster did not start in {time.perf_counter() - start:.0f} s "
                  f"({' '.join(str(exc).split())[:160]}; other processes took {OTHERS.since(others)[0]:.1f} CPU-s "
                  "meanwhile); starting it again", flush=True)
            time.sleep(5)
    raise AssertionError("unreachable")


def two_nodes(uri: str, backend: str, folder: Path, work: Path, reference: str) -> bool:
    os.environ["RAY_AUTH_MODE"] = "disabled"          # before the cluster starts: its driver must connect
    cluster, seconds = start_cluster()
    try:
        print(f"2-node cluster at {cluster.address}: head 2 CPUs, 2 nodes of 1 CPU + 1 logical GPU "
              f"(up in {seconds:.1f} s)", flush=True)
        config = (f'[run]\nengine = "ray"\n[ray]\naddress = "{cluster.address}"\nencode_gpus = 1\n'
                  'encode_actors = "auto"\n')
        collection = f"cluster_{os.getpid()}"
        r = ingest(folder, uri, collection, backend, config, work, settle=False)
        nodes = r["totals"].get("rows_by_encoder_node", {})
        print(f"{'':>7}{r['chunks']} chunks in {r['wall']:.1f} s end to end (other processes: "
              f"{r['others'][0]:.1f} CPU-s); rows by encoder node: "
              + ", ".join(f"{n[:12]}: {rows}" for n, rows in nodes.items()), flush=True)
        both = len([n for n, rows in nodes.items() if rows > 0]) == 2 and sum(nodes.values()) == r["chunks"]
        check = same_ids(uri, reference, r["collection"], r["chunks"])
        print(f"{'':>7}two distinct nodes encoded rows: {'yes' if both else 'NO'}; "
              f"against the local engine on the same files: {check}", flush=True)
        return both and check.startswith("same")
    finally:
        cluster.shutdown()


# -- main ---------------------------------------------------------------------------------------
def machine() -> str:
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.machine()
    import ray
    import torch

    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30
    return (f"{os.cpu_count()} cores, {cpu}, {mem:.0f} GiB; Python {platform.python_version()}, Ray {ray.__version__}, "
            f"torch {torch.__version__} (CUDA {'yes' if torch.cuda.is_available() else 'no'}); "
            f"load average {os.getloadavg()[0]:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--files", type=int, default=200, help="files of the small corpus; the big one has 3x")
    ap.add_argument("--backend", default="torch", help="the backend of every run (default torch)")
    ap.add_argument("--pdf-every", type=int, default=6, help="every Nth file is a 2-page PDF (0: text files only)")
    ap.add_argument("--repeat", type=int, default=1, help="interleaved rounds of the one-machine runs (median)")
    ap.add_argument("--skip-cluster", action="store_true", help="skip the simulated 2-node cluster")
    ap.add_argument("--skip-one-machine", action="store_true", help="only the 2-node cluster")
    args = ap.parse_args()
    begun = time.perf_counter()
    OTHERS.start()
    work = Path(tempfile.mkdtemp(prefix="ingest-ray-bench-"))
    small, big = work / "small", work / "big"
    make_corpus(small, args.files, args.pdf_every)
    make_corpus(big, 3 * args.files, args.pdf_every)
    pdfs = sum(1 for _ in big.glob("*.pdf"))
    print(f"machine: {machine()}", flush=True)
    print(f"corpus: {args.files} and {3 * args.files} files ({pdfs} of the {3 * args.files} 2-page PDFs, the rest "
          f"text files of ~3 chunks); backend {args.backend}; store: milvus-lite server on loopback, a fresh "
          f"collection per run", flush=True)
    server, uri = start_lite_server(work / "milvus")
    ok = False
    try:
        reference = ""
        if not args.skip_one_machine:
            reference, ok = one_machine(uri, args.backend, small, big, work, args.repeat)
        if not args.skip_cluster:
            if not reference:
                reference = ingest(small, uri, f"local_ref_{os.getpid()}", args.backend, ENGINES["local"],
                                   work)["collection"]
            ok = two_nodes(uri, args.backend, small, work, reference) and (ok or args.skip_one_machine)
    finally:
        stop(server)
        OTHERS.halt.set()
        others, busiest = OTHERS.since()
        print(f"bench: {time.perf_counter() - begun:.0f} s; other processes took {others:.1f} CPU-s in all "
              f"({busiest}); checks {'passed' if ok else 'FAILED'}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
