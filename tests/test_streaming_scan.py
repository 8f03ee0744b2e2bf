"""Issue 22 item 1: the folder is scanned lazily, directory by directory, in a deterministic order; the
files settle one by one into a spool and the report is assembled from it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env, run
from ingest.scan import scan

NULL = ["--backend", "null"]


def _tree(root: Path, names: list[str]) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(f"Penguins of {name} huddle together through the long polar night.\n")


def test_scan_is_lazy_and_walks_each_directory_in_name_order(tmp_path: Path) -> None:
    _tree(tmp_path, ["b.txt", "a/z.txt", "a/m/x.txt", "a.txt", "c/y.txt", "0.txt"])
    files = scan(tmp_path, "inside")
    first = next(files)
    # The walk has not reached c/ yet: a file made there now is still found (nothing listed it before).
    (tmp_path / "c" / "late.txt").write_text("made after the scan started")
    rest = list(files)
    order = [ref.source for ref, _ in [first, *rest]]
    assert order == ["0.txt", "a/m/x.txt", "a/z.txt", "a.txt", "b.txt", "c/late.txt", "c/y.txt"]
    assert [ref.seq for ref, _ in [first, *rest]] == list(range(7))
    assert all(problem is None for _, problem in [first, *rest])
    assert [ref.source for ref, _ in scan(tmp_path, "inside")] == order        # deterministic


@pytest.mark.slow
def test_report_from_the_spool_and_prune_from_what_settled(work: Path) -> None:
    """(An unlisted folder under --prune: tests/test_last_good_copy.py.)"""
    docs = work / "docs"
    _tree(docs, ["a/one.txt", "a/two.txt", "b/three.txt", "z.txt"])
    first = run(docs, work, *NULL)
    assert first.rc == 0, first.stderr
    report = first.report
    assert [f["path"] for f in report["files"]] == ["a/one.txt", "a/two.txt", "b/three.txt", "z.txt"]
    totals = report["totals"]
    assert totals["files"] == 4 and totals["by_status"] == {"ingested": 4} and totals["chunks"] == 4
    assert totals["scan_finished"] is True and totals["not_started"] == 0
    assert not list(work.glob("*.jsonl")), "the spool stays only when no report was written"

    (docs / "a" / "two.txt").unlink()
    kept = run(docs, work, *NULL)
    assert kept.rc == 0 and kept.report["totals"]["pruned"] == 0
    again = run(docs, work, *NULL, "--prune")
    assert again.rc == 0, again.stderr
    assert {p: f["status"] for p, f in again.by_path().items()} == dict.fromkeys(
        ["a/one.txt", "b/three.txt", "z.txt"], "unchanged")
    assert again.report["totals"]["pruned"] == 1


@pytest.mark.slow
def test_stop_before_the_scan_ends_says_so(work: Path) -> None:
    """max_files_in_flight = 1 and a slow loader: a SIGTERM comes long before the scan reaches the end."""
    docs = work / "docs"
    for d in range(3):
        for i in range(30):
            (docs / f"d{d}" / f"f{i:02}.slowtxt").parent.mkdir(parents=True, exist_ok=True)
            (docs / f"d{d}" / f"f{i:02}.slowtxt").write_text(f"Slow text {d} {i} about the polar night.")
    (work / "config.toml").write_text('[run]\nmax_files_in_flight = 1\n[loaders]\nplugins = ["fault_loaders"]\n')
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db", "--report",
                             "report.json", "--quiet", *NULL], cwd=work, env={**cli_env(), "INGEST_TEST_SLOW_S": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    spool = work / "report.json.files.jsonl"
    deadline = time.monotonic() + 300
    while not (spool.exists() and spool.read_text().count("\n") >= 1):      # a file settled: ingesting
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.2)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-2000:]
    report = json.loads((work / "report.json").read_text())
    totals = report["totals"]
    assert totals["scan_finished"] is False and totals["not_started"] is None, totals
    assert 1 <= totals["files"] < 90 and totals["files"] == len(report["files"])
    assert {f["status"] for f in report["files"]} <= {"ingested", "failed"}
    assert not spool.exists()
