"""`ingest watch FOLDER`: keep a store in sync with a folder, one sync after another.

NOTE (syncs, the folder, debounce, stopping and timeouts):
- A sync is one `Run(cfg, [folder], prune=True)`: exactly `ingest run FOLDER --prune` (an unchanged file
  costs a stat, a changed one is re-ingested, a deleted one removed, a rename is both), with its
  per-file isolation, its report (each sync writes it, at `ingest run`'s path) and its exit codes.
  The first sync runs at start, so a restart resumes from the manifest.
- The pipeline stays warm (ingest/engines/warm.py NOTE; the local engine): the first sync opens the collection
  and starts the processes, and watch keeps them until it ends: the store (Lite: its flock, and its host,
  which `ingest search` reaches on its private socket: ingest/store/lite_host.py NOTE; `ingest status` reads
  the manifest; Qdrant's local mode is opened by each sync instead), the loader pools, the encode workers
  (started right after the first sync; stopped after an idle hour, started again by the next sync that
  encodes) and the writer processes. A sync is a new `Run` (its scan, report and ledger), not new processes.
  Idle, every process sleeps in a blocking wait with a timeout.
- The notifier (ingest/watch_tree.py NOTE: the folders the scan reads, one watch each, never a link to a
  folder; the run's outputs and the store's files ignored) collects changes, also while a sync runs
  (they are handed over after it, and lead to the next).
- The folder is the one watch started on (device and inode), checked at every wait and right before
  every sync, which must also resolve to it. Gone (deleted, renamed away, not a folder): no sync, so
  nothing is pruned, said once, until a folder is there again; then, or when the path holds another
  folder, the notifier starts anew on it and a sync follows.
- Debounce, per changed path: a path is settled once no change came for `debounce_s` and it still has the
  size and mtime of its last change (else its wait starts over), or capped MAX_WAIT_S (at least 10
  debounces) after its first change. A sync starts when some path is settled or capped and the others
  are not part of a burst still arriving (each unsettled path changing for `debounce_s` already, or
  none left). The unsettled files are held back from that sync (`_Holding`: a known one keeps its last
  version, reported unchanged; a new one is skipped; both with HELD) and stay pending: a file written
  without pause waits for its own quiet or its cap (then it is ingested as it is), never the others.
- Stop signals (SIGINT, SIGTERM): between syncs watch's own handler only records the signal and sets
  an Event that the notifier polls every STEP_MS; every wait has a timeout (the notifier's at most
  WAIT_MS, the retry's RETRY_S, both ending early once the Event is set) after which the flag is
  checked, so an idle watch exits within about half a second with 128 + the signal (130, 143). During
  a sync the run's handlers apply (ingest/engines/local.py NOTE: it writes what is encoded, its
  report, and ends with 130/143); watch then exits with that code. A signal in the instant between
  the check before a sync and the run's handlers is seen when that sync ends.
- A sync that cannot start because another process holds the store is retried every RETRY_S (said
  once). Any other error that stops a sync (config, model, backend, a store of other settings or not
  answering, the encoder) ends watch with its one line, exit 2, after that sync's report; a restart resumes.
"""
from __future__ import annotations

import os
import signal
import stat
import sys
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from ingest.config import ConfigError
from ingest.engines import engine_for
from ingest.engines.run import Run
from ingest.engines.warm import Pipeline
from ingest.files import FileRef, Outcome
from ingest.report import default_report_path
from ingest.scan import printable
from ingest.store import StoreError
from ingest.watch_tree import Notifier, ignore

WAIT_MS = 500         # at most this long in the notifier before watch looks at the clock and the stop flag
MAX_WAIT_S = 60.0     # a file that never settles is synced this long (or 10 debounces) after its first change
RETRY_S = 3.0         # a store in use by another process: try again after this long
IN_USE = " is in use by "     # in the StoreError of a store another run holds (Lite flock, server lease)
HELD = "still being written: held back from this sync until it has been quiet for {:g} s (at most {:g} s)"


class _Signals:
    """SIGINT and SIGTERM while entered (main thread only) set `stopping` and record the first signal."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.signum: int | None = None
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _Signals:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        self.stopping.set()

    @property
    def exit_code(self) -> int | None:
        return 128 + self.signum if self.signum is not None else None


def watch(cfg: dict[str, Any], folder: Path, *, quiet: bool = False, report_path: Path | None = None,
          debounce_s: float = 2.0, on_sync: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Sync the store with `folder` now, then after every settled change, until a stop signal: 130 or 143.
    Errors that stop a sync (other than a store in use) propagate, as `ingest run`'s (the CLI: exit 2).
    `on_sync(totals)`: told the report's totals after each sync that ran to its end (`ingest serve --watch`)."""
    if debounce_s < 0:
        raise ConfigError(f"--debounce must be 0 or more seconds, got {debounce_s:g}")
    folder = Path(folder).resolve()
    report = Path(report_path or default_report_path(cfg["store"]["uri"])).resolve()
    wait_ms = int(min(WAIT_MS, max(50, debounce_s * 250)))      # late by at most a quarter of the debounce
    pipeline = Pipeline(cfg) if cfg["run"]["engine"] != "ray" else None
    with _Signals() as signals:
        notifier = Notifier(folder, cfg["run"]["follow_symlinks"], ignore(cfg["store"]["uri"], report),
                            signals.stopping, wait_ms)
        released = True
        try:
            return _Watch(cfg, folder, report, quiet, debounce_s, signals, notifier, pipeline, on_sync).run()
        except StoreError:
            released = False                 # a store gone: as a run, leave its lease, trust nothing
            raise
        finally:
            notifier.close()                 # the notifier stops
            if pipeline is not None:
                pipeline.close(release=released)


@dataclass
class _Pending:
    """A changed path: its (size, mtime_ns) at its last change (None: gone), its first and last change."""
    stat: tuple[int, int] | None
    first: float
    last: float


class _Watch:
    """The loop of one `watch` (NOTE)."""

    def __init__(self, cfg: dict[str, Any], folder: Path, report: Path, quiet: bool, debounce_s: float,
                 signals: _Signals, notifier: Notifier, pipeline: Pipeline | None,
                 on_sync: Callable[[dict[str, Any]], None] | None = None):
        self.cfg, self.folder, self.report, self.quiet, self.debounce_s = cfg, folder, report, quiet, debounce_s
        self.signals, self.notifier, self.pipeline, self.on_sync = signals, notifier, pipeline, on_sync
        self.cap = max(MAX_WAIT_S, 10 * debounce_s)
        self.pending: dict[str, _Pending] = {}
        self.identity = _identity(folder)
        self.gone = False

    def run(self) -> int:
        self._start_notifier()
        if (code := self._sync(None, frozenset())) is not None:
            return code
        if self.pipeline is not None:
            self.pipeline.warm()
        self._say(f"watch: watching {self.folder} (debounce {self.debounce_s:g} s); Ctrl-C stops", always=False)
        while not self.signals.stopping.is_set():
            batch = self.notifier.changes()           # a set of changes, or an empty one after the wait
            if self.pipeline is not None:
                self.pipeline.rest()
            self._say(*self.notifier.said)
            self.notifier.said.clear()
            now = time.monotonic()
            if not self._here(any(path == str(self.folder) for _, path in batch)):
                continue
            for _, path in batch:
                seen = self.pending.get(path)
                self.pending[path] = _Pending(_stat(path), seen.first if seen else now, now)
            due = self._due(now) if self.pending else None
            if due is None:
                continue
            ready, held = due
            for path in ready:
                del self.pending[path]
            if (code := self._sync(len(ready), held)) is not None:
                return code
        return self.signals.exit_code if self.signals.exit_code is not None else 128 + signal.SIGTERM

    def _start_notifier(self) -> None:
        try:
            self.notifier.start()
        except OSError:                       # gone meanwhile: `_here` sees it
            self.notifier.close()

    def _here(self, touched: bool) -> bool:
        """Whether the folder is there to sync; gone: said once, the notifier stopped; back, or another folder
        at its path (`touched`: the folder itself changed, which may be a new one with a reused inode): a new
        notifier, and a sync of it all (a pending change of the folder)."""
        identity = _identity(self.folder)
        if identity is None:
            if not self.gone:
                self.gone = True
                self.notifier.close()
                self.pending.clear()
                self._say(f"watch: {self.folder} is gone (deleted, renamed or replaced); no sync, nothing removed "
                          "from the store, until the folder is back")
            return False
        if self.gone or identity != self.identity or touched:
            if self.gone or identity != self.identity:
                self._say(f"watch: {self.folder} is back; watching it again" if self.gone else
                          f"watch: {self.folder} is another folder now; watching it")
            self.gone, self.identity = False, identity
            self.pending.clear()
            self._start_notifier()
            since = time.monotonic() - self.debounce_s      # settled: synced at once
            self.pending[str(self.folder)] = _Pending(_stat(str(self.folder)), since, since)
        elif not self.notifier.running:
            self._start_notifier()
        return True

    def _due(self, now: float) -> tuple[list[str], frozenset[str]] | None:
        """The paths to sync now and the files held back from that sync, or None: no sync yet (NOTE)."""
        ready, unsettled = [], []
        for path, p in self.pending.items():
            if now - p.last >= self.debounce_s and (st := _stat(path)) != p.stat:
                p.stat, p.last = st, now      # changed without a notice (or just now): its wait starts over
            settled = now - p.last >= self.debounce_s or now - p.first >= self.cap
            (ready if settled else unsettled).append(path)
        if not ready or any(now - self.pending[path].first < self.debounce_s for path in unsettled):
            return None                       # nothing settled, or a burst of changes still arriving
        return ready, frozenset(s for path in unsettled if (s := self._source(path)))

    def _source(self, path: str) -> str | None:
        """The scan's name of a file under the folder, else None."""
        try:
            if not stat.S_ISREG(os.lstat(path).st_mode):
                return None
        except OSError:
            return None
        rel = os.path.relpath(path, self.folder)
        return None if rel.startswith("..") else printable(rel)

    def _sync(self, changes: int | None, held: frozenset[str]) -> int | None:
        """One run over the folder (`changes`: how many paths changed; None for the first sync, which talks as
        `ingest run` does unless quiet), `held` files held back; the exit code if watch is to stop, else None."""
        said = False
        while True:
            if self.signals.exit_code is not None:
                return self.signals.exit_code
            engine = _holding(engine_for(self.cfg), held, HELD.format(self.debounce_s, self.cap))
            warm = {"pipeline": self.pipeline} if self.pipeline is not None else {}
            run = engine(self.cfg, [self.folder], quiet=self.quiet or changes is not None, prune=True,
                         report_path=self.report, **warm)
            if (run.root, run.named) != (self.folder, None) or _identity(self.folder) != self.identity:
                return None                   # gone or replaced since: no sync (the next wait says so)
            try:
                run.execute()
            except StoreError as exc:
                if IN_USE not in str(exc):
                    raise
                if not said:
                    self._say(f"watch: {exc}; watch tries again every {RETRY_S:g} s")
                    said = True
                self.signals.stopping.wait(RETRY_S)
                continue
            break
        if run.signals.exit_code is not None:           # stopped during the sync: the run wrote its report
            return run.signals.exit_code
        if self.signals.exit_code is not None:          # came just before or after the run's handlers
            return self.signals.exit_code
        if self.on_sync is not None and run.totals is not None:
            self.on_sync(run.totals)
        if changes is not None:
            self._say(_line(run, changes, len(held), self.report), always=False)
        return None

    def _say(self, *lines: str, always: bool = True) -> None:
        """Print `lines` to stderr (`always`: also with --quiet)."""
        if always or not self.quiet:
            for line in lines:
                print(line, file=sys.stderr, flush=True)


def _holding(engine: type[Run], held: frozenset[str], why: str) -> type[Run]:
    """`engine`, whose scan hands on the files of `held` as held back (NOTE): a recorded one unchanged (its
    rows and manifest entry kept), a new one skipped; both with `why`."""
    if not held:
        return engine

    class Holding(engine):                    # type: ignore[valid-type, misc]
        def ingest(self, files: Iterator[tuple[FileRef, Outcome | None]]) -> None:
            super().ingest(self._hold(files))

        def _hold(self, files: Iterator[tuple[FileRef, Outcome | None]]) -> Iterator[tuple[FileRef, Outcome | None]]:
            for ref, problem in files:
                if problem is None and ref.source in held:
                    entry = self.col.known.get(ref.source)
                    if entry is not None:
                        ref = replace(ref, fmt=entry.format, file_hash=entry.file_hash)
                        problem = Outcome("unchanged", chunks=entry.chunks, warnings=(why,))
                    else:
                        problem = Outcome("skipped", why)
                yield ref, problem

    return Holding


def _line(run: Run, changes: int, held: int, report: Path) -> str:
    totals = run.totals                              # the report's
    said = [f"{n} {s}" for s in ("ingested", "empty", "failed", "skipped") if (n := totals["by_status"].get(s))]
    if totals["pruned"]:
        said.append(f"{totals['pruned']} removed")
    if held:
        said.append(f"{held} held back (still being written)")
    return (f"watch: synced {changes} change{'s' if changes != 1 else ''}: {', '.join(said) or 'nothing to do'} "
            f"(report: {report})")


def _identity(folder: Path) -> tuple[int, int] | None:
    """The folder's (device, inode), or None if it is not a folder (gone)."""
    try:
        st = os.stat(folder)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISDIR(st.st_mode) else None


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
