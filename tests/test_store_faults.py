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

from conftest import cli_env, server_rows
from test_incremental import SENTENCES
from test_server_uri import run_on

CONFIG = ('[chunking]\nchunk_tokens = 24\noverlap_tokens = 4\n[run]\nmax_files_in_flight = 2\n'
          '[store]\ntimeout_s = 5\n[loaders]\nplugins = ["fault_loaders"]\n')


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


def test_stalled_then_killed_server_stops_the_run_and_the_rerun_matches_a_clean_run(
        tmp_path: Path, milvus_server) -> None:
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
