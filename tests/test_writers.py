"""Issue 10, part 3: rows are written by writer processes, column-wise, off the supervisor's GIL; a
Milvus Lite store is served by a host process. Real Milvus (Lite and a server), real kills."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from conftest import cli_env, server_rows
from test_incremental import SENTENCES
from test_server_uri import run_on

# The null backend: the encoder is ready at once, so the slow loader paces the run and flushes (every
# 5 s) record files mid-run; the rows' ids, which these tests compare, do not depend on the vectors.
WRITERS = ('[model]\nbackend = "null"\n[chunking]\nchunk_tokens = 24\noverlap_tokens = 4\n[run]\n'
           'max_files_in_flight = 4\n[store]\nwriters = 2\nbatch_size = 4\ntimeout_s = 20\n'
           '[loaders]\nplugins = ["fault_loaders"]\n[loaders.txt]\nworkers = 1\n')   # one slow file at a time: the
#                                                  kills land mid-run (the null backend would load on every core)


def _columns(n: int, dim: int = 8):
    from ingest.store.schema import Columns

    rng = np.random.default_rng(7)
    texts = [f"row {i}: naïve café, 北京, emoji 🦦🌊, quote \" and \\ slash" * (1 + i % 3) for i in range(n)]
    return Columns([f"id{i}" for i in range(n)], rng.standard_normal((n, dim)).astype(np.float32), texts,
                   [f"dir/ü{i % 2}.txt" for i in range(n)], [i % 4 for i in range(n)], list(range(n)),
                   ["txt"] * n, ["h" * 64] * n, [f"Title {i % 2}" for i in range(n)], ["Part I > Risks"] * n,
                   ["text"] * n, ["1.0,2.0,3.0,4.0"] * n, [f"context\n{t}" for t in texts])


@pytest.mark.parametrize("where", ["lite", "server"])
def test_column_upsert_round_trip_and_refusals(where: str, tmp_path: Path, milvus_uri: str) -> None:
    from ingest.store import Store, StoreRejected

    store = Store(str(tmp_path / "store.db"), "cols") if where == "lite" else Store(milvus_uri, "cols")
    store.lock()
    store.serve()                             # Lite: served by its host process; a server: nothing to do
    try:
        store.drop()
        store.ensure_collection("m", 8, "torch")
        sent = _columns(300)
        store.upsert_columns(sent)
        store.flush()
        got = {r["id"]: r for r in store.rows(["id", "vector", "text", "source", "page", "chunk", "format",
                                               "file_hash"])}
        assert sorted(got) == sorted(sent.ids)
        for i, key in enumerate(sent.ids):
            row = got[key]
            assert np.allclose(row["vector"], sent.vectors[i])
            assert (row["text"], row["source"], row["page"], row["chunk"], row["format"], row["file_hash"]) == \
                (sent.texts[i], sent.sources[i], sent.pages[i], sent.chunks[i], sent.formats[i], sent.file_hashes[i])
        bad = _columns(1)
        with pytest.raises(StoreRejected, match="store refused"):         # a value INT64 cannot hold
            store.upsert_columns(type(bad)(**{**bad.__dict__, "pages": [2 ** 70]}))
        with pytest.raises(StoreRejected, match="store refused"):         # the server's own check: too long
            store.upsert_columns(type(bad)(**{**bad.__dict__, "texts": ["x" * 70_000]}))
        store.drop()
    finally:
        host = store._host
        store.close()
    if host is not None:
        assert not host.alive()


_HOLD = """
import sys, time
from ingest.store import Store
store = Store(sys.argv[1], "documents")
store.lock()
store.serve()
print(store._host.process.pid, flush=True)
time.sleep(600)
"""


def test_lite_host_is_gone_when_its_run_is_killed_and_the_store_stays_single_run(tmp_path: Path) -> None:
    db = str(tmp_path / "store.db")
    proc = subprocess.Popen([sys.executable, "-c", _HOLD, db], stdout=subprocess.PIPE, text=True, env=cli_env())
    try:
        host = psutil.Process(int(proc.stdout.readline()))
        res = subprocess.run([sys.executable, "-m", "ingest.cli", "run", str(tmp_path), "--store", db, "--quiet"],
                             cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "in use" in res.stderr and res.stderr.strip().count("\n") == 0, res.stderr
    finally:
        proc.kill()
        proc.wait()
    gone, alive = psutil.wait_procs([host], timeout=2)
    assert not alive, "the Lite host outlived its run"


def _docs(work: Path, n: int = 16) -> None:
    (work / "docs").mkdir(parents=True)
    for i in range(n):
        (work / "docs" / f"d{i}.slowtxt").write_text(" ".join([SENTENCES[i % len(SENTENCES)]] * 5) + f" file {i}.")
    (work / "config.toml").write_text(WRITERS)


def _recorded(uri: str, collection: str) -> set[str]:
    """Sources the server manifest records."""
    from ingest.store.server_manifest import companion_name
    from ingest.store import Store

    store = Store(uri, collection)
    try:
        if not store.call("look", "has_collection", companion_name(collection)):
            return set()
        rows = store.call("read", "query", companion_name(collection), filter='key like "file:%"',
                          output_fields=["source"])
        return {r["source"] for r in rows}
    finally:
        store.close()


def _start(work: Path, uri: str, collection: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", uri, "--collection",
                             collection, "--report", "report.json", "--quiet"], cwd=work,
                            env={**cli_env(), "INGEST_TEST_SLOW_S": "0.6"}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _until(proc: subprocess.Popen, ready, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, f"the run ended first ({proc.poll()})"
        time.sleep(0.2)


def _by_source(rows: list[dict]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in rows:
        out.setdefault(r["source"], set()).add(r["id"])
    return out


@pytest.mark.slow
def test_parallel_writers_survive_a_killed_run_and_the_rerun_matches_a_clean_run(
        milvus_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INGEST_TEST_SLOW_S", "0")      # the clean run and the rerun load at full speed (_start: 0.6 s)
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    _docs(clean)
    _docs(crashed)
    res = run_on(milvus_uri, "w_clean", clean, config=WRITERS)
    assert res.rc == 0, res.stderr
    expected = _by_source(server_rows(milvus_uri, "w_clean"))
    assert len(expected) == 16 and sum(map(len, expected.values())) == res.report["totals"]["chunks"]

    for ready in (lambda: server_rows(milvus_uri, "w_crash"),           # rows in, nothing recorded yet
                  lambda: len(_recorded(milvus_uri, "w_crash")) >= 3):   # mid-run
        proc = _start(crashed, milvus_uri, "w_crash")
        try:
            _until(proc, ready)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        recorded, stored = _recorded(milvus_uri, "w_crash"), _by_source(server_rows(milvus_uri, "w_crash"))
        assert len(recorded) < 16                                        # the kill landed mid-run
        assert {s: stored.get(s) for s in recorded} == {s: expected[s] for s in recorded}   # recorded = complete
    resumed = run_on(milvus_uri, "w_crash", crashed, config=WRITERS)
    assert resumed.rc == 0, resumed.stderr
    ids = [r["id"] for r in server_rows(milvus_uri, "w_crash")]
    assert len(ids) == len(set(ids))                                     # no duplicates
    assert _by_source(server_rows(milvus_uri, "w_crash")) == expected   # nothing missing


def _writer_processes(run: psutil.Process, port: int) -> list[psutil.Process]:
    """The run's children with a connection to the server: its writer processes."""
    out = []
    for child in run.children(recursive=True):
        try:
            if any(c.raddr and c.raddr.port == port for c in child.net_connections("tcp")):
                out.append(child)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow
def test_a_killed_writer_process_costs_nothing(milvus_uri: str, tmp_path: Path) -> None:
    _docs(tmp_path, n=10)
    port = int(milvus_uri.rsplit(":", 1)[1])
    proc = _start(tmp_path, milvus_uri, "w_kill")
    try:
        run = psutil.Process(proc.pid)
        _until(proc, lambda: _writer_processes(run, port) and _recorded(milvus_uri, "w_kill"))
        victim = _writer_processes(run, port)[0]
        victim.kill()
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, err
    assert not victim.is_running() or victim.status() == psutil.STATUS_ZOMBIE
    rows = server_rows(milvus_uri, "w_kill")
    assert len(_by_source(rows)) == 10 and len({r["id"] for r in rows}) == len(rows)
    assert len(rows) == json.loads((tmp_path / "report.json").read_text())["totals"]["chunks"]
