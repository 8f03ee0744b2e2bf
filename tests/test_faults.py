"""Issue 5: timeouts, crash isolation, no orphans, Ctrl-C, single writer — with real processes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import psutil

from conftest import cli_env, row_ids, run, wait_recorded

FAULT_CONFIG = """
[loaders]
plugins = ["fault_loaders"]
[loaders.txt]
workers = 2
timeout_s = 3
"""


@pytest.mark.slow
def test_faulty_loaders_cost_only_their_file(work: Path) -> None:
    docs = work / "docs"
    for ext in ("sleep", "exit", "segv", "noterm"):
        (docs / f"bad.{ext}").write_text("x")
    (docs / "flaky.flaky").write_text("The flaky loader succeeds on its second attempt.")
    (docs / "good.txt").write_text("Bees dance to tell the hive where the flowers are.")
    # No wall-clock bound (a busy machine took 300 s): a run that waited for the hour-long loaders would
    # exceed run()'s timeout. The null backend: only the loaders are under test.
    res = run(docs, work, "--backend", "null", config=FAULT_CONFIG)
    assert res.rc == 1, res.stderr
    files = res.by_path()
    assert files["good.txt"]["status"] == "ingested"
    assert files["flaky.flaky"]["status"] == "ingested"           # retried once in a fresh worker
    assert files["bad.sleep"] == {**files["bad.sleep"], "status": "failed", "error": "timeout after 3 s"}
    assert files["bad.noterm"]["error"] == "timeout after 3 s"     # SIGTERM ignored -> SIGKILL
    assert files["bad.exit"]["status"] == "failed" and "exited with code 3" in files["bad.exit"]["error"]
    assert "SIGSEGV" in files["bad.segv"]["error"] and "retried once" in files["bad.segv"]["error"]
    assert len(row_ids(work)) == files["good.txt"]["chunks"] + files["flaky.flaky"]["chunks"]


def _start(work: Path, config: str) -> subprocess.Popen:
    """`ingest run` in its own process group, as a shell would start it (null backend: no model to load
    or export, so the waits below depend on the processes under test only)."""
    (work / "config.toml").write_text(config)
    return subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db",
                             "--report", "report.json", "--quiet", "--backend", "null"], cwd=work, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_children(proc: subprocess.Popen, n: int, timeout: float = 90) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        kids = psutil.Process(proc.pid).children(recursive=True)
        if len(kids) >= n:
            return kids
        time.sleep(0.2)
    raise AssertionError(f"only {len(kids)} worker processes started")


def _assert_gone(procs: list[psutil.Process], within: float) -> None:
    gone, alive = psutil.wait_procs(procs, timeout=within)
    assert not alive, f"orphans left: {[p.pid for p in alive]}"


def test_sigkill_of_supervisor_leaves_no_orphans(work: Path) -> None:
    for i in range(4):
        (work / "docs" / f"slow{i}.sleep").write_text("x")
    (work / "docs" / "a.txt").write_text("Some text so that the encode pool starts.")
    proc = _start(work, FAULT_CONFIG.replace("timeout_s = 3", "timeout_s = 600"))
    kids = _wait_for_children(proc, 3)
    time.sleep(1.0)
    kids = psutil.Process(proc.pid).children(recursive=True)
    proc.kill()
    proc.wait()
    _assert_gone(kids, within=30)          # watchdogs exit within a second; a busy machine may take longer


@pytest.mark.slow
def test_ctrl_c_writes_report_and_exits_130(work: Path) -> None:
    for i in range(3):
        (work / "docs" / f"slow{i}.sleep").write_text("x")
    (work / "docs" / "a.txt").write_text("Penguins huddle together through the polar night.")
    proc = _start(work, FAULT_CONFIG.replace("timeout_s = 3", "timeout_s = 600"))
    wait_recorded(work, "a.txt")
    kids = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGINT)             # Ctrl-C reaches the whole foreground group
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    report = json.loads((work / "report.json").read_text())
    assert report["totals"]["interrupted"] is True
    statuses = {f["path"]: f["status"] for f in report["files"]}
    assert all(statuses[f"slow{i}.sleep"] == "failed" for i in range(3))
    _assert_gone(kids, within=30)
    ids = row_ids(work)
    assert len(ids) == len(set(ids))


def test_second_run_on_busy_store_fails_at_once(work: Path) -> None:
    (work / "docs" / "slow.sleep").write_text("x")
    proc = _start(work, FAULT_CONFIG.replace("timeout_s = 3", "timeout_s = 600"))
    try:
        _wait_for_children(proc, 1)
        start = time.monotonic()
        res = subprocess.run([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db", "--quiet"],
                             cwd=work, env=cli_env(), capture_output=True, text=True, timeout=120)
        assert time.monotonic() - start < 60     # at once: it would otherwise wait out the first run (600 s)
        assert res.returncode == 2
        assert "in use" in res.stderr and res.stderr.strip().count("\n") == 0
    finally:
        proc.kill()
        proc.wait()
