"""Issue 9: a stalled or killed Milvus server stops the run with one line (exit 2) and a report;
the rerun resumes and ends with exactly the rows of a clean run. Real servers, real kills."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env, server_rows
from test_incremental import SENTENCES
from test_server_uri import run_on

CONFIG = ('[model]\nbackend = "null"\n[chunking]\nchunk_tokens = 24\noverlap_tokens = 4\n[run]\nmax_files_in_flight = 2\n'
          '[store]\ntimeout_s = 5\n[loaders]\nplugins = ["fault_loaders"]\n[loaders.txt]\nworkers = 1\n')
# one slow file at a time: the faulty run must still be writing when the first rows (its first seal) appear


def _docs(work: Path) -> None:
    (work / "docs").mkdir(parents=True)
    for i, s in enumerate(SENTENCES):
        (work / "docs" / f"d{i}.slowtxt").write_text(" ".join([s] * 4))
    (work / "config.toml").write_text(CONFIG)


def _run_until(work: Path, uri: str, strike) -> tuple[int, str, float]:
    """Start `ingest run`, call strike() once the first rows are in the store; (exit code, stderr,
    seconds from the strike to the exit)."""
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", uri, "--report",
                             "report.json", "--quiet"], cwd=work, env={**cli_env(), "INGEST_TEST_SLOW_S": "1.5"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not server_rows(uri, "documents"):
            assert proc.poll() is None and time.monotonic() < deadline, "no rows were written"
            time.sleep(0.3)
        strike()
        struck = time.monotonic()
        _, err = proc.communicate(timeout=120)
        return proc.returncode, err, time.monotonic() - struck
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_stalled_then_killed_server_stops_the_run_and_the_rerun_matches_a_clean_run(
        tmp_path: Path, milvus_server, monkeypatch) -> None:
    monkeypatch.setenv("INGEST_TEST_SLOW_S", "0")           # the clean run and the rerun load at full speed
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    _docs(clean)
    _docs(faulty)
    reference = milvus_server(tmp_path / "clean-data")
    res = run_on(reference.uri, "documents", clean, config=CONFIG)
    assert res.rc == 0, res.stderr
    expected = sorted(r["id"] for r in server_rows(reference.uri, "documents"))

    server = milvus_server(tmp_path / "data")
    rc, err, seconds = _run_until(faulty, server.uri, lambda: os.kill(server.process.pid, signal.SIGSTOP))
    os.kill(server.process.pid, signal.SIGCONT)
    assert rc == 2 and err.strip().count("\n") == 0 and "did not answer" in err, err
    assert seconds < 60
    report = json.loads((faulty / "report.json").read_text())
    assert "did not answer" in report["totals"]["stopped_by"]
    assert len(report["files"]) == len(SENTENCES)                 # every file has its line
    assert any(f["status"] == "failed" and f["error"].startswith("not written") for f in report["files"])

    rc, err, seconds = _run_until(faulty, server.uri, server.process.kill)
    assert rc == 2 and err.strip().count("\n") == 0, err
    assert seconds < 60

    server = milvus_server(server.data_dir, server.port)            # back on the same data
    resumed = run_on(server.uri, "documents", faulty, config=CONFIG)
    assert resumed.rc == 0, resumed.stderr
    ids = sorted(r["id"] for r in server_rows(server.uri, "documents"))
    assert ids == expected                                          # no duplicates, nothing missing


# -- issue 40: a server that restarts, drops the run's connections or stalls ------------------------------
# Tiny files on the null backend, loaded slowly enough (INGEST_TEST_SLOW_S) that the run is still writing when
# the second strike comes. Every case ends with the same check: the store holds exactly the rows of a clean run
# (every file, one version, no duplicates), every file is written in the report, and a rerun finds all unchanged.
FILES = 160
NULL = ('[model]\nbackend = "null"\n[chunking]\nchunk_tokens = 24\noverlap_tokens = 4\n[run]\nmax_files_in_flight = 4\n'
        '[store]\ntimeout_s = 10\nbatch_size = 16\n[loaders]\nplugins = ["fault_loaders"]\n')


def _tiny_docs(work: Path) -> None:
    (work / "docs").mkdir(parents=True)
    for i in range(FILES):
        (work / "docs" / f"f{i:04d}.slowtxt").write_text(f"{SENTENCES[i % len(SENTENCES)]} File {i}.")
    (work / "config.toml").write_text(NULL)


def _strike_run(work: Path, uri: str, collection: str, count, strikes, gap_s: float = 3.0) -> tuple[int, str, float]:
    """Start `ingest run` on `collection`; once count() > 0, call each strike, `gap_s` apart, while the run still
    writes; (exit code, stderr, seconds from the first strike to the exit)."""
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", uri, "--collection",
                             collection, "--report", "report.json", "--quiet"], cwd=work,
                            env={**cli_env(), "INGEST_TEST_SLOW_S": "0.2"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not count():
            assert proc.poll() is None and time.monotonic() < deadline, "no rows were written"
            time.sleep(0.2)
        struck = time.monotonic()
        for i, strike in enumerate(strikes):
            if i:
                time.sleep(gap_s)
            assert proc.poll() is None, "the run ended before the last strike"
            strike()
        _, err = proc.communicate(timeout=180)
        return proc.returncode, err, time.monotonic() - struck
    finally:
        if proc.poll() is None:
            proc.kill()


def _settled(work: Path, uri: str, collection: str, ids, expected: list[str], config: str = NULL) -> None:
    """The store holds exactly the clean run's rows; every file was written; a rerun finds every file unchanged."""
    report = json.loads((work / "report.json").read_text())
    assert [f["status"] for f in report["files"]].count("ingested") == FILES, report["totals"]
    assert sorted(ids()) == expected
    rerun = run_on(uri, collection, work, config=config)
    assert rerun.rc == 0, rerun.stderr
    assert {f["status"] for f in rerun.report["files"]} == {"unchanged"}
    assert sorted(ids()) == expected


def _select(pg_server, database: str, column: str, table: str) -> list:
    """`column` of every row of `table` ([] while the table does not exist)."""
    if not pg_server.sql(f"SELECT to_regclass('{table}')", database)[0][0]:
        return []
    return [r[0] for r in pg_server.sql(f"SELECT {column} FROM {table}", database)]


def _pg(pg_server, name: str, tmp_path: Path, monkeypatch, timeout_s: int = 10):
    """A fresh database `name`: its URI, the ids of a clean run, a reader of the collection's ids, and the faulty
    run's folder (its config with `timeout_s`)."""
    monkeypatch.setenv("INGEST_TEST_SLOW_S", "0")           # the clean run and the reruns load at full speed
    uri = pg_server.database(name)
    clean, work = tmp_path / "clean", tmp_path / "faulty"
    _tiny_docs(clean)
    assert run_on(uri, "clean", clean, config=NULL).rc == 0
    _tiny_docs(work)
    (work / "config.toml").write_text(NULL.replace("timeout_s = 10", f"timeout_s = {timeout_s}"))
    return uri, sorted(_select(pg_server, name, "id", "clean")), lambda: _select(pg_server, name, "id", "documents"), work


def _terminate(pg_server, database: str) -> int:
    """pg_terminate_backend of every connection to `database` but this one: how many."""
    return pg_server.sql("SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE datname = "
                         f"'{database}' AND pid <> pg_backend_pid()", "postgres")[0][0]


@pytest.mark.slow
def test_postgres_restarted_twice_mid_run_the_run_reconnects_and_finishes(tmp_path: Path, pg_server, monkeypatch) -> None:
    from pg_server import restart

    uri, expected, ids, work = _pg(pg_server, "faults_restart", tmp_path, monkeypatch)
    rc, err, _ = _strike_run(work, uri, "documents", ids, [lambda: restart(pg_server)] * 2)
    assert rc == 0, err
    _settled(work, uri, "documents", ids, expected)


@pytest.mark.slow
def test_postgres_dropped_connections_the_run_reconnects_and_finishes(tmp_path: Path, pg_server, monkeypatch) -> None:
    uri, expected, ids, work = _pg(pg_server, "faults_terminate", tmp_path, monkeypatch)
    ended = []

    def terminate() -> None:          # the second time, once the run has connected again (it does so on demand)
        deadline = time.monotonic() + 15
        while not (n := _terminate(pg_server, "faults_terminate")) and time.monotonic() < deadline:
            time.sleep(0.2)
        ended.append(n)
    rc, err, _ = _strike_run(work, uri, "documents", ids, [terminate] * 2)
    assert rc == 0, err
    assert ended[0] >= 2 and ended[1] >= 1         # the owner connection and a writer's, then who came back
    _settled(work, uri, "documents", ids, expected)


@pytest.mark.slow
def test_milvus_server_restarted_twice_mid_run_the_run_reconnects_and_finishes(
        tmp_path: Path, milvus_server, monkeypatch) -> None:
    monkeypatch.setenv("INGEST_TEST_SLOW_S", "0")
    config = NULL.replace("timeout_s = 10", "timeout_s = 30")      # a killed milvus-lite server takes ~5 s to start
    reference = milvus_server(tmp_path / "clean-data")
    clean, work = tmp_path / "clean", tmp_path / "faulty"
    for folder in (clean, work):
        _tiny_docs(folder)
        (folder / "config.toml").write_text(config)
    assert run_on(reference.uri, "documents", clean, config=config).rc == 0
    expected = sorted(r["id"] for r in server_rows(reference.uri, "documents"))
    servers = [milvus_server(tmp_path / "data")]

    def restart() -> None:
        servers[-1].process.kill()
        servers[-1].process.wait()
        servers.append(milvus_server(servers[-1].data_dir, servers[-1].port))

    ids = lambda: [r["id"] for r in server_rows(servers[-1].uri, "documents")]      # noqa: E731
    rc, err, _ = _strike_run(work, servers[0].uri, "documents", ids, [restart] * 2)
    assert rc == 0, err
    _settled(work, servers[-1].uri, "documents", ids, expected, config)


@pytest.mark.slow
def test_postgres_stalled_past_the_statement_timeout_then_back_the_run_reconnects_and_finishes(
        tmp_path: Path, pg_server, monkeypatch) -> None:
    from pg_server import signal_all

    uri, expected, ids, work = _pg(pg_server, "faults_stall_back", tmp_path, monkeypatch, timeout_s=6)

    def stall() -> None:       # longer than the statement timeout (6 s) and the client's bound (11 s), within retry's
        signal_all(pg_server, signal.SIGSTOP)
        try:
            time.sleep(14)
        finally:
            signal_all(pg_server, signal.SIGCONT)
    rc, err, _ = _strike_run(work, uri, "documents", ids, [stall])
    assert rc == 0, err
    _settled(work, uri, "documents", ids, expected)


@pytest.mark.slow
def test_postgres_stalled_for_good_stops_the_run_with_one_line_and_the_rerun_completes(
        tmp_path: Path, pg_server, monkeypatch) -> None:
    from pg_server import signal_all

    uri, expected, ids, work = _pg(pg_server, "faults_stall", tmp_path, monkeypatch, timeout_s=4)
    recorded = lambda: _select(pg_server, "faults_stall", "source", "documents__files")     # noqa: E731
    spool = work / "report.json.files.jsonl"

    def settled() -> bool:
        """Some files recorded, and the run has heard so: a file's line in the spool says "ingested". Struck the
        moment a commit shows in the manifest, the server could stop before its answer left (the run cannot
        know that commit's outcome); struck later, a commit under way is rarely at that point."""
        return bool(recorded()) and spool.exists() and '"status": "ingested"' in spool.read_text()

    try:                             # struck once some files are recorded: the report must count them as written
        rc, err, seconds = _strike_run(work, uri, "documents", settled,
                                       [lambda: signal_all(pg_server, signal.SIGSTOP)])
    finally:
        signal_all(pg_server, signal.SIGCONT)
    assert rc == 2 and err.strip().count("\n") == 0 and "did not answer within 9 s" in err, err
    assert pg_server.password not in err
    assert seconds < 60
    report = json.loads((work / "report.json").read_text())
    assert "did not answer" in report["totals"]["stopped_by"]
    written = {Path(f["path"]).name for f in report["files"] if f["status"] == "ingested"}
    assert written and written == {Path(source).name for source in recorded()}      # committed = written
    assert len(written) < FILES
    assert len(report["files"]) == FILES
    (work / "config.toml").write_text(NULL)
    resumed = run_on(uri, "documents", work, config=NULL)
    assert resumed.rc == 0, resumed.stderr
    assert sorted(ids()) == expected
    rerun = run_on(uri, "documents", work, config=NULL)
    assert {f["status"] for f in rerun.report["files"]} == {"unchanged"}


@pytest.mark.slow
def test_postgres_another_run_takes_the_collection_while_the_connection_is_away_the_run_stops_saying_so(
        tmp_path: Path, pg_server, monkeypatch) -> None:
    import threading

    import psycopg
    from ingest.store.postgres_manifest import _key

    uri, expected, ids, work = _pg(pg_server, "faults_taken", tmp_path, monkeypatch)
    other = psycopg.connect(pg_server.uri("faults_taken"), autocommit=True)     # "another run": waits for the lock
    waiter = threading.Thread(target=lambda: other.execute("SELECT pg_advisory_lock(%s)", (_key(other, "documents"),)))

    def take_over() -> None:
        waiter.start()
        time.sleep(0.5)                 # queued on the lock: it gets it the moment the run's owner connection ends
        pg_server.sql("SELECT count(pg_terminate_backend(pid, 5000)) FROM pg_stat_activity WHERE datname = "
                      f"'faults_taken' AND pid NOT IN (pg_backend_pid(), {other.info.backend_pid})", "postgres")
    try:
        rc, err, seconds = _strike_run(work, uri, "documents", ids, [take_over])
        waiter.join(10)
        assert rc == 2 and err.strip().count("\n") == 0 and "another run holds the collection" in err, err
        assert seconds < 60
        report = json.loads((work / "report.json").read_text())
        assert "another run holds the collection" in report["totals"]["stopped_by"]
    finally:
        other.close()                   # the other run ends
    resumed = run_on(uri, "documents", work, config=NULL)
    assert resumed.rc == 0, resumed.stderr
    assert sorted(ids()) == expected
