"""Issue 5: incremental, resumable runs; crash consistency under SIGKILL of the whole group."""
from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli_env, row_ids, run, sqlite, store_rows, wait_recorded

SMALL_CHUNKS = "[chunking]\nchunk_tokens = 24\noverlap_tokens = 4\n[run]\nmax_files_in_flight = 2\n"
SENTENCES = [
    "Rivers carve canyons over millions of years of patient erosion.",
    "Migrating geese fly in a V formation to save energy on long journeys.",
    "Old lighthouses used clockwork to turn their heavy lenses at night.",
    "Sourdough bread rises slowly because of wild yeast and bacteria.",
    "Coral reefs shelter a quarter of all marine species in warm seas.",
    "Volcanic soil is rich in minerals that help vineyards flourish.",
]


def rows_by_source(work: Path) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for r in store_rows(work):
        out.setdefault(r["source"], set()).add(r["file_hash"])
    return out


@pytest.mark.slow
def test_incremental_change_touch_prune_and_settings(work: Path) -> None:
    docs = work / "docs"
    for i, s in enumerate(SENTENCES[:4]):
        (docs / f"f{i}.txt").write_text(" ".join([s] * 3))
    first = run(docs, work, config=SMALL_CHUNKS)
    assert first.rc == 0, first.stderr
    total = first.report["totals"]["chunks"]
    assert len(row_ids(work)) == total

    again = run(docs, work, config=SMALL_CHUNKS)
    assert {f["status"] for f in again.report["files"]} == {"unchanged"}
    assert "encode" not in again.report["totals"]["chunks_per_s"]          # nothing was encoded
    assert again.report["totals"]["seconds"] < 15

    (docs / "f0.txt").write_text(SENTENCES[3])                              # changed content
    os.utime(docs / "f1.txt", ns=(time.time_ns(), time.time_ns() + 10**9))  # touched only
    (docs / "f2.txt").unlink()                                              # removed
    (docs / "f3.txt").write_text("  \n")                                    # emptied (was ingested)
    changed = run(docs, work, config=SMALL_CHUNKS)
    files = changed.by_path()
    assert files["f0.txt"]["status"] == "ingested" and files["f1.txt"]["status"] == "unchanged"
    assert files["f3.txt"]["status"] == "skipped" and "were removed" in files["f3.txt"]["warnings"][0]
    hashes = rows_by_source(work)
    assert len(hashes["f0.txt"]) == 1                                       # only the new version's rows
    assert "f2.txt" in hashes                                               # kept until --prune
    assert "f3.txt" not in hashes                                           # an emptied file's rows go
    pruned = run(docs, work, "--prune", config=SMALL_CHUNKS)
    assert pruned.report["totals"]["pruned"] == 1
    assert "f2.txt" not in rows_by_source(work)
    expected = sum(f["chunks"] for f in pruned.report["files"])
    assert len(row_ids(work)) == expected

    other = run(docs, work, config="[chunking]\nchunk_tokens = 40\noverlap_tokens = 4\n")
    assert other.rc == 2 and "--reembed" in other.stderr and other.stderr.strip().count("\n") == 0
    redo = run(docs, work, "--reembed", config="[chunking]\nchunk_tokens = 40\noverlap_tokens = 4\n")
    assert redo.rc == 0 and {f["status"] for f in redo.report["files"]} == {"ingested", "skipped"}
    assert len(row_ids(work)) == redo.report["totals"]["chunks"]


def _kill_group_when(work: Path, wait) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "ingest.cli", "run", "docs", "--store", "store.db",
                             "--report", "report.json", "--quiet"], cwd=work, env=cli_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    time.sleep(1)


def _recorded(work: Path) -> int:
    """Files the manifest records (0 before the first one is written)."""
    db = work / "store.db.documents.manifest.sqlite"
    if not db.exists():
        return 0
    with sqlite(db) as con:
        try:
            return con.execute("SELECT count(*) FROM files").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


@pytest.mark.slow
def test_kill_and_resume_matches_a_clean_run(tmp_path: Path) -> None:
    """Each .gatetxt file loads once the test opens its gate, so every kill lands mid-run, whatever the
    machine's speed (files that load together may share an encode group and be written together)."""
    config = SMALL_CHUNKS + '[loaders]\nplugins = ["fault_loaders"]\n'
    clean, crashed = tmp_path / "clean", tmp_path / "crashed"
    names = [f"d{i}.gatetxt" for i in range(len(SENTENCES))]
    for work in (clean, crashed):
        (work / "docs").mkdir(parents=True)
        (work / "gates").mkdir()
        for name, s in zip(names, SENTENCES):
            (work / "docs" / name).write_text(" ".join([s] * 4))
        (work / "config.toml").write_text(config)

    def open_gates(work: Path, *opened: str) -> None:
        for name in opened:
            (work / "gates" / name).touch()

    open_gates(clean, *names)
    reference = run(clean / "docs", clean, config=config)
    assert reference.rc == 0, reference.stderr

    _kill_group_when(crashed, lambda: time.sleep(1))     # during start-up: no gate is open
    assert _recorded(crashed) == 0
    open_gates(crashed, names[0])
    _kill_group_when(crashed, lambda: wait_recorded(crashed, names[0]))
    assert _recorded(crashed) == 1                                           # the kill landed mid-run
    open_gates(crashed, names[1], names[2])
    _kill_group_when(crashed, lambda: (wait_recorded(crashed, names[1]), wait_recorded(crashed, names[2])))
    assert _recorded(crashed) == 3
    open_gates(crashed, *names)
    resumed = run(crashed / "docs", crashed, config=config)
    assert resumed.rc == 0, resumed.stderr
    ids = row_ids(crashed)
    assert len(ids) == len(set(ids)) == len(row_ids(clean)) == reference.report["totals"]["chunks"]
    assert sorted(ids) == sorted(row_ids(clean))                            # same chunks, same ids
    shutil.rmtree(tmp_path)
