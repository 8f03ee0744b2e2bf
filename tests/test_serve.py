"""Issue 47: `ingest serve` as a real process on a real socket, with the real clients (openai, LangChain's
OpenAIEmbeddings, httpx): search as `ingest search --json`, embeddings equal to `encode_multi_process`'s, status,
metrics, --watch, the API key rule, a fuzz of malformed requests, SIGTERM. One server for the module (--watch on
its docs folder, an API key from the environment); the absent store and the key rule start their own."""
from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

from conftest import cli_env, ingest, sqlite

KEY = "test-key-4f1c9a"
MODEL = "all-MiniLM-L6-v2"
DOCS = {"lighthouse.txt": "The lighthouse keeper climbs the spiral stairs every evening to light the lamp. " * 6,
        "revenue.txt": "Revenue for fiscal 2019 grew 8 percent to 6.5 billion dollars, driven by subscriptions. " * 6,
        "octopus.md": "# Mascot\n\nOur mascot is a purple octopus named Inky who juggles teacups. " * 6}
TEXTS = ["a purple octopus", "Revenue grew in 2019.", "The lamp is lit every evening by the keeper.", "x",
         "Penguins huddle together through the polar night, " * 8]


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    work: Path

    def log(self) -> str:
        return (self.work / "serve.err").read_text(errors="replace")[-3000:]


def start(work: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Server:
    """`ingest serve --port 0 ARGS` in `work`; once it says where it listens."""
    err = open(work / "serve.err", "w")
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "serve", "--port", "0", *args], cwd=work,
                            env={**cli_env(), **(env or {})}, stdout=err, stderr=err, start_new_session=True)
    err.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if found := re.search(r"listening on (http://\S+) ", (work / "serve.err").read_text(errors="replace")):
            return Server(proc, found.group(1), work)
        time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"serve did not start: {(work / 'serve.err').read_text(errors='replace')[-3000:]}")


def until(what: str, check, timeout: float = 120.0, pause: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (got := check()) is not None:
            return got
        time.sleep(pause)
    raise AssertionError(f"timed out waiting for {what}")


def stop(server: Server, signum: int = signal.SIGTERM) -> int:
    if server.proc.poll() is None:
        os.kill(server.proc.pid, signum)
    try:
        return server.proc.wait(timeout=60)
    finally:
        if server.proc.poll() is None:
            os.killpg(server.proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    work = tmp_path_factory.mktemp("serve")
    (work / "docs").mkdir()
    for name, text in DOCS.items():
        (work / "docs" / name).write_text(text)
    srv = start(work, "--store", "store.db", "--watch", "docs", "--debounce", "0.3", "--quiet",
                env={"INGEST_API_KEY": KEY})
    with httpx.Client(base_url=srv.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        until("the first sync and the models", lambda: True if c.get("/healthz").json() == {
            "status": "ok", "search": "ready", "embeddings": "ready", "watching": True} else None, pause=0.3)
    yield srv
    stop(srv)


@pytest.fixture(scope="module")
def client(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        yield c


def manifest(work: Path) -> list[tuple]:
    with sqlite(f"file:{work / 'store.db.documents.manifest.sqlite'}?mode=ro", uri=True) as con:
        return sorted(con.execute("SELECT * FROM files").fetchall())


@pytest.mark.slow
def test_search_answers_as_ingest_search_json(server: Server, client: httpx.Client) -> None:
    got = client.post("/search", json={"query": "purple octopus juggling", "k": 3})
    assert got.status_code == 200, got.text
    cli = ingest("search", "purple octopus juggling", "-k", "3", "--json", "--store", "store.db", cwd=server.work)
    assert cli.rc == 0, cli.stderr
    want = json.loads(cli.stdout)
    hits = got.json()["hits"]
    assert [(h["source"], h["chunk"]) for h in hits] == [(h["source"], h["chunk"]) for h in want]
    assert hits[0]["source"] == "octopus.md" and got.json()["mode"] == "dense"
    assert np.allclose([h["score"] for h in hits], [h["score"] for h in want], atol=1e-4)
    bm25 = client.post("/search", json={"query": "subscriptions", "k": 1, "mode": "bm25"}).json()
    assert bm25["hits"][0]["source"] == "revenue.txt"


@pytest.mark.slow
def test_openai_and_langchain_clients_get_the_pools_vectors(server: Server, client: httpx.Client) -> None:
    from langchain_openai import OpenAIEmbeddings
    from openai import OpenAI

    from ingest.api import encode_multi_process

    backend = client.get("/status").json()["backend"]
    want = encode_multi_process(TEXTS, backend=backend, normalize_embeddings=True)
    openai = OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0)
    got = openai.embeddings.create(model=MODEL, input=TEXTS)              # the client asks for base64
    assert [d.index for d in got.data] == list(range(len(TEXTS))) and got.usage.prompt_tokens > len(TEXTS)
    assert np.allclose(np.array([d.embedding for d in got.data]), want, atol=2e-4)
    floats = openai.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="float")
    assert np.allclose(floats.data[0].embedding, want[0], atol=2e-4)
    lc = OpenAIEmbeddings(model=MODEL, base_url=f"{server.url}/v1", api_key=KEY, check_embedding_ctx_length=False)
    assert np.allclose(lc.embed_documents(TEXTS), want, atol=2e-4)
    assert np.allclose(lc.embed_query(TEXTS[1]), want[1], atol=2e-4)
    assert client.get("/v1/models").json()["data"][0]["id"].endswith(MODEL)


@pytest.mark.slow
def test_concurrent_embeddings_are_batched_and_each_gets_its_own_rows(server: Server, client: httpx.Client) -> None:
    def one(i: int) -> list[float]:
        res = client.post("/v1/embeddings", json={"model": MODEL, "input": TEXTS[i % len(TEXTS)]})
        assert res.status_code == 200, res.text
        return res.json()["data"][0]["embedding"]
    together = client.post("/v1/embeddings", json={"model": MODEL, "input": TEXTS}).json()["data"]
    with ThreadPoolExecutor(16) as pool:
        rows = list(pool.map(one, range(48)))
    for i, row in enumerate(rows):
        assert np.allclose(row, together[i % len(TEXTS)]["embedding"], atol=2e-4)
    metrics = client.get("/metrics").text
    batches = int(re.search(r"^ingest_serve_embed_batch_texts_count (\d+)", metrics, re.M).group(1))
    assert batches < 48 + 10, "one-text requests were batched together"


@pytest.mark.slow
def test_status_and_metrics(server: Server, client: httpx.Client) -> None:
    got = client.get("/status").json()
    cli = ingest("status", "--json", "--store", "store.db", cwd=server.work)
    want = json.loads(cli.stdout)
    for key in ("files", "chunks", "model", "backend", "dim", "by_status", "chunking", "store", "collection"):
        assert got[key] == want[key], key
    metrics = client.get("/metrics").text
    assert re.search(r'^ingest_serve_requests_total\{route="status",status="200"\} [1-9]', metrics, re.M)
    assert re.search(r'^ingest_serve_request_seconds_bucket\{route="status",le="\+Inf"\} [1-9]', metrics, re.M)
    assert re.search(r"^ingest_serve_watch_syncs_total [1-9]", metrics, re.M)
    assert re.search(r'^ingest_serve_watch_files_total\{status="ingested"\} 3$', metrics, re.M)


def _malformed(rng: random.Random, i: int) -> tuple[str, str, dict, bytes]:
    """(method, path, headers, body) of one bad request; every one is the client's to fix."""
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    j = lambda o: json.dumps(o).encode()     # noqa: E731
    bad_bodies = [b"", b"{", b"nul", b"[1,2]", b'"text"', b"\xff\xfe\x00", b"{\"query\": }", b"[" * 50000 + b"]" * 50000,
                  j({"query": ""}), j({"query": "   "}), j({"query": 5}), j({"query": None}), j({"query": ["a"]}),
                  j({"query": "a", "k": 0}), j({"query": "a", "k": 101}), j({"query": "a", "k": -3}),
                  j({"query": "a", "k": "5"}), j({"query": "a", "k": 2.5}), j({"query": "a", "k": True}),
                  j({"query": "a", "mode": "fuzzy"}), j({"query": "a", "mode": 3}), j({"query": "q" * 5000}),
                  b'{"query": "\\ud800"}', b'{"query": "a", "k": NaN}', b'{"query": "a", "k": 1e999}']
    bad_embeds = [j({"model": MODEL}), j({"model": MODEL, "input": ""}), j({"model": MODEL, "input": []}),
                  j({"model": MODEL, "input": [""]}), j({"model": MODEL, "input": [1, 2, 3]}),
                  j({"model": MODEL, "input": [[1, 2]]}), j({"model": MODEL, "input": {"a": 1}}),
                  j({"model": MODEL, "input": ["a", None]}), j({"model": "text-embedding-3-small", "input": "a"}),
                  j({"input": "a"}), j({"model": 7, "input": "a"}), j({"model": MODEL, "input": "a", "encoding_format": "int8"}),
                  j({"model": MODEL, "input": "a", "dimensions": 12}), j({"model": MODEL, "input": ["a"] * 2049}),
                  j({"model": MODEL, "input": "word " * 400}), b'{"model": "' + MODEL.encode() + b'", "input": "\\udfff"}',
                  b'{"model": "' + MODEL.encode() + b'", "input": ["ok", "\\ud83d"]}']
    kind = i % 20
    if kind < 8:
        return "POST", "/search", auth, rng.choice(bad_bodies)
    if kind < 16:
        return "POST", "/v1/embeddings", auth, rng.choice(bad_embeds)
    if kind < 19:
        return rng.choice([("GET", "/search", auth, b""), ("DELETE", "/status", auth, b""), ("GET", "/nope", auth, b""),
                           ("POST", "/healthz", auth, b"{}"), ("GET", "/status", {}, b""),
                           ("GET", "/metrics", {"Authorization": "Bearer wrong"}, b""),
                           ("POST", "/search", {"Authorization": KEY}, j({"query": "a"})),
                           ("PUT", "/v1/embeddings", auth, b"{}")])
    return "POST", rng.choice(["/search", "/v1/embeddings"]), auth, b" " * (4 * 2**20 + rng.randint(1, 1000))


@pytest.mark.slow
def test_a_fuzz_of_malformed_requests_gets_4xx_lines_and_changes_nothing(server: Server, client: httpx.Client) -> None:
    before, status = manifest(server.work), client.get("/status").json()
    rng = random.Random(47)
    requests = [_malformed(rng, i) for i in range(1200)]

    def send(req: tuple[str, str, dict, bytes]) -> tuple[int, str, str]:
        method, path, headers, body = req
        chunked = len(body) > 2**22 and req[0] == "POST" and len(body) % 2       # no Content-Length: read and cut
        res = bare.request(method, path, headers=headers, content=iter([body]) if chunked else body)
        return res.status_code, res.text, path
    with httpx.Client(base_url=server.url, timeout=60) as bare, ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(send, requests))
    for code, text, path in answers:
        assert 400 <= code < 500, (code, text, path)
        assert text.endswith("\n") and text.count("\n") == 1 and json.loads(text)["error"]["message"], text
    assert {code for code, _, _ in answers} >= {400, 401, 404, 405, 413}
    for garbage in (b"\x00\x01\x02\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n", b"POST /search HTTP/1.1\r\nContent-Length: x\r\n\r\n"):
        host, port = server.url.rsplit("/", 1)[-1].split(":")
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(garbage)
            s.recv(1000)
    assert client.get("/healthz").status_code == 200
    assert manifest(server.work) == before
    after = client.get("/status").json()
    assert (after["files"], after["chunks"], after["last_run"]) == (status["files"], status["chunks"], status["last_run"])
    assert server.proc.poll() is None


@pytest.mark.slow
def test_watch_a_new_file_is_found_by_search_within_3_s(server: Server, client: httpx.Client) -> None:
    (server.work / "docs" / "kiwi.txt").write_text("Kiwi birds cannot fly and forage for worms at night. " * 5)
    written = time.monotonic()

    def found() -> bool | None:
        hits = client.post("/search", json={"query": "flightless kiwi birds forage for worms", "k": 1}).json()["hits"]
        return True if hits and hits[0]["source"] == "kiwi.txt" else None
    until("kiwi.txt in the search results", found, timeout=30, pause=0.05)
    assert time.monotonic() - written <= 3.0, f"found after {time.monotonic() - written:.1f} s"


@pytest.mark.slow
def test_sigterm_finishes_the_request_in_flight_and_exits_143(server: Server, client: httpx.Client) -> None:
    texts = [f"{i} " + TEXTS[4] for i in range(512)]
    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(client.post, "/v1/embeddings", json={"model": MODEL, "input": texts})
        time.sleep(0.3)
        code = stop(server)
        res = pending.result()
    assert res.status_code == 200 and len(res.json()["data"]) == 512, res.text
    assert code == 143, server.log()
    report = json.loads((server.work / "store.db.report.json").read_text())
    assert report["totals"]["exit_code"] == 0 and {f["path"] for f in report["files"]} >= {"kiwi.txt"}


@pytest.mark.slow
def test_an_absent_store_answers_503_then_recovers_and_keys_are_required_off_loopback(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "ingest.cli", "serve", "--host", "0.0.0.0", "--port", "0",
                          "--store", "store.db"], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "API key" in res.stderr, res.stderr
    (tmp_path / "key").write_text("s3cret\n")
    (tmp_path / "pg.toml").write_text("[store]\ntimeout_s = 2\n")        # a server that is not there: said soon
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text(DOCS["lighthouse.txt"])
    srv = start(tmp_path, "--host", "0.0.0.0", "--api-key-file", "key", "--config", "pg.toml", "--store", "postgresql://u:hunter2@127.0.0.1:1/db")
    try:
        url = srv.url.replace("0.0.0.0", "127.0.0.1")
        assert httpx.get(url + "/healthz").status_code == 200
        assert httpx.post(url + "/search", json={"query": "lamp"}).status_code == 401
        res = httpx.post(url + "/search", json={"query": "lamp"}, headers={"Authorization": "Bearer s3cret"}, timeout=120)
        assert res.status_code == 503 and "hunter2" not in res.text, res.text
    finally:
        assert stop(srv, signal.SIGINT) == 130
    assert "hunter2" not in srv.log()
    srv = start(tmp_path, "--store", "store.db")
    try:
        res = httpx.post(srv.url + "/search", json={"query": "lamp"}, timeout=60)
        assert res.status_code == 503 and "no store at" in res.json()["error"]["message"], res.text
        assert ingest("run", "docs", "--store", "store.db", "--quiet", cwd=tmp_path).rc == 0
        res = httpx.post(srv.url + "/search", json={"query": "lighthouse lamp", "k": 1}, timeout=120)
        assert res.status_code == 200 and res.json()["hits"][0]["source"] == "a.txt", res.text
    finally:
        assert stop(srv) == 143, srv.log()


def test_without_the_serve_extra_one_line_says_what_to_install(tmp_path: Path) -> None:
    from test_missing_extras import SHIM

    (tmp_path / "sitecustomize.py").write_text(SHIM)
    env = {**cli_env(), "INGEST_TEST_BLOCK": "uvicorn", "PYTHONPATH": f"{tmp_path}{os.pathsep}{cli_env()['PYTHONPATH']}"}
    res = subprocess.run([sys.executable, "-m", "ingest.cli", "serve", "--store", "store.db"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert "pip install 'ingest[serve]'" in res.stderr and not (tmp_path / "store.db").exists()
