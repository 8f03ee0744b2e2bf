"""Issue 9: a failure belongs to one file and the report is always written: refused rows, chunks
the encoder cannot embed, over-long text, a broken loader pool, bad plugins. Real CLI, real Milvus."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import psutil

from conftest import run, store_rows

FAULTS = '[loaders]\nplugins = ["fault_loaders"]\n'


@pytest.mark.slow
def test_refused_rows_and_unencodable_chunks_fail_only_their_file(work: Path, monkeypatch) -> None:
    docs = work / "docs"
    (docs / "a.txt").write_text("Otters hold hands while they sleep on the water.")
    (docs / "b.bignum").write_text("This loader reports a page number the store cannot hold.")
    (docs / "c.txt").write_text("The POISON chunk makes the encoder raise every time it sees it.")
    (docs / "d.txt").write_text("word " * 20 + "x" * 150_000 + " tail")       # one [UNK] token, 150 kB
    (docs / "e.txt").write_text("Lighthouses guide ships past rocky coasts at night.")
    monkeypatch.setenv("INGEST_FAULT", json.dumps({"match": "POISON", "action": "raise"}))
    res = run(docs, work, config=FAULTS)
    assert res.rc == 1, res.stderr
    files = res.by_path()
    assert [files[n]["status"] for n in ("a.txt", "d.txt", "e.txt")] == ["ingested"] * 3
    assert files["b.bignum"]["status"] == "failed" and "store refused" in files["b.bignum"]["error"]
    assert files["c.txt"]["status"] == "failed" and "could not be encoded" in files["c.txt"]["error"]
    assert "injected fault" in files["c.txt"]["error"]
    assert any("cut into pieces" in w for w in files["d.txt"]["warnings"]) and files["d.txt"]["chunks"] >= 3
    rows = store_rows(work)
    assert {r["source"] for r in rows} == {"a.txt", "d.txt", "e.txt"}
    assert len(rows) == res.report["totals"]["chunks"]

    again = run(docs, work, config=FAULTS)                 # failed files are retried, the rest unchanged
    statuses = {p: f["status"] for p, f in again.by_path().items()}
    assert statuses == {"a.txt": "unchanged", "b.bignum": "failed", "c.txt": "failed", "d.txt": "unchanged",
                        "e.txt": "unchanged"}
    assert sorted(r["id"] for r in store_rows(work)) == sorted(r["id"] for r in rows)


@pytest.mark.slow
def test_dead_loader_pool_is_replaced_and_the_retry_is_proven(work: Path) -> None:
    docs = work / "docs"
    (docs / "a.killtxt").write_text("The killer kills the idle txt worker from the pdf pool.")
    for i in range(5):
        (docs / f"b{i}.note").write_text(f"Note {i}: moss grows on the north side of trees in this forest.")
    (docs / "c.flaky").write_text("The flaky loader dies on its first attempt and loads on its second.")
    # One chunk in flight: the .note files wait for the encoder, so the txt pool still has work to
    # submit when the killer strikes (with more, every load can finish first and the break go unseen).
    res = run(docs, work, config=FAULTS + "[run]\nmax_files_in_flight = 2\nmax_chunks_in_flight = 1\n")
    assert res.rc == 0, res.stderr
    assert {f["status"] for f in res.report["files"]} == {"ingested"}
    assert res.report["totals"]["pools_replaced"] >= 1                   # the idle peer's death broke the pool
    killed = {int(p) for p in (work / "pids.log").read_text().split()}
    assert killed and not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                              for p in killed)
    attempts = (work / "c.flaky.attempts").read_text().split()
    assert len(attempts) == 2 and attempts[0] != attempts[1]             # retried, in a fresh worker
    assert len(store_rows(work)) == res.report["totals"]["chunks"]


def test_bad_plugins_stop_the_run_with_one_line(work: Path) -> None:
    (work / "docs" / "a.txt").write_text("Any text.")
    missing = run(work / "docs", work, config='[loaders]\nplugins = ["no_such_plugin_module"]\n')
    assert missing.rc == 2 and "no_such_plugin_module" in missing.stderr
    assert missing.stderr.strip().count("\n") == 0
    long_name = run(work / "docs", work, config='[loaders]\nplugins = ["long_format_plugin"]\n')
    assert long_name.rc == 2 and "shorter name" in long_name.stderr
    assert long_name.stderr.strip().count("\n") == 0
