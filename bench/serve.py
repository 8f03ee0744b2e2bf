"""`ingest serve` (issue 47): /search latency with one client and with 32, /v1/embeddings batching (64 concurrent
one-text requests against one 64-text request), `ingest search` end to end as the old figure, and the HTTP stack's
own cost (uvicorn + Starlette against the standard library's ThreadingHTTPServer on a route that does nothing).

    python bench/serve.py [--store ingest.db] [--out bench/results/serve-DATE.json]

Without --store, the bundled samples are ingested into a temporary store first. The clients (httpx, threads)
run on the same cores as the server: on a 2-core box they take part of its CPU.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
QUERIES = ["purple octopus", "what did revenue do?", "lighthouse keeper", "parking rules", "yangtze river",
           "scanned letter", "quarterly report figures", "office memo about the move"]
MODEL = "all-MiniLM-L6-v2"


def machine() -> dict:
    info = Path("/proc/cpuinfo").read_text()
    flags = set(re.search(r"^flags\s*:(.*)$", info, re.M).group(1).split())
    return {"cpu": re.search(r"^model name\s*:\s*(.*)$", info, re.M).group(1), "cores": os.cpu_count(),
            "avx2": "avx2" in flags, "avx512f": "avx512f" in flags, "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d")}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 2)


def start(store: str, work: Path) -> tuple[subprocess.Popen, str]:
    err = open(work / "serve.err", "w")
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "serve", "--store", store, "--port", "0"], cwd=work,
                            stdout=err, stderr=err, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    url = None
    for _ in range(600):
        if found := re.search(r"listening on (http://\S+) ", (work / "serve.err").read_text()):
            url = found.group(1)
            break
        time.sleep(0.1)
    assert url, (work / "serve.err").read_text()
    with httpx.Client(base_url=url, timeout=120) as c:
        while c.get("/healthz").json()["embeddings"] != "ready":
            time.sleep(0.2)
    return proc, url


def search_one_client(url: str, n: int) -> dict:
    with httpx.Client(base_url=url, timeout=60) as c:
        for q in QUERIES:
            c.post("/search", json={"query": q, "k": 5}).raise_for_status()
        times = []
        for i in range(n):
            t = time.perf_counter()
            c.post("/search", json={"query": QUERIES[i % len(QUERIES)], "k": 5}).raise_for_status()
            times.append(time.perf_counter() - t)
    return {"requests": n, "p50_ms": pct(times, 0.5), "p90_ms": pct(times, 0.9), "p99_ms": pct(times, 0.99)}


def search_concurrent(url: str, clients: int, each: int) -> dict:
    times, errors = [], []

    def client(k: int) -> None:
        with httpx.Client(base_url=url, timeout=120) as c:
            for i in range(each):
                t = time.perf_counter()
                res = c.post("/search", json={"query": QUERIES[(k + i) % len(QUERIES)], "k": 5})
                times.append(time.perf_counter() - t)
                if res.status_code != 200:
                    errors.append(res.status_code)
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(client, range(clients)))
    wall = time.perf_counter() - started
    return {"clients": clients, "requests": len(times), "errors": len(errors), "p50_ms": pct(times, 0.5),
            "p99_ms": pct(times, 0.99), "p99_over_p50": round(pct(times, 0.99) / pct(times, 0.5), 2),
            "requests_per_s": round(len(times) / wall, 1)}


def embeddings(url: str, rounds: int) -> dict:
    """64 one-text requests at once against one 64-text request, texts/s, each the median of `rounds`. The
    clients are raw HTTP/1.1 on keep-alive sockets (asyncio, requests made up front): on 2 cores, a Python
    HTTP client's own CPU (httpx: ~1 ms a request) would be taken from the server it measures."""
    texts = [f"Sentence number {i} about a purple octopus who keeps the lighthouse." for i in range(64)]
    host, port = url.removeprefix("http://").split(":")
    one = asyncio.run(_posts(host, int(port), [{"model": MODEL, "input": texts}], rounds))
    many = asyncio.run(_posts(host, int(port), [{"model": MODEL, "input": t} for t in texts], rounds))
    batch, concurrent = 64 / one, 64 / many
    return {"rounds": rounds, "client": "raw HTTP/1.1, asyncio", "one_request_of_64_texts_per_s": round(batch, 1),
            "64_concurrent_requests_texts_per_s": round(concurrent, 1), "ratio": round(concurrent / batch, 2)}


async def _posts(host: str, port: int, bodies: list[dict], rounds: int) -> float:
    """The median seconds for every body POSTed to /v1/embeddings at once, each on its own connection."""
    conns = [await asyncio.open_connection(host, port) for _ in bodies]
    requests = []
    for body in bodies:
        data = json.dumps(body).encode()
        requests.append(b"POST /v1/embeddings HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n" % len(data) + data)

    async def post(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], request: bytes) -> None:
        reader, writer = conn
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace").splitlines()[0])
        size = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        await reader.readexactly(size)
    times = []
    for n in range(rounds + 1):                      # the first round warms up
        t = time.perf_counter()
        await asyncio.gather(*(post(c, r) for c, r in zip(conns, requests)))
        if n:
            times.append(time.perf_counter() - t)
    for _, writer in conns:
        writer.close()
    return statistics.median(times)


def old_search(store: str, runs: int) -> dict:
    times = []
    for i in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "ingest.cli", "search", QUERIES[i % len(QUERIES)], "--json", "--store",
                        store], check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        times.append(time.perf_counter() - t)
    return {"runs": runs, "p50_ms": pct(times, 0.5)}


def stacks(url: str, n: int) -> dict:
    """/healthz (a route that does nothing) on uvicorn + Starlette, and the same answer from the standard
    library's ThreadingHTTPServer; and what importing the stack costs."""
    body = b'{"status": "ok"}'

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass
    std = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=std.serve_forever, daemon=True).start()
    out = {}
    for name, base in (("uvicorn_starlette", url), ("stdlib_threading", f"http://127.0.0.1:{std.server_port}")):
        with httpx.Client(base_url=base, timeout=60) as c:
            for _ in range(50):
                c.get("/healthz")
            times = []
            for _ in range(n):
                t = time.perf_counter()
                c.get("/healthz").raise_for_status()
                times.append(time.perf_counter() - t)
        out[f"{name}_healthz_p50_ms"] = pct(times, 0.5)
    std.shutdown()
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import uvicorn, starlette.applications, starlette.routing"], check=True)
    out["import_uvicorn_starlette_ms"] = round((time.perf_counter() - t) * 1000, 1)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import http.server"], check=True)
    out["import_stdlib_http_server_ms"] = round((time.perf_counter() - t) * 1000, 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", help="an ingested store (default: the samples, ingested into a temporary one)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / f"serve-{time.strftime('%Y-%m-%d')}.json")
    ap.add_argument("--requests", type=int, default=300)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ingest-serve-bench-"))
    store = args.store and str(Path(args.store).resolve())
    if store is None:
        store = str(work / "samples.db")
        subprocess.run([sys.executable, "-m", "ingest.cli", "run", str(ROOT / "samples"), "--store", store, "--quiet"],
                       check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=work)     # its report beside the store
    old = old_search(store, 5)
    proc, url = start(store, work)
    try:
        result = {"machine": machine(), "store": "samples" if not args.store else "given",
                  "search_one_client": search_one_client(url, args.requests),
                  "search_32_clients": search_concurrent(url, 32, max(1, args.requests // 32)),
                  "embeddings": embeddings(url, 5), "stacks": stacks(url, args.requests)}
    finally:
        proc.terminate()
        proc.wait(60)
    result["ingest_search_end_to_end"] = old
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
