"""Issue 23 item 3: `ingest status` says what a store holds and how its last run went (recorded by the run
as the manifest's last_run), fast, without Milvus or torch for a Lite store, also while a run holds it;
a store that does not exist is one line, and nothing is created."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env, ingest, run, run_on, wait_recorded
from ingest.files import INTERRUPTED
from ingest.status import FAILED_MAX

NULL = '[model]\nbackend = "null"\n'
TEXT = "Penguins huddle together through the long polar night, taking turns at the windy edge."
# `ingest status` in-process, then proof that it neither opened Milvus nor imported torch
_NO_MILVUS = ("import sys\nfrom ingest.cli import main\ncode = main(sys.argv[1:])\n"
              "assert not {'pymilvus', 'torch', 'milvus_lite'} & set(sys.modules), 'imported Milvus or torch'\n"
              "sys.exit(code)\n")


def _status(work: Path, *args: str) -> dict:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _NO_MILVUS, "status", "--store", "store.db", "--json", *args],
                          cwd=work, env=cli_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and time.monotonic() - start < 10, proc.stderr     # about 0.3 s here
    return json.loads(proc.stdout)


@pytest.mark.slow
def test_status_of_a_store_and_its_last_run(work: Path) -> None:
    docs = work / "docs"
    (docs / "a.txt").write_text(TEXT)
    (docs / "notes").mkdir()
    (docs / "notes" / "b.md").write_text("# Penguins\n\n" + TEXT)
    for i in range(FAILED_MAX + 2):                        # text named .pdf: each fails at the sniff
        (docs / f"fake{i:02}.pdf").write_text(TEXT)
    res = run(docs, work, config=NULL)
    assert res.rc == 1, res.stderr

    info = _status(work)
    assert (info["files"], info["chunks"]) == (2, 2) and info["in_use_by"] is None, info
    assert info["by_format"] == {"md": {"files": 1, "chunks": 1}, "txt": {"files": 1, "chunks": 1}}
    assert info["by_status"] == {"ingested": {"files": 2, "chunks": 2}}
    assert (info["model"], info["backend"], info["dim"]) == (res.report["totals"]["model"], "null", 384)
    assert info["chunking"]["chunk_tokens"] == 200 and info["chunking"]["skip_junk"] is True
    last = info["last_run"]
    assert last["exit_code"] == 1 and last["by_status"] == {"ingested": 2, "failed": FAILED_MAX + 2}
    assert last["report"] == str(work / "report.json") and last["signal"] is None and last["stopped_by"] is None
    assert 0 < last["seconds"] and last["started"] < last["ended"] <= time.time()
    assert [f["path"] for f in last["failed"]] == [f"fake{i:02}.pdf" for i in range(FAILED_MAX)]
    assert "does not look like a .pdf" in last["failed"][0]["error"] and last["failed_more"] == 2

    text = ingest("status", "--store", "store.db", cwd=work)
    assert text.rc == 0, text.stderr
    assert "2 files, 2 chunks" in text.stdout and "exit 1: 22 failed, 2 ingested" in text.stdout, text.stdout
    assert "fake00.pdf: content does not look like a .pdf" in text.stdout and "and 2 more failed" in text.stdout


@pytest.mark.slow
def test_status_while_a_run_holds_the_store_and_of_no_store(work: Path) -> None:
    before = sorted(p.name for p in work.iterdir())
    res = ingest("status", "--store", "nothing.db", cwd=work)
    assert (res.rc, res.stderr) == (2, "ingest: error: no store at nothing.db; run ingest run FOLDER first\n")
    assert sorted(p.name for p in work.iterdir()) == before              # no .db, no .lock, no manifest

    (work / "docs" / "a.txt").write_text(TEXT)
    (work / "docs" / "b.sleep").write_text("x")                          # its loader sleeps an hour
    (work / "config.toml").write_text(NULL + '[loaders]\nplugins = ["fault_loaders"]\n')
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db", "--report",
                             "report.json", "--quiet"], cwd=work, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_recorded(work, "a.txt", proc)
        info = _status(work)
        assert info["in_use_by"] == f"ingest pid {proc.pid}" and info["files"] == 1, info
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.communicate(timeout=60)
    assert proc.returncode == 130
    last = _status(work)["last_run"]
    assert (last["exit_code"], last["signal"], last["by_status"]) == (130, "SIGINT", {"ingested": 1, "failed": 1})
    assert last["failed"] == [{"path": "b.sleep", "error": INTERRUPTED}], last


@pytest.mark.slow
def test_status_of_a_server_collection(work: Path, milvus_uri: str) -> None:
    (work / "docs" / "a.txt").write_text(TEXT)
    assert run_on(milvus_uri, "status_h23", work, config=NULL).rc == 0
    res = ingest("status", "--store", milvus_uri, "--collection", "status_h23", "--json", cwd=work)
    assert res.rc == 0, res.stderr
    info = json.loads(res.stdout)
    assert (info["files"], info["backend"], info["dim"], info["in_use_by"]) == (1, "null", 384, None), info
    assert info["last_run"]["exit_code"] == 0 and info["last_run"]["report"] == str(work / "report.json")
    res = ingest("status", "--store", milvus_uri, "--collection", "status_h23_never", cwd=work)
    assert res.rc == 2 and "collection 'status_h23_never' on" in res.stderr and "does not exist" in res.stderr
