"""Commits off the hot path: while a group of files is being committed (its store flush and manifest
write), add() goes on taking and submitting the next files' rows. Real Milvus Lite (served by the
run's own host process, paused for real with SIGSTOP), real writer processes, real manifest. And the
report's first_row_s (seconds until the store first acknowledged rows)."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from conftest import run

from ingest import write
from ingest.files import FileRef, Finished, Outcome
from ingest.store.rows import Row, Rows
from ingest.store import Store
from ingest.store.manifest import SqliteManifest, manifest_path

GROUP = 10          # files per sealed group
BATCH = 4           # rows per batch: MAX_IN_FLIGHT batches of it may wait for the store


def _file(i: int) -> Finished:
    ref = FileRef(i, f"f{i:03d}.txt", f"/nowhere/f{i:03d}.txt", 10, 1, "txt", f"hash{i}")
    return Finished(ref, Outcome("ingested", chunks=1), record=True)


def _wait(until, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_add_goes_on_while_a_commit_waits_for_a_stopped_store(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write, "FLUSH_FILES", GROUP)
    monkeypatch.setattr(write, "FLUSH_EVERY_S", 3600.0)      # groups by file count only: deterministic
    uri = str(tmp_path / "store.db")
    store = Store(uri, "documents", timeout_s=60)
    store.lock()
    store.serve()
    manifest = SqliteManifest(manifest_path(uri, "documents"))
    accepted: list[int] = []
    written: list[int] = []
    writer = write.Writer(store, manifest, "test-model", "settings", BATCH, lambda files: accepted.extend(f.ref.seq for f in files),
                          lambda files: written.extend(f.ref.seq for f in files), "null")
    host = next(p for p in psutil.Process().children(recursive=True) if p.name() == "ingest-lite")
    rng = np.random.default_rng(0)

    def add(i: int) -> None:
        writer.add(_file(i), 0, Rows.of([Row(None, f"text of file {i}", "", "", "text", "", "")]),
                   rng.random((1, 8), dtype=np.float32), last=True)

    try:
        for i in range(GROUP):                  # a first group, committed with the store answering
            add(i)
        _wait(lambda: len(written) == GROUP, "the first group's commit")

        os.kill(host.pid, signal.SIGSTOP)       # the store stops answering: no commit can finish
        try:
            for i in range(GROUP, 2 * GROUP):   # the second group, sealed by its last add()...
                add(i)
            feeder = threading.Thread(target=lambda: [add(i) for i in range(2 * GROUP, 4 * GROUP)], daemon=True)
            feeder.start()                      # ...and the next files keep coming while it is committed
            # Files accepted after the seal, their rows submitted to the writer process, while the second
            # group's commit cannot finish. Before the committer thread, the add() that sealed a group
            # returned only after the commit: nothing was accepted meanwhile.
            _wait(lambda: len(accepted) >= 2 * GROUP + BATCH, "add() to go on during the commit", timeout=60)
            assert written == list(range(GROUP)), "a commit finished with its store stopped"
            assert writer._committing or writer._sealed, "the second group is not being committed"
        finally:
            os.kill(host.pid, signal.SIGCONT)
        feeder.join(timeout=120)
        assert not feeder.is_alive()
        writer.flush()
        assert written == list(range(4 * GROUP)), "Written events out of file order, or missing"
        assert set(manifest.all()) == {f"f{i:03d}.txt" for i in range(4 * GROUP)}
        assert len(store.rows(["id"])) == 4 * GROUP
    finally:
        writer.close()
        manifest.close()
        store.close()


def test_a_run_stopped_by_a_full_disk_removes_the_rows_of_files_it_will_not_record(tmp_path: Path) -> None:
    """write NOTE (stops): rows sent of files not recorded when the run stops go (a changed file keeps its entry's
    version, a new file none); without `abandon` (a signal's stop settles every file; an unreachable store) they stay."""
    uri = str(tmp_path / "store.db")
    store = Store(uri, "documents", timeout_s=60)
    store.lock()
    store.serve()
    manifest = SqliteManifest(manifest_path(uri, "documents"))
    rng = np.random.default_rng(0)

    def writer() -> write.Writer:
        return write.Writer(store, manifest, "test-model", "settings", BATCH, lambda files: None,
                            lambda files: None, "null")

    def add(w: write.Writer, i: int, version: str, last: bool) -> None:
        ref = FileRef(i, f"f{i:03d}.txt", f"/nowhere/f{i:03d}.txt", 10, 1, "txt", version)
        w.add(Finished(ref, Outcome("ingested", chunks=2), record=True), 0,
              Rows.of([Row(None, f"{version} text {i} {k}", "", "", "text", "", "") for k in range(BATCH)]),
              rng.random((BATCH, 8), dtype=np.float32), last=last)

    def versions() -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for r in store.rows(["source", "file_hash"]):
            out.setdefault(r["source"], set()).add(r["file_hash"])
        return out

    try:
        first = writer()
        add(first, 0, "old0", True)
        first.flush()
        first.close()
        for abandon in (False, True):
            w = writer()
            add(w, 0, f"new0-{abandon}", False)         # a changed file and a new one, each a batch sent,
            add(w, 1, f"new1-{abandon}", False)         # neither file's last part: never recorded
            with w._lock:
                w._take_answers(0)                      # both batches acknowledged: the rows are in the store
            assert w.rows_written == 2 * BATCH
            w.close(abandon=abandon)
            if abandon:
                assert versions() == {"f000.txt": {"old0"}}
            else:
                assert versions() == {"f000.txt": {"old0", "new0-False"}, "f001.txt": {"new1-False"}}
        assert {s: e.file_hash for s, e in manifest.all().items()} == {"f000.txt": "old0"}
    finally:
        manifest.close()
        store.close()


@pytest.mark.slow
def test_the_report_says_when_the_first_row_was_stored(work: Path) -> None:
    for i in range(3):
        (work / "docs" / f"d{i}.txt").write_text(f"Document {i} tells of penguins in the polar night. " * 20)
    res = run(work / "docs", work, "--backend", "null")
    assert res.rc == 0, res.stderr
    totals = res.report["totals"]
    assert 0 < totals["first_row_s"] <= totals["seconds"]
    rerun = run(work / "docs", work, "--backend", "null")       # unchanged: no row stored
    assert rerun.rc == 0 and rerun.report["totals"]["first_row_s"] is None, rerun.stderr


def test_the_encode_threads_last_event_is_read_before_the_thread_is_called_stopped() -> None:
    """The encode thread puts its error as its last act: a dispatcher whose get timed out just before must still
    read it (the run's one-line error), and call the thread stopped only when nothing of it is left."""
    import queue
    from types import SimpleNamespace

    from ingest.engines.local import LocalRun

    run = SimpleNamespace(events=queue.Queue())
    ended = threading.Thread(target=lambda: run.events.put("its error"))
    ended.start()
    ended.join()
    assert LocalRun._next_event(run, ended) == "its error"
    with pytest.raises(RuntimeError, match="the encode thread stopped unexpectedly"):
        LocalRun._next_event(run, ended)
    alive = threading.Thread(target=time.sleep, args=(2,))
    alive.start()
    assert LocalRun._next_event(run, alive) is None
    alive.join()
