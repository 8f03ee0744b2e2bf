"""`ingest watch` keeps its pipeline warm between syncs (issue 32, item 4): real watch processes on a real folder
and Milvus Lite store (null encode backend), real processes killed, real signals."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import psutil

from conftest import cli_env, ingest, sqlite
from test_watch import _err, _until

CONFIG = '[model]\nbackend = "null"\n[loaders]\nplugins = ["fault_loaders"]\n'
WARM = ("ingest-encode", "ingest-lite", "ingest-txt", "ingest-writer")     # the processes a sync of a .txt uses
TEXT = "Penguins huddle together through the polar night. "


def _start(work: Path, slow_s: float = 1.0) -> subprocess.Popen:
    (work / "config.toml").write_text(CONFIG)
    (work / "docs" / "a.txt").write_text(TEXT * 20)
    err = open(work / "watch.err", "a")
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "watch", "docs", "--store", "store.db", "--quiet",
                             "--debounce", "0.3"], cwd=work, env={**cli_env(), "INGEST_TEST_SLOW_S": str(slow_s)},
                            stdout=err, stderr=err, start_new_session=True)
    err.close()
    return proc


def _recorded(work: Path) -> set[str]:
    try:
        with sqlite(f"file:{work / 'store.db.documents.manifest.sqlite'}?mode=ro", uri=True) as con:
            return {source for source, in con.execute("SELECT source FROM files")}
    except sqlite3.Error:
        return set()


def _report(work: Path) -> dict | None:
    try:
        return json.loads((work / "store.db.report.json").read_text())
    except (OSError, ValueError):
        return None


def _pids(proc: subprocess.Popen) -> dict[str, set[int]]:
    """The watch's processes by name (ingest-<role>)."""
    out: dict[str, set[int]] = {}
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            out.setdefault(child.name(), set()).add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _add(work: Path, proc: subprocess.Popen, name: str, text: str = TEXT) -> None:
    """Write docs/`name` and wait until the manifest records it."""
    (work / "docs" / name).write_text(text * 20)
    _until(lambda: name in _recorded(work), f"{name} recorded", proc, work)


def _warm(work: Path, proc: subprocess.Popen) -> dict[str, set[int]]:
    """Once a sync of a .txt file has run: the warm processes, each there."""
    def up() -> dict[str, set[int]] | None:
        pids = _pids(proc)
        return pids if all(pids.get(name) for name in WARM) else None
    return _until(up, "every process of the pipeline up between syncs", proc, work)


def _stop(proc: subprocess.Popen, signum: int) -> None:
    children = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signum)
    proc.wait(timeout=60)
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"


@pytest.mark.slow
def test_syncs_reuse_the_warm_pipeline_and_search_and_status_read_through_it(work: Path) -> None:
    proc = _start(work, slow_s=8)
    try:
        _until(lambda: "a.txt" in _recorded(work), "the first sync", proc, work)
        _add(work, proc, "b.txt", "Walruses haul out on the sea ice in spring. ")
        warm = _warm(work, proc)
        _add(work, proc, "c.txt", "Albatrosses glide for hours without a wingbeat. ")
        assert _pids(proc) == warm, "a second sync starts no process and stops none (the model loaded once)"

        host = min(warm["ingest-lite"])                          # its socket stays private to this user
        socket_dir, = Path(tempfile.gettempdir()).glob(f"ingest-lite-{host}-*")
        assert stat.S_IMODE(socket_dir.stat().st_mode) == 0o700 and socket_dir.stat().st_uid == os.getuid()
        with open(work / "store.db.lock", "a+") as lock:       # watch holds the store between syncs
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                raise AssertionError("the store is not held by watch between syncs")
            except BlockingIOError:
                pass

        (work / "docs" / "d.slowtxt").write_text("Puffins nest in burrows on the cliffs. " * 20)
        time.sleep(1.5)                                         # its sync loads it for 8 s
        res = ingest("search", "albatrosses glide", "--mode", "bm25", "--json", "--store", "store.db", cwd=work)
        assert res.rc == 0, res.stderr                          # answered through watch's Lite host
        assert json.loads(res.stdout)[0]["source"] == "c.txt"
        assert "d.slowtxt" not in _recorded(work), "the search ran during that sync"
        res = ingest("status", "--json", "--store", "store.db", cwd=work)
        assert res.rc == 0 and json.loads(res.stdout)["files"] >= 3, res.stdout + res.stderr
        _until(lambda: "d.slowtxt" in _recorded(work), "the slow file recorded", proc, work)
        assert _pids(proc) == warm
    finally:
        _stop(proc, signal.SIGTERM)
    assert proc.returncode == 143, _err(work)
    assert not socket_dir.exists(), "the Lite host's socket directory is gone"


@pytest.mark.slow
def test_an_encode_worker_killed_during_watch_is_replaced_and_watch_goes_on(work: Path) -> None:
    proc = _start(work, slow_s=3)
    try:
        _until(lambda: "a.txt" in _recorded(work), "the first sync", proc, work)
        _add(work, proc, "b.txt")
        encode = _warm(work, proc)["ingest-encode"]
        (work / "docs" / "c.slowtxt").write_text("Terns fly from pole to pole every year. " * 20)
        time.sleep(1.5)                                         # its sync loads it for 3 s
        for pid in encode:
            os.kill(pid, signal.SIGKILL)                       # the encode worker dies during that sync
        _until(lambda: "c.slowtxt" in _recorded(work), "the slow file recorded after all", proc, work)
        _add(work, proc, "d.txt", "Gannets dive from thirty metres. ")
        assert _pids(proc)["ingest-encode"].isdisjoint(encode), "a fresh encode worker"
        assert _report(work)["totals"]["exit_code"] == 0
    finally:
        _stop(proc, signal.SIGTERM)
    assert proc.returncode == 143, _err(work)


@pytest.mark.slow
def test_sigterm_during_a_warm_sync_exits_143_with_its_report(work: Path) -> None:
    proc = _start(work, slow_s=30)
    try:
        _until(lambda: "a.txt" in _recorded(work), "the first sync", proc, work)
        _add(work, proc, "b.txt")
        warm = _warm(work, proc)
        (work / "docs" / "c.slowtxt").write_text("Terns fly from pole to pole every year. " * 20)
        time.sleep(1.5)                                         # its sync loads it for 30 s
        assert _pids(proc)["ingest-encode"] == warm["ingest-encode"], "the sync uses the warm encode worker"
        sent = time.monotonic()
    finally:
        _stop(proc, signal.SIGTERM)
    assert proc.returncode == 143, _err(work)
    assert time.monotonic() - sent < 20
    report = _report(work)
    assert report["totals"]["interrupted"] is True and report["totals"]["signal"] == "SIGTERM"
    assert {f["path"]: f["status"] for f in report["files"]}["c.slowtxt"] == "failed"
    assert _recorded(work) == {"a.txt", "b.txt"}
