"""Every stop leaves a report, within its grace (issue 30, items 2 and 9): a stop drops what is not yet
encoded instead of encoding the windows read ahead; a stop that outlasts the grace anyway still writes
the report from the spool; a report path that cannot be written stops the run at once, in one line.
Real runs in their own process group, real signals, the real packaged model."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import cli_env, ingest
from test_signals import _assert_group_gone, _recorded, _wait

from ingest.encode_pool import EncodePool
from ingest.engines.stop import DEFAULT_GRACE_S
from ingest.files import INTERRUPTED

WORDS = ("penguin polar night ice colony winter huddle ocean krill chick feather storm wind snow egg parent march "
         "breeding season shelf glacier light dark cold warm sea bird flock fish dive").split()


def _texts(docs: Path, n: int, sentences: int) -> None:
    """n text files of distinct sentences (~4 chunks of 200 tokens each at 90 sentences)."""
    rng = random.Random(7)
    docs.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        text = " ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 16))).capitalize() + "."
                        for _ in range(sentences))
        (docs / f"t{i:03}.txt").write_text(f"Document {i}. {text}")


def _start(work: Path, *extra: str, env: dict[str, str] | None = None, root: str = "docs") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", root, "--store", "store.db", "--report",
                             "report.json", "--quiet", *extra], cwd=work, env={**cli_env(), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _leftovers(work: Path) -> list[str]:
    return sorted(p.name for p in work.iterdir() if p.name.endswith((".tmp", ".jsonl")))


@pytest.mark.slow
def test_sigterm_to_a_torch_run_midway_reports_within_the_grace(tmp_path: Path) -> None:
    """The issue's case: SIGTERM to the group of a torch run of 160+ text files, mid-way, on a 2-core box.
    Before (1e9e2d2), the encode pool encoded every window it had read ahead (up to 1,536 chunks: 25-50 s
    of torch on a busy CPU) and the run quit at the grace, 30.7 s, with exit 143 and no report; now ~6 s."""
    _texts(tmp_path / "docs", 240, 90)
    proc = _start(tmp_path, "--backend", "torch")
    _wait(lambda: len(_recorded(tmp_path)) >= 1, "recorded a file", proc, timeout=400)
    signalled = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=DEFAULT_GRACE_S + 30)
    took = time.monotonic() - signalled
    assert proc.returncode == 143, err[-3000:]
    totals = json.loads((tmp_path / "report.json").read_text())["totals"]
    assert totals["stopped_by"] is None, f"the stop outlasted its grace: {totals['stopped_by']}"
    assert took < DEFAULT_GRACE_S, f"the stop took {took:.1f} s"
    report = json.loads((tmp_path / "report.json").read_text())
    assert totals["interrupted"] is True and totals["signal"] == "SIGTERM" and totals["exit_code"] == 143
    ingested = {f["path"] for f in report["files"] if f["status"] == "ingested"}
    interrupted = [f for f in report["files"] if f["status"] == "failed"]
    assert ingested == _recorded(tmp_path) and ingested
    assert interrupted and all(f["error"] == INTERRUPTED for f in interrupted)
    assert len(ingested) + len(interrupted) == len(report["files"])
    print(f"stopped in {took:.1f} s: {len(ingested)} ingested, {len(interrupted)} interrupted")
    assert _leftovers(tmp_path) == []
    _assert_group_gone(proc.pid)


CONFIG = '[loaders]\nplugins = ["fault_loaders"]\n[loaders.txt]\nworkers = 1\n[run]\nmax_files_in_flight = 2\n'
HANG = json.dumps({"match": "HANGME", "action": "hang"})       # the encode worker hangs on that batch


@pytest.mark.parametrize("how", ["grace", "second signal"])
def test_a_stop_that_outlasts_its_grace_still_writes_the_report(tmp_path: Path, short_tmp: Path, how: str) -> None:
    """The encode worker hangs in the batch that would complete its window, so the stop waits for it: at the
    grace (3 s here), or at a second signal, the run quits with the report written from the spool, every file
    not settled "interrupted", stopped_by saying why, the last run recorded, nothing left behind (the folder
    is read as a file:// URL in one case, so the run has a private fetch folder to remove)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(8):
        text = "HANGME: the encoder hangs here." if i == 3 else f"Document {i} tells of penguins in the polar night."
        (docs / f"d{i}.slowtxt").write_text(text)
    (tmp_path / "config.toml").write_text(CONFIG)
    grace = "3" if how == "grace" else "120"
    temp = short_tmp                                    # where a URL's run makes its fetch folder
    proc = _start(tmp_path, "--backend", "null", env={"INGEST_FAULT": HANG, "INGEST_TEST_SLOW_S": "0.3",
                                                       "INGEST_STOP_GRACE_S": grace, "TMPDIR": str(temp)},
                  root=docs.as_uri() if how == "second signal" else "docs")
    _wait(lambda: len(_recorded(tmp_path)) >= 3, "recorded 3 files", proc)
    time.sleep(1.5)                                     # d3's batch is on the worker, which hangs
    signalled = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    if how == "second signal":
        time.sleep(1)
        os.kill(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - signalled
    assert proc.returncode == 143, err[-3000:]
    assert took < (3 + 10 if how == "grace" else 10), f"quitting took {took:.1f} s"
    report = json.loads((tmp_path / "report.json").read_text())
    totals = report["totals"]
    why = "still stopping after the 3 s stop grace" if how == "grace" else "a second stop signal (SIGINT)"
    assert totals["stopped_by"] == why and totals["exit_code"] == 143 and totals["signal"] == "SIGTERM", totals
    status = {f["path"]: f for f in report["files"]}
    ingested = {p for p, f in status.items() if f["status"] == "ingested"}
    assert ingested == _recorded(tmp_path) == {f"d{i}.slowtxt" for i in range(3)}
    assert status["d3.slowtxt"]["status"] == "failed" and status["d3.slowtxt"]["error"] == INTERRUPTED
    assert all(f["error"] == INTERRUPTED for p, f in status.items() if p not in ingested)
    assert _leftovers(tmp_path) == [] and (tmp_path / "report.html").exists()
    _assert_group_gone(proc.pid)
    assert list(temp.iterdir()) == []
    shown = ingest("status", "--store", "store.db", "--json", cwd=tmp_path)
    last = json.loads(shown.stdout)["last_run"]
    assert last["exit_code"] == 143 and last["stopped_by"] == why, shown.stdout


def test_a_stopped_encode_call_drops_what_no_worker_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The encode pool reads windows ahead; once `stop` is set only what a worker runs finishes: every group
    comes back, in order, whole or None, the call ends at once, and nothing after a None has rows."""
    monkeypatch.setenv("INGEST_FAULT", json.dumps({"match": "", "action": "delay", "seconds": 0.2}))   # ~0.1 s a batch
    pool = EncodePool(backend="null", devices=["cpu"], batch_size=16)
    stop = threading.Event()
    groups = [(g, [f"text {g}.{i}" for i in range(40)]) for g in range(60)]
    try:
        dim, got, stopped = pool.dim, [], None
        for key, rows in pool.encode_groups(groups, stop=stop):
            got.append((key, rows))
            if stopped is None:
                stop.set()
                stopped = time.monotonic()
        took = time.monotonic() - stopped
    finally:
        pool.close()
    assert [k for k, _ in got] == list(range(60))
    whole = [k for k, rows in got if rows is not None]
    assert whole == list(range(len(whole))) and 1 <= len(whole) < 60, whole
    assert all(rows.shape == (40, dim) for _, rows in got if rows is not None)
    assert took < 5, f"the stopped call took {took:.1f} s"


@pytest.mark.parametrize("where", ["a folder", "under a file"])
def test_an_unwritable_report_path_stops_the_run_at_once_in_one_line(tmp_path: Path, where: str) -> None:
    """Before, the run ingested everything, then ended with a traceback and exit 1, leaving *.tmp and spool
    files behind and no last run."""
    _texts(tmp_path / "docs", 2, 5)
    if where == "a folder":
        report = tmp_path / "out"
        report.mkdir()
    else:
        (tmp_path / "notes.txt").write_text("a file, not a folder")
        report = tmp_path / "notes.txt" / "report.json"
    result = subprocess.run([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db", "--report",
                             str(report), "--backend", "null"], cwd=tmp_path, env=cli_env(), capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ingest: error: ") and str(report) in lines[0], result.stderr
    assert "a folder" in lines[0] if where == "a folder" else "notes.txt is a file, not a folder" in lines[0]
    assert not (tmp_path / "store.db").exists()          # nothing was opened, nothing ingested
    leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith((".tmp", ".jsonl"))]
    assert leftovers == [] and (where == "under a file" or list(report.iterdir()) == [])
