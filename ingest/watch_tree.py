"""What `ingest watch` watches and ignores: the folders the scan reads, each with a watch of its own, within
the inotify watches the system leaves this user; never the run's own outputs or the store's files.

NOTE (the notifier):
- watchfiles' recursive mode follows links to folders, which the scan never does (a link to /usr cost
  15,450 inotify watches). So `targets` walks the folder as the scan would (real folders only; with
  [run] follow_symlinks = "all", also the targets outside the folder of links to files, which the scan
  reads) and each is watched alone (recursive=False), breadth first, at most `budget()` of them: the
  system's fs.inotify.max_user_watches less what this user's processes hold and SPARE. A tree with
  more is said in one line; changes in the folders left out are synced with the next change seen.
- A new folder (created, or moved in) has no watch yet: the notifier starts anew, walking the tree
  again, as soon as it is seen (also when a followed target outside changes: it may be a new file).
  Its change is pending, so a sync follows the new notifier and sees whatever happened in between.
- Ignored (`ignore`): every file a run writes for its report (ingest.outputs.report_outputs: the JSON,
  its HTML page, the spool, their .tmp files) and, for a Milvus Lite store, the .db and everything
  named after it (lock, manifest, default report), so a sync never causes the next.
"""
from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ingest.outputs import report_outputs
from ingest.store import local_path

MAX_WATCHES = "/proc/sys/fs/inotify/max_user_watches"
SPARE = 1024          # inotify watches left to this user's other programs
STEP_MS = 50          # the notifier looks for changes (and at the stop Event) this often
STARTS = 3            # tries to start a notifier while folders vanish under the walk

Change = tuple[Any, str]        # watchfiles' (Change, path)


@dataclass
class Targets:
    """What a notifier watches: folders (real ones, breadth first) and followed files outside the folder."""
    folders: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)
    complete: bool = True       # False: the tree holds more than the limit (those past it are not watched)

    @property
    def paths(self) -> list[str]:
        return self.folders + self.outside


def targets(root: str, follow_symlinks: str, limit: int | None,
            keep: Callable[[str], bool] = lambda path: True) -> Targets:
    """The folders under `root` (itself first) that the scan reads, breadth first, a folder's entries by name;
    with follow_symlinks "all", the targets outside `root` of its links to files; at most `limit` in all;
    none that `keep` refuses (nor what they hold)."""
    inside = os.path.realpath(root)
    found, queue = Targets(), deque([root])
    while queue:
        folder = queue.popleft()
        if limit is not None and len(found.folders) >= limit:
            found.complete = False
            break
        found.folders.append(folder)
        try:
            with os.scandir(folder) as it:
                entries = sorted(((e.name, e) for e in it), key=lambda item: item[0])
        except OSError:                       # gone, or unreadable: the scan says so, nothing to watch below
            continue
        for _, entry in entries:
            try:
                if not keep(entry.path):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    queue.append(entry.path)
                elif follow_symlinks == "all" and entry.is_symlink():
                    target = os.path.realpath(entry.path)
                    if os.path.commonpath((inside, target)) != inside and os.path.isfile(target):
                        found.outside.append(target)
            except OSError:
                continue
    room = None if limit is None else max(0, limit - len(found.folders))
    if room is not None and len(found.outside) > room:
        found.outside, found.complete = found.outside[:room], False
    return found


def budget() -> int | None:
    """How many inotify watches a notifier may add: fs.inotify.max_user_watches less those this user's
    processes hold, less SPARE; None where there is no such limit (not Linux)."""
    try:
        limit = int(Path(MAX_WATCHES).read_text())
    except (OSError, ValueError):
        return None
    return max(1, limit - _held() - SPARE)


def _held() -> int:
    """The inotify watches this user's processes hold (those it may read: its own)."""
    held = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") != "anon_inode:inotify":
                    continue
                with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                    held += sum(1 for line in info if line.startswith("inotify wd:"))
            except OSError:
                continue
    return held


def ignore(uri: str, report: Path) -> Callable[[Any, str], bool]:
    """watchfiles' filter: False for the run's outputs and a Lite store's files (NOTE)."""
    mine = {str(p) for p in report_outputs(report)}
    store = str(local_path(uri)) if local_path(uri) else None
    below = (store + "/", store + ".") if store else ()
    return lambda change, path: path not in mine and path != store and not (below and path.startswith(below))


class Notifier:
    """watchfiles on the targets of `root` (NOTE): `start` (again), `changes`, `close`; `said`: the lines
    to print (a tree past the limit), taken by the caller."""

    def __init__(self, root: Path, follow_symlinks: str, watch_filter: Callable[[Any, str], bool], stop_event: Any,
                 wait_ms: int):
        self.root, self.follow, self.filter, self.stop_event, self.wait_ms = root, follow_symlinks, watch_filter, \
            stop_event, wait_ms
        self.said: list[str] = []
        self._told_limit = False
        self._gen: Iterator[set[Change]] | None = None
        self._folders: set[str] = set()           # what the notifier watches
        self._outside: set[str] = set()
        self._early: set[Change] = set()          # what the new notifier saw while starting

    @property
    def running(self) -> bool:
        return self._gen is not None

    def start(self) -> None:
        """(Re)start on the tree as it is now. OSError if `root` is gone."""
        import watchfiles

        self.close()
        for attempt in range(STARTS):
            found = targets(str(self.root), self.follow, budget(), lambda path: self.filter(None, path))
            gen = watchfiles.watch(*found.paths, watch_filter=self.filter, stop_event=self.stop_event, step=STEP_MS,
                                   debounce=max(self.wait_ms, 200), rust_timeout=self.wait_ms, yield_on_timeout=True,
                                   raise_interrupt=False, ignore_permission_denied=True, recursive=False)
            try:
                self._early |= next(gen, None) or set()       # watching from here on
            except OSError:                   # a folder vanished after the walk: walk again
                if attempt == STARTS - 1 or not self.root.is_dir():
                    raise
                continue
            self._gen, self._folders, self._outside = gen, set(found.folders), set(found.outside)
            break
        if not found.complete and not self._told_limit:
            self._told_limit = True
            self.said.append(f"watch: {self.root} holds more folders than the {len(found.paths)} inotify "
                             f"watches this user has left ({MAX_WATCHES}); changes in the others are synced with the "
                             "next change seen: raise fs.inotify.max_user_watches to watch them all")

    def changes(self) -> set[Change]:
        """The changes within the next wait (an empty set after it without any); a new folder starts the
        notifier anew (NOTE). Not running: waits, and gives none."""
        if self._gen is None:
            self.stop_event.wait(self.wait_ms / 1000)
            return set()
        batch = (next(self._gen, None) or set()) | self._early
        self._early = set()
        if any(self._restarts(change, path) for change, path in batch):
            try:
                self.start()
            except OSError:                   # the folder is gone: the caller sees it
                self.close()
        return batch

    def _restarts(self, change: Any, path: str) -> bool:
        if path in self._outside:
            return True
        return change.name == "added" and path not in self._folders and os.path.isdir(path) \
            and not os.path.islink(path)

    def close(self) -> None:
        if self._gen is not None:
            self._gen.close()           # type: ignore[attr-defined]    # the Rust notifier stops
            self._gen = None
