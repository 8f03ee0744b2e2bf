"""Shared helpers: run the real `ingest` CLI in a subprocess and read what it wrote."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from pg_server import pg_server, pg_uri  # noqa: F401  (fixtures: one PostgreSQL + pgvector a session)

TESTS = Path(__file__).parent
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Tests that need an external program skip, saying so, where it is absent (.ci/run installs LibreOffice).
needs_soffice = pytest.mark.skipif(not (shutil.which("soffice") or shutil.which("libreoffice")),
                                   reason="needs LibreOffice (soffice on PATH) to build or convert .doc/.ppt")


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    report: dict | None

    def by_path(self) -> dict[str, dict]:
        return {f["path"]: f for f in self.report["files"]}


def cli_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(TESTS))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


@contextmanager
def sqlite(path: object, **kw: object) -> Iterator[sqlite3.Connection]:
    """A connection to the SQLite file `path` that commits and closes on leaving. sqlite3's own `with` only
    commits: the connection, in a cycle with its statement cache, closes at some later GC, and its WAL and
    shared-memory files then vanish under whatever is removing the folder (CI: rmtree's FileNotFoundError)."""
    con = sqlite3.connect(path, **kw)
    try:
        with con:
            yield con
    finally:
        con.close()


def ingest(*args: str, cwd: Path, timeout: float = 600, config: str | None = None) -> Result:
    """Run `ingest ARGS` (with an optional config.toml text) and load the report if it wrote one."""
    argv = [sys.executable, "-m", "ingest.cli", *args]
    if config is not None:
        (cwd / "config.toml").write_text(config)
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=cli_env())
    report_path = cwd / "report.json"
    report = json.loads(report_path.read_text()) if report_path.exists() and "run" in args else None
    return Result(proc.returncode, proc.stdout, proc.stderr, report)


def run_on(uri: str, collection: str, cwd: Path, *extra: str, config: str | None = None) -> Result:
    """`ingest run docs` in `cwd` on a server collection, report in cwd/report.json."""
    (cwd / "report.json").unlink(missing_ok=True)
    return ingest("run", "docs", "--store", uri, "--collection", collection, "--report", "report.json", "--quiet",
                  *extra, cwd=cwd, config=config)


def run(folder: Path, cwd: Path, *extra: str, config: str | None = None, timeout: float = 600) -> Result:
    (cwd / "report.json").unlink(missing_ok=True)
    return ingest("run", str(folder), "--store", str(cwd / "store.db"), "--report", str(cwd / "report.json"),
                  "--quiet", *extra, cwd=cwd, config=config, timeout=timeout)


def search(cwd: Path, query: str, k: int = 5) -> list[dict]:
    res = ingest("search", query, "-k", str(k), "--json", "--store", str(cwd / "store.db"), cwd=cwd)
    assert res.rc == 0, res.stderr
    return json.loads(res.stdout)


def wait_recorded(work: Path, source: str, proc: subprocess.Popen | None = None, timeout: float = 300) -> None:
    """Wait until the manifest of `work`/store.db records `source` (its rows are then durably in the store);
    fail at once if `proc`, the run, ends first."""
    db = work / "store.db.documents.manifest.sqlite"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        if db.exists():
            with sqlite(db) as con:
                try:
                    if con.execute("SELECT 1 FROM files WHERE source=?", (source,)).fetchone():
                        return
                except sqlite3.OperationalError:
                    pass
        time.sleep(0.3)
    if proc is not None and proc.poll() is not None:
        raise AssertionError(f"the run ended (exit code {proc.returncode}) before {source} was recorded: "
                             f"{proc.communicate()[1][-2000:]}")
    raise AssertionError(f"{source} was never recorded")


_DUMP = """
import json, sys
from ingest.store import Store
store = Store(sys.argv[1], "documents")
print(json.dumps(store.rows(["id", "source", "file_hash"]) if store.exists() else []))
"""


def store_rows(cwd: Path) -> list[dict]:
    """Every row's id, source and file_hash, read by a separate process (Milvus Lite locks its file)."""
    proc = subprocess.run([sys.executable, "-c", _DUMP, str(cwd / "store.db")], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_rows(store: object, files: dict[str, tuple[str, int]]) -> None:
    """Rows of each source, (version hash, chunks), upserted in batches of 256 files and flushed, with constant
    8-wide vectors, as a writer process sends them."""
    import numpy as np

    from ingest.store.rows import Row, Rows
    from ingest.store.writers import Ack, Batch, Segment, upsert

    segments = [Segment(source, "txt", version, 0,
                        Rows.of([Row(None, f"{source} {version} chunk {i}", "", "", "text", "", "") for i in range(n)]),
                        np.full((n, 8), 0.5, dtype=np.float32)) for source, (version, n) in files.items()]
    for i in range(0, len(segments), 256):
        assert isinstance(upsert(store, Batch(tuple(segments[i:i + 256]))), Ack)
    store.flush()


def row_ids(cwd: Path) -> list[str]:
    return [r["id"] for r in store_rows(cwd)]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with the most slow tests first, each module's tests in their own order: pytest-xdist's
    loadfile hands modules out in this order, so the long ones do not come last to one worker while the
    other waits."""
    slow: dict[str, int] = {}
    for item in items:
        slow[item.nodeid.split("::")[0]] = slow.get(item.nodeid.split("::")[0], 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.nodeid.split("::")[0]])       # stable: a module's order is kept


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (pyproject's addopts): a pytest worker a usable core and one more, at most 4. Two workers left
    the two cores of the CI box idle 31% of the time (tests wait on servers, kills and their processes' start);
    every test starts processes of its own, and the kill tests pace themselves, so no more than that."""
    from ingest.workers.limits import usable_cores
    return max(1, min(4, usable_cores() + 1))


@pytest.fixture(scope="session", autouse=True)
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of ONNX exports for the session (every run and pool exports the model once at most),
    never the user's own (~/.cache/ingest)."""
    cache = tmp_path_factory.mktemp("ingest-cache")
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # pytest-xdist: the run's workers share the exports (an export holds a flock: the model is exported
        # once); the vector cache stays each worker's own
        shared = tmp_path_factory.getbasetemp().parent / "onnx-exports"
        shared.mkdir(exist_ok=True)
        (cache / "onnx").symlink_to(shared, target_is_directory=True)
    os.environ.setdefault("INGEST_CACHE_DIR", str(cache))
    return Path(os.environ["INGEST_CACHE_DIR"])


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """An empty folder with a short path, for a run's TMPDIR: a Unix socket's path (the Lite host's, in a
    folder made there) holds at most 107 bytes, and pytest-xdist makes tmp_path longer (popen-gwN/)."""
    folder = Path(tempfile.mkdtemp(prefix="ingest-t-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "docs").mkdir()
    return tmp_path


# -- a Milvus server (milvus-lite server) on loopback ------------------------------------------
@dataclass
class MilvusServer:
    uri: str
    process: subprocess.Popen
    data_dir: Path
    port: int

    def stop(self) -> None:
        """Terminate the server (kill it if it does not go within 10 s); safe after a kill."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_milvus(data_dir: Path, port: int | None = None, timeout: float = 60) -> MilvusServer:
    """Start `milvus-lite server` on 127.0.0.1 (a free port unless given); return once it accepts connections."""
    if port is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    log = open(f"{data_dir}.log", "ab")
    process = subprocess.Popen([str(Path(sys.executable).parent / "milvus-lite"), "server", "--data-dir", str(data_dir),
                                "--host", "127.0.0.1", "--port", str(port)],
                               stdout=log, stderr=subprocess.STDOUT, env=cli_env())
    log.close()
    server = MilvusServer(f"http://127.0.0.1:{port}", process, data_dir, port)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return server
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"milvus-lite server did not start on port {port}; see {data_dir}.log")


@pytest.fixture(scope="session")
def milvus_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URI of one Milvus server shared by the whole session: give each test its own --collection."""
    server = start_milvus(tmp_path_factory.mktemp("milvus") / "data")
    yield server.uri
    server.stop()


@pytest.fixture
def milvus_server() -> Iterator[Callable[..., MilvusServer]]:
    """A factory `start(data_dir, port=None)` of servers the test owns (and may kill); all stop at teardown."""
    started: list[MilvusServer] = []

    def start(data_dir: Path, port: int | None = None) -> MilvusServer:
        started.append(start_milvus(data_dir, port))
        return started[-1]

    yield start
    for server in started:
        server.stop()


# -- one Ray cluster for the session ----------------------------------------------------------
@pytest.fixture(scope="session")
def ray_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The address of a Ray cluster (`ray start --head` on loopback) that every `--engine ray` run of the
    session joins: Ray starts once. 4 logical CPUs, so an encode actor, a writer and load tasks fit on 2 cores.
    It runs with --block in a process group of its own, which teardown kills: never `ray stop`, which stops
    every Ray cluster of the machine's user (another test session's too)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray = str(Path(sys.executable).parent / "ray")
    # Token auth off: the cluster listens on this machine only, for the session's drivers.
    env = dict(cli_env(), RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="disabled")
    log = tmp_path_factory.mktemp("ray") / "ray-start.log"
    with open(log, "wb") as out:
        head = subprocess.Popen([ray, "start", "--head", "--block", f"--port={port}", "--num-cpus=4",
                                 "--num-gpus=0", "--include-dashboard=false", "--object-store-memory=200000000",
                                 "--disable-usage-stats"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    deadline = time.monotonic() + 180
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if head.poll() is not None or time.monotonic() > deadline:
            _kill_group(head)
            raise RuntimeError(f"ray start did not start a cluster; see {log}")
        time.sleep(0.2)
    os.environ["INGEST_TEST_RAY_HEAD"] = str(head.pid)      # whose processes are this session's (pytest-xdist)
    yield f"127.0.0.1:{port}"      # Ray answers on the host's address too; drivers find it either way
    _kill_group(head)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group `proc` leads (start_new_session), as `ray stop --force` would kill its processes."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def ray_config(address: str, extra: str = "") -> str:
    """config.toml text for `ingest run` on the Ray engine at `address`."""
    return f'[run]\nengine = "ray"\n[ray]\naddress = "{address}"\n{extra}'


def server_rows(uri: str, collection: str) -> list[dict]:
    """Every row's id, source and file_hash of a server collection ([] if it does not exist)."""
    from ingest.store import Store

    store = Store(uri, collection)
    try:
        return store.rows(["id", "source", "file_hash"]) if store.exists() else []
    finally:
        store.close()
