"""`ingest watch` never prunes what it cannot see and never feeds itself (issue 30, items 4-8): real watch
processes on real folders and a real store (null encode backend), real file changes and signals."""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import test_watch as w


def _watches(pid: int) -> int:
    """The inotify watches process `pid` holds."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                count += sum(1 for line in info if line.startswith("inotify wd:"))
        except OSError:
            continue
    return count


def _syncs(work: Path) -> int:
    return w._err(work).count("watch: synced ")


@pytest.mark.slow
def test_a_folder_that_goes_away_is_waited_for_and_nothing_is_pruned(work: Path) -> None:
    (work / "config.toml").write_text(w.NULL)
    docs = work / "docs"
    (docs / "docs").mkdir()                                  # a subfolder of the same name
    (docs / "a.txt").write_text("Penguins huddle together through the polar night. " * 20)
    (docs / "docs" / "x.txt").write_text("Walruses haul out on the sea ice in spring. " * 20)
    proc = w._start(work)
    w._until(w._synced(work, {"a.txt": "ingested", "docs/x.txt": "ingested"}), "the files ingested", proc, work)
    report = work / "store.db.report.json"
    synced_at = report.stat().st_mtime_ns

    docs.rename(work / "moved")                              # renamed away: its files still exist
    w._until(lambda: "is gone" in w._err(work) or report.stat().st_mtime_ns != synced_at,
             "said the folder is gone (or synced)", proc, work)
    time.sleep(4 * w.DEBOUNCE)                               # a sync would have come by now
    assert set(w._recorded(work)) == {"a.txt", "docs/x.txt"}, "nothing is pruned while the folder is gone"
    assert report.stat().st_mtime_ns == synced_at, "no sync while the folder is gone"
    assert w._err(work).count("is gone") == 1, w._err(work)

    docs.mkdir()                                             # another folder at its path: synced as it is
    (docs / "c.txt").write_text("Albatrosses glide for hours without a wingbeat. " * 20)
    w._until(w._synced(work, {"c.txt": "ingested"}), "the new folder synced", proc, work)
    assert "is back" in w._err(work)
    (docs / "d.txt").write_text("Terns fly from pole to pole every year. " * 20)      # seen by a new notifier
    w._until(w._synced(work, {"d.txt": "ingested"}), "a new file in the new folder synced", proc, work)
    assert set(w._recorded(work)) == {"c.txt", "d.txt"}
    w._stop(proc, signal.SIGTERM)
    assert proc.returncode == 143, w._err(work)


@pytest.mark.slow
def test_the_report_inside_the_folder_never_causes_a_sync(work: Path) -> None:
    (work / "config.toml").write_text(w.NULL)
    docs = work / "docs"
    (docs / "a.txt").write_text("Penguins huddle together through the polar night. " * 20)
    proc = w._start(work, "--report", "docs/run.json", quiet=False)
    w._until(lambda: "watch: watching" in w._err(work), "the first sync done", proc, work)
    assert (docs / "run.json").is_file() and (docs / "run.html").is_file()
    time.sleep(4 * w.DEBOUNCE)
    assert _syncs(work) == 0, f"the report's own files caused syncs: {w._err(work)}"

    (docs / "c.txt").write_text("Albatrosses glide for hours without a wingbeat. " * 20)
    w._until(lambda: _syncs(work), "a new file synced", proc, work)
    time.sleep(4 * w.DEBOUNCE)
    assert _syncs(work) == 1, f"one change, one sync: {w._err(work)}"
    w._stop(proc, signal.SIGTERM)
    assert proc.returncode == 143


@pytest.mark.slow
def test_watch_watches_only_what_the_scan_reads(work: Path) -> None:
    (work / "config.toml").write_text(w.NULL + '[run]\nfollow_symlinks = "all"\n')
    outside = work / "outside"
    for i in range(200):                                     # a big tree behind a link to a folder
        (outside / f"f{i:03d}").mkdir(parents=True)
    (outside / "ext.txt").write_text("Skuas steal fish from other seabirds. " * 20)
    docs = work / "docs"
    (docs / "sub").mkdir()
    (docs / "a.txt").write_text("Penguins huddle together through the polar night. " * 20)
    (docs / "tree").symlink_to(outside, target_is_directory=True)          # the scan never follows it
    (docs / "ext.txt").symlink_to(outside / "ext.txt")                   # followed: "all"
    proc = w._start(work)
    w._until(w._synced(work, {"a.txt": "ingested", "ext.txt": "ingested", "tree": "skipped"}), "the first sync",
             proc, work)
    assert _watches(proc.pid) == 3, "docs, docs/sub and the followed file outside; not the linked tree"

    synced_at = (work / "store.db.report.json").stat().st_mtime_ns
    (outside / "f007" / "new.txt").write_text("Nothing the scan reads. " * 20)
    time.sleep(4 * w.DEBOUNCE)
    assert (work / "store.db.report.json").stat().st_mtime_ns == synced_at, "a change the scan never reads: no sync"

    with open(outside / "ext.txt", "a") as out:             # the followed target changes
        out.write("Skuas also hunt lemmings on the tundra. " * 20)
    w._until(lambda: w._recorded(work).get("ext.txt") == (outside / "ext.txt").stat().st_size,
             "the followed file's change synced", proc, work)
    (docs / "sub" / "deeper").mkdir()                       # a new folder: watched from now on
    (docs / "sub" / "deeper" / "b.txt").write_text("Gannets dive from thirty metres. " * 20)
    w._until(w._synced(work, {"sub/deeper/b.txt": "ingested"}), "a file in a new folder synced", proc, work)
    time.sleep(w.DEBOUNCE)
    (docs / "sub" / "deeper" / "c.txt").write_text("Puffins carry ten fish at once. " * 20)
    w._until(w._synced(work, {"sub/deeper/c.txt": "ingested"}), "a later file in the new folder synced", proc,
             work)
    assert _watches(proc.pid) == 4
    w._stop(proc, signal.SIGTERM)


def test_targets_stay_within_the_inotify_limit(tmp_path: Path) -> None:
    from ingest.watch_tree import budget, targets

    root = tmp_path / "root"
    for folder in ("a/c/e", "b/d"):
        (root / folder).mkdir(parents=True)
    (root / "link").symlink_to(tmp_path, target_is_directory=True)
    every = targets(str(root), "inside", None)
    assert [Path(f).relative_to(root).as_posix() for f in every.folders] == [".", "a", "b", "a/c", "b/d", "a/c/e"]
    assert every.complete                                    # breadth first, never the link
    some = targets(str(root), "inside", 3)
    assert [Path(f).relative_to(root).as_posix() for f in some.folders] == [".", "a", "b"] and not some.complete
    limit = int(Path("/proc/sys/fs/inotify/max_user_watches").read_text())
    assert 0 < budget() < limit


@pytest.mark.slow
def test_a_file_written_without_pause_holds_back_only_itself(work: Path) -> None:
    (work / "config.toml").write_text(w.NULL)
    docs = work / "docs"
    (docs / "a.txt").write_text("Penguins huddle together through the polar night. " * 20)
    proc = w._start(work)
    w._until(w._synced(work, {"a.txt": "ingested"}), "the first sync", proc, work)
    stop, written = threading.Event(), {}

    def write_log(name: str) -> None:
        with open(docs / name, "a") as log:
            while not stop.wait(0.1):
                log.write(f"{time.time():.3f} the colony counted again\n")
                log.flush()
        written[name] = (docs / name).stat().st_size

    for new, log in (("b.txt", "busy.txt"), ("c.txt", "busy.txt")):     # a new busy file, then a recorded one
        stop.clear()
        writer = threading.Thread(target=write_log, args=(log,))
        writer.start()
        try:
            time.sleep(1.5 * w.DEBOUNCE)
            (docs / new).write_text("Albatrosses glide for hours without a wingbeat. " * 20)
            report = w._until(w._synced(work, {new: "ingested"}), f"{new} synced while {log} is written", proc, work,
                              timeout=40)
            assert writer.is_alive(), f"{new} waited for {log} to stop"
            held = {f["path"]: f for f in report["files"]}[log]
            assert "still being written" in (held.get("error") or " ".join(held.get("warnings", []))), held
            assert held["status"] == ("skipped" if new == "b.txt" else "unchanged")
        finally:
            stop.set()
            writer.join()
        w._until(lambda: w._recorded(work).get(log) == written[log], f"{log} synced once quiet", proc, work)
    w._stop(proc, signal.SIGTERM)


def test_watch_takes_the_engine_flags_of_run(work: Path) -> None:
    (work / "docs" / "a.txt").write_text("Penguins huddle together through the polar night. " * 20)
    proc = w._start(work, "--backend", "null", "--devices", "cpu", "--engine", "local")     # no config file
    report = w._until(w._synced(work, {"a.txt": "ingested"}), "the first sync", proc, work)
    assert report["totals"]["backend"] == "null"
    w._stop(proc, signal.SIGTERM)
    assert proc.returncode == 143, w._err(work)
