"""The Ray engine on a real Ray cluster of one, then two nodes on this machine (issue 22 item 5).

    python bench/ray_nodes.py                                # 5,000 tiny files, 2 CPUs per node, null backend
    python bench/ray_nodes.py --files 20000 --cpus 2 --backend null

A head node (`ray start --head --num-cpus=C`) and a Milvus server (`milvus-lite server`) on loopback;
`ingest run --engine ray` joins the cluster ([ray] address) and writes a fresh collection. Then a
second node joins (`ray start --address=HEAD --num-cpus=C`, a raylet of its own with its own
resources) and the same folder goes into another fresh collection. Printed per cluster: wall seconds,
files/s, the report's first row, files/s after it (start-up left out) and rows by encoder node, and the
ratios two nodes / one. Both
collections must hold the same ids. The nodes share this machine's cores, so the second node adds
Ray resources (load-task slots), not hardware: the ratio says whether the engine spreads over nodes
and whether one node left cores idle, not what a second machine would add. Each node runs in a
process group of its own, killed at the end (never `ray stop`, which stops every Ray of the user).
--pin gives each node a core of its own (the head, the driver and the store on core 0; the second node
on core 1), so the second node adds hardware as a second machine would.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from feed import _cpu_name  # noqa: E402
from scale import make_tiny  # noqa: E402

BIN = Path(sys.executable).parent
ENV = dict(os.environ, HF_HUB_OFFLINE="1", RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def started(args: list[str], log: Path, ready: str, timeout: float = 180, cores: set[int] | None = None
            ) -> subprocess.Popen:
    """A long-running command in a process group of its own (on `cores`, if given), once `ready` is in its
    log (or, for "", at once)."""
    pin = (lambda: os.sched_setaffinity(0, cores)) if cores else None
    with open(log, "wb") as out:
        proc = subprocess.Popen(args, env=ENV, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=pin)
    deadline = time.monotonic() + timeout
    while ready and ready not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            kill(proc)
            raise RuntimeError(f"{args[0]} did not start; see {log}")
        time.sleep(0.2)
    return proc


def kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def milvus(work: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    (work / "milvus").mkdir()
    proc = started([str(BIN / "milvus-lite"), "server", "--data-dir", str(work / "milvus"), "--host", "127.0.0.1",
                    "--port", str(port)], work / "milvus.log", "")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.2)
    kill(proc)
    raise RuntimeError(f"milvus-lite server did not start; see {work / 'milvus.log'}")


def node(work: Path, name: str, cpus: int, port: int = 0, head: str = "", cores: set[int] | None = None
         ) -> subprocess.Popen:
    """A head node on `port`, or a node joining `head`."""
    common = [f"--num-cpus={cpus}", "--num-gpus=0", "--object-store-memory=300000000", "--disable-usage-stats",
              "--block"]
    if head:
        return started([str(BIN / "ray"), "start", f"--address={head}", *common], work / f"{name}.log",
                       "Ray runtime started", cores=cores)
    return started([str(BIN / "ray"), "start", "--head", f"--port={port}", "--include-dashboard=false",
                    *common], work / f"{name}.log", "Ray runtime started")


def run(folder: Path, uri: str, collection: str, address: str, backend: str, work: Path) -> dict:
    (work / "cluster.toml").write_text(f'[run]\nengine = "ray"\n[ray]\naddress = "{address}"\n')
    report = work / f"{collection}.json"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "ingest.cli", "run", str(folder), "--store", uri, "--collection",
                           collection, "--backend", backend, "--config", str(work / "cluster.toml"), "--report",
                           str(report), "--quiet"], capture_output=True, text=True, cwd=work, env=ENV)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"ingest run into {collection} exited {proc.returncode}: {proc.stderr[-2000:]}")
    totals = json.loads(report.read_text())["totals"]
    return {"wall": wall, "totals": totals}


def ids(uri: str, collection: str) -> set[str]:
    from pymilvus import MilvusClient

    client = MilvusClient(uri=uri)
    try:
        return {r["id"] for r in client.query(collection, filter='id != ""', output_fields=["id"], limit=16384)}
    finally:
        client.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", type=int, default=5000)
    ap.add_argument("--cpus", type=int, default=2, help="logical CPUs of each node")
    ap.add_argument("--backend", default="null")
    ap.add_argument("--pin", action="store_true",
                    help="a core per node: the head, the driver and the store on core 0, the second node on core 1")
    args = ap.parse_args()
    if args.pin:                                     # everything this bench starts inherits it, but node 2
        os.sched_setaffinity(0, {0})
    work = Path(tempfile.mkdtemp(prefix="ray-nodes-"))
    folder = work / "docs"
    make_tiny(folder, args.files)
    head_port = free_port()
    address = f"127.0.0.1:{head_port}"
    print(f"{datetime.date.today()}  machine: {platform.machine()}, {os.cpu_count()} cores, {_cpu_name()}; "
          f"backend {args.backend}; {args.files:,} tiny files; {args.cpus} logical CPUs per node"
          f"{'; a core per node (--pin)' if args.pin else ''}", flush=True)
    procs: list[subprocess.Popen] = []
    try:
        store, uri = milvus(work)
        procs.append(store)
        procs.append(node(work, "head", args.cpus, port=head_port))
        results = {}
        for nodes in (1, 2):
            if nodes == 2:
                procs.append(node(work, "node2", args.cpus, head=address, cores={1} if args.pin else None))
                time.sleep(2)
            r = results[nodes] = run(folder, uri, f"nodes{nodes}", address, args.backend, work)
            t = r["totals"]
            r["after"] = t["files"] / (t["seconds"] - t["first_row_s"])
            print(f"{nodes} node(s): {r['wall']:.1f} s, {t['files'] / r['wall']:.0f} files/s, first row "
                  f"{t['first_row_s']} s, {r['after']:.0f} files/s after it, rows by encoder node "
                  f"{sorted(t['rows_by_encoder_node'].values())}", flush=True)
        if args.files <= 16384:
            same = ids(uri, "nodes1") == ids(uri, "nodes2")
            print(f"same ids in both collections: {same}")
        print(f"two nodes / one: files/s {results[1]['wall'] / results[2]['wall']:.2f}x end to end, "
              f"{results[2]['after'] / results[1]['after']:.2f}x after the first row")
    finally:
        for proc in reversed(procs):
            kill(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
