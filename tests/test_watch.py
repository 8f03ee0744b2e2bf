"""`ingest watch FOLDER` (issue 23, item 4): real watch processes on a real folder and store (null encode
backend), real file changes, real signals; the store is read through its manifest and report."""
from __future__ import annotations

import fcntl
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

import psutil

from conftest import cli_env, sqlite

NULL = '[model]\nbackend = "null"\n'
DEBOUNCE = 1.0      # the slow writer pauses 0.3 s: a loaded 2-core box may stall it, never by 0.7 s


def _start(work: Path, *extra: str, env: dict[str, str] | None = None, quiet: bool = True) -> subprocess.Popen:
    """`ingest watch docs` in `work`, in a process group of its own (as a shell or service manager starts it)."""
    err = open(work / "watch.err", "a")
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "watch", "docs", "--store", "store.db",
                             *(["--quiet"] if quiet else []), "--debounce", str(DEBOUNCE), *extra], cwd=work,
                            env={**cli_env(), **(env or {})}, stdout=err, stderr=err, start_new_session=True)
    err.close()
    return proc


def _until(condition: Callable[[], object], what: str, proc: subprocess.Popen, work: Path, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert proc.poll() is None, f"watch ended ({proc.returncode}) before {what}: {_err(work)}"
        assert time.monotonic() < deadline, f"never {what}: {_err(work)}"
        time.sleep(0.05)
    return result


def _err(work: Path) -> str:
    return (work / "watch.err").read_text()[-3000:]


def _recorded(work: Path) -> dict[str, int]:
    """source -> size, as the manifest records them."""
    db = work / "store.db.documents.manifest.sqlite"
    if not db.exists():
        return {}
    try:
        with sqlite(db) as con:
            return dict(con.execute("SELECT source, size FROM files"))
    except sqlite3.OperationalError:
        return {}


def _report(work: Path) -> dict | None:
    """The last sync's report (at `ingest run`'s default path), or None while there is none."""
    try:
        return json.loads((work / "store.db.report.json").read_text())
    except (OSError, ValueError):
        return None


def _synced(work: Path, expect: dict[str, str]) -> Callable[[], dict | None]:
    """A condition: the last report gives these files (path: status) these statuses; the report then."""
    def check() -> dict | None:
        report = _report(work)
        status = {f["path"]: f["status"] for f in report["files"]} if report else {}
        return report if all(status.get(path) == s for path, s in expect.items()) else None
    return check


def _stop(proc: subprocess.Popen, signum: int) -> float:
    """Send `signum` to the watch's group (as Ctrl-C or a service manager): its exit code is checked by the
    caller; every process it had is gone. The seconds it took to exit."""
    children = psutil.Process(proc.pid).children(recursive=True)
    sent = time.monotonic()
    os.killpg(proc.pid, signum)
    proc.wait(timeout=60)
    took = time.monotonic() - sent
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"
    return took


@pytest.mark.slow
def test_watch_syncs_changes_as_they_happen_and_stops_on_signals(work: Path) -> None:
    (work / "config.toml").write_text(NULL + '[loaders]\nplugins = ["fault_loaders"]\n')
    docs = work / "docs"
    (docs / "a.txt").write_text("Penguins huddle together through the polar night. " * 20)
    (docs / "b.txt").write_text("Walruses haul out on the sea ice in spring. " * 20)
    proc = _start(work)
    _until(_synced(work, {"a.txt": "ingested", "b.txt": "ingested"}), "the files present at start ingested", proc,
           work)
    assert set(_recorded(work)) == {"a.txt", "b.txt"}

    (docs / "c.txt").write_text("Albatrosses glide for hours without a wingbeat. " * 20)     # a new file
    _until(_synced(work, {"c.txt": "ingested", "a.txt": "unchanged"}), "a new file ingested", proc, work)

    parts = [f"Part {i} of a long account of the emperor penguin's winter. " * 200 for i in range(4)]
    sizes: set[int] = set()
    with open(docs / "slow.txt", "w") as out:          # written over 0.9 s, pausing less than the debounce
        for i, part in enumerate(parts):
            out.write(part)
            out.flush()
            sizes.add(_recorded(work).get("slow.txt", 0))
            time.sleep(0.3 if i < len(parts) - 1 else 0)
    final = len("".join(parts).encode())
    while (recorded := _recorded(work).get("slow.txt")) != final:
        sizes.add(recorded or 0)
        assert proc.poll() is None and len(sizes) < 1000, _err(work)
        time.sleep(0.02)
    assert sizes == {0}, f"slow.txt was ingested before it was complete (sizes recorded: {sorted(sizes)})"
    _until(_synced(work, {"slow.txt": "ingested"}), "the slow file's sync reported", proc, work)

    (docs / "a.txt").unlink()                          # a deletion, and a rename: the old name goes, the new comes
    (docs / "b.txt").rename(docs / "b2.txt")
    report = _until(_synced(work, {"b2.txt": "ingested"}), "a deletion and a rename synced", proc, work)
    assert report["totals"]["pruned"] == 2 and {f["path"] for f in report["files"]} == {"b2.txt", "c.txt", "slow.txt"}
    assert set(_recorded(work)) == {"b2.txt", "c.txt", "slow.txt"}

    time.sleep(1)                                      # idle now: that sync has ended
    took = _stop(proc, signal.SIGTERM)
    assert proc.returncode == 143, _err(work)
    assert took < 3, f"an idle watch took {took:.1f} s to stop"
    assert _err(work) == "", "--quiet prints nothing"

    # A restart resumes from the manifest: nothing changed, nothing to do.
    (work / "store.db.report.json").unlink()
    proc = _start(work, env={"INGEST_TEST_SLOW_S": "30"})
    report = _until(lambda: _report(work), "the restart's first sync reported", proc, work)
    assert {f["path"]: f["status"] for f in report["files"]} == dict.fromkeys(["b2.txt", "c.txt", "slow.txt"],
                                                                             "unchanged")
    assert report["totals"]["pruned"] == 0

    # Ctrl-C during a sync (its file loads for 30 s) is the run's to handle: its report, then 130.
    (docs / "d.slowtxt").write_text("Document d tells of penguins in the polar night. " * 20)
    _until(lambda: any(c.name() == "ingest-txt" for c in psutil.Process(proc.pid).children(recursive=True)),
           "a sync loading the new file", proc, work)
    took = _stop(proc, signal.SIGINT)
    assert proc.returncode == 130, _err(work)
    assert took < 20, f"Ctrl-C during a sync took {took:.1f} s"
    report = _report(work)
    assert report["totals"]["interrupted"] is True and report["totals"]["signal"] == "SIGINT"
    assert {f["path"]: f["status"] for f in report["files"]}["d.slowtxt"] == "failed"
    assert set(_recorded(work)) == {"b2.txt", "c.txt", "slow.txt"}


@pytest.mark.slow
def test_a_store_in_use_is_waited_for_and_a_bad_model_ends_watch(work: Path) -> None:
    (work / "config.toml").write_text(NULL)
    (work / "docs" / "a.txt").write_text("Penguins huddle together through the polar night. " * 20)
    with open(work / "store.db.lock", "a+") as lock:   # another run holds the store (Store.lock's flock)
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lock.write("ingest pid 1")
        lock.flush()
        proc = _start(work)
        _until(lambda: "in use by ingest pid 1" in _err(work), "said the store is in use", proc, work)
    _until(lambda: _recorded(work), "the file ingested once the store was free", proc, work)    # retried
    _stop(proc, signal.SIGTERM)
    assert proc.returncode == 143
    assert _err(work).count("in use") == 1, "said once"

    proc = _start(work, "--model", str(work / "no-such-model"))
    proc.wait(timeout=60)
    err = _err(work).split("watch tries again every 3 s\n", 1)[1]
    assert proc.returncode == 2 and err.startswith("ingest: error: ") and err.count("\n") == 1, err
