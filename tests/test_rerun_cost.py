"""Issue 22 items 4 and 7: an unchanged rerun of a Milvus Lite store costs stat calls and a manifest read
(the store is not opened: no Lite host starts), a changed file still opens it, a deleted or replaced store
is noticed; a Lite store past its size says so at the start."""
from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import psutil

from conftest import cli_env, row_ids, run, sqlite

NULL = ["--backend", "null"]


def _run_watching_lite(work: Path) -> tuple[subprocess.CompletedProcess, bool]:
    """`ingest run docs` (null backend), and whether an ingest-lite process appeared under it."""
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db", "--report",
                             "report.json", "--quiet", *NULL], cwd=work, env=cli_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lite = False
    while proc.poll() is None:
        try:
            lite = lite or any(c.name() == "ingest-lite" for c in psutil.Process(proc.pid).children(recursive=True))
        except psutil.Error:
            pass
        time.sleep(0.02)
    out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), lite


@pytest.mark.slow
def test_unchanged_rerun_does_not_open_the_store_but_changes_and_a_lost_store_do(work: Path) -> None:
    docs = work / "docs"
    for i in range(5):
        (docs / f"f{i}.txt").write_text(f"Penguin colony {i} huddles together through the long polar night.")
    first, lite = _run_watching_lite(work)
    assert first.returncode == 0 and lite, first.stderr
    again, lite = _run_watching_lite(work)
    assert again.returncode == 0 and not lite, again.stderr           # the manifest's word, not the store's
    (docs / "f1.txt").write_text("Whales sing long songs that carry across the cold ocean.")
    changed, lite = _run_watching_lite(work)
    assert changed.returncode == 0 and lite, changed.stderr
    assert len(row_ids(work)) == 5
    again, lite = _run_watching_lite(work)
    assert again.returncode == 0 and not lite, again.stderr

    shutil.rmtree(work / "store.db")                                 # the store is gone: everything again
    res = run(docs, work, *NULL)
    assert res.rc == 0 and res.report["totals"]["by_status"] == {"ingested": 5}, res.report["totals"]
    assert len(row_ids(work)) == 5


@pytest.mark.slow
def test_a_replaced_store_is_checked_again(work: Path) -> None:
    docs = work / "docs"
    (docs / "a.txt").write_text("Penguins huddle together through the long polar night.")
    assert run(docs, work, *NULL).rc == 0
    shutil.rmtree(work / "store.db")
    made = subprocess.run([sys.executable, "-c", "from pymilvus import MilvusClient\n"     # someone else's
                           "c = MilvusClient('store.db'); c.create_collection('documents', dimension=4); c.close()"],
                          cwd=work, env=cli_env(), capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr
    res = run(docs, work, *NULL)
    assert res.rc == 2 and "was not made by ingest" in res.stderr, res.stderr


def test_a_lite_store_past_its_size_warns_at_start(work: Path) -> None:
    docs = work / "docs"
    (docs / "a.txt").write_text("Penguins huddle together through the long polar night.")
    assert run(docs, work, *NULL).rc == 0
    manifest = next(work.glob("store.db.*.manifest.sqlite"))
    with sqlite(manifest) as db:               # as if the store held 150,000 rows
        db.execute("UPDATE files SET chunks = 150000")
    res = run(docs, work, *NULL)
    assert res.rc == 0, res.stderr
    warning = [line for line in res.stderr.splitlines() if "Milvus Lite" in line]
    assert len(warning) == 1 and "150,000 rows" in warning[0] and "--store http" in warning[0], res.stderr
    assert res.report["totals"]["warnings"] == [warning[0].removeprefix("warning: ")]
