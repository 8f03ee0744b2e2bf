"""`ingest watch FOLDER`: keep a store in sync with a folder, one sync after another.

NOTE (syncs, debounce, stopping and timeouts):
- A sync is one `Run(cfg, [folder], prune=True)`: exactly `ingest run FOLDER --prune` (an unchanged file
  costs a stat, a changed one is re-ingested, a deleted one removed, a rename is both), with its
  per-file isolation, its report (each sync writes it, at `ingest run`'s path) and its exit codes.
  The first sync runs at start, so a restart resumes from the manifest. Each sync starts and stops
  its own pipeline and owns the store (Lite: its flock) only while it runs: between syncs watch has
  no pipeline process (only multiprocessing's resource tracker) and `ingest search` can read the store.
- watchfiles' notifier (a Rust thread, started before the first sync) collects changes, also while a
  sync runs (they are handed over after it, and lead to the next). Changes to the store's own files
  (the .db and everything named after it: lock, manifest, default report) and to the report (its
  spool and .tmp too) are ignored, so a sync never causes the next. A sync starts once no change came
  for `debounce_s` and every changed path still has the size and mtime it had at its last change
  (else the wait starts over): a file being written is ingested once it is complete. Changes that never
  settle (a log written to without pause) are synced MAX_WAIT_S (at least 10 debounces) after the
  first of them all the same, so they cannot hold the other files back for ever.
- Stop signals (SIGINT, SIGTERM): between syncs watch's own handler only records the signal and sets
  an Event that the notifier polls every STEP_MS; every wait has a timeout (the notifier's at most
  WAIT_MS, the retry's RETRY_S, both ending early once the Event is set) after which the flag is
  checked, so an idle watch exits within about half a second with 128 + the signal (130, 143). During
  a sync the run's handlers apply (ingest/engines/local.py NOTE: it writes what is encoded, its
  report, and ends with 130/143); watch then exits with that code. A signal in the instant between
  the check before a sync and the run's handlers is seen when that sync ends.
- A sync that cannot start because another process holds the store is retried every RETRY_S (said
  once). Any other error that stops a sync (config, model, backend, a store of other settings or not
  answering, the encoder) ends watch with its one line, exit 2; a restart resumes.
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ingest.config import ConfigError
from ingest.engines import engine_for
from ingest.engines.run import Run
from ingest.report import default_report_path
from ingest.store import StoreError, is_local

STEP_MS = 50          # the notifier looks for changes (and at the stop Event) this often
WAIT_MS = 500         # at most this long in the notifier before watch looks at the clock and the stop flag
MAX_WAIT_S = 60.0     # changes that never settle are synced after this long (or 10 debounces) all the same
RETRY_S = 3.0         # a store in use by another process: try again after this long
IN_USE = " is in use by "     # in the StoreError of a store another run holds (Lite flock, server lease)


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
          debounce_s: float = 2.0) -> int:
    """Sync the store with `folder` now, then after every settled change, until a stop signal: 130 or 143.
    Errors that stop a sync (other than a store in use) propagate, as `ingest run`'s (the CLI: exit 2)."""
    import watchfiles

    if debounce_s < 0:
        raise ConfigError(f"--debounce must be 0 or more seconds, got {debounce_s:g}")
    folder = Path(folder).resolve()
    report = Path(report_path or default_report_path(cfg["store"]["uri"])).resolve()
    wait_ms = int(min(WAIT_MS, max(STEP_MS, debounce_s * 250)))      # late by at most a quarter of the debounce
    with _Signals() as signals:
        changes = watchfiles.watch(folder, watch_filter=_not_ours(cfg["store"]["uri"], report),
                                   stop_event=signals.stopping, step=STEP_MS, debounce=max(wait_ms, 200),
                                   rust_timeout=wait_ms, yield_on_timeout=True, raise_interrupt=False,
                                   ignore_permission_denied=True)
        try:
            return _loop(cfg, folder, report, quiet, debounce_s, signals, changes)
        finally:
            changes.close()                  # the notifier stops


def _loop(cfg: dict[str, Any], folder: Path, report: Path, quiet: bool, debounce_s: float, signals: _Signals,
          changes: Any) -> int:
    pending: dict[str, tuple[int, int] | None] = {}     # changed path -> (size, mtime_ns) at its last change
    first = last = 0.0                       # when the oldest and the latest pending change were seen
    longest = max(MAX_WAIT_S, 10 * debounce_s)
    next(changes, None)                      # the notifier runs from here on (what it saw, the first sync sees)
    if (code := _sync(cfg, folder, report, quiet, signals, None)) is not None:
        return code
    if not quiet:
        print(f"watch: watching {folder} (debounce {debounce_s:g} s); Ctrl-C stops", file=sys.stderr, flush=True)
    for batch in changes:                    # a set of changes, or an empty one after wait_ms without any
        now = time.monotonic()
        if batch:
            first = first if pending else now
            pending.update((path, _stat(path)) for _, path in batch)
            last = now
        if not pending or signals.stopping.is_set():
            continue
        if now - first < longest:            # else a file that never stops changing would hold every sync back
            if batch or now - last < debounce_s:
                continue
            moved = {path: st for path in pending if (st := _stat(path)) != pending[path]}
            if moved:                        # changed without a notice (or just now): wait again
                pending.update(moved)
                last = now
                continue
        count = len(pending)
        pending.clear()
        if (code := _sync(cfg, folder, report, quiet, signals, count)) is not None:
            return code
    return signals.exit_code if signals.exit_code is not None else 128 + signal.SIGTERM


def _sync(cfg: dict[str, Any], folder: Path, report: Path, quiet: bool, signals: _Signals,
          changes: int | None) -> int | None:
    """One run over the folder (`changes`: how many paths changed; None for the first sync, which talks as
    `ingest run` does unless quiet); the exit code if watch is to stop, else None."""
    said = False
    while True:
        if signals.exit_code is not None:
            return signals.exit_code
        run = engine_for(cfg)(cfg, [folder], quiet=quiet or changes is not None, prune=True, report_path=report)
        try:
            code = run.execute()
        except StoreError as exc:
            if IN_USE not in str(exc):
                raise
            if not said:
                print(f"watch: {exc}; watch tries again every {RETRY_S:g} s", file=sys.stderr, flush=True)
                said = True
            signals.stopping.wait(RETRY_S)
            continue
        break
    if run.signals.exit_code is not None:           # stopped during the sync: the run wrote its report
        return run.signals.exit_code
    if signals.exit_code is not None:               # came just before or after the run's handlers
        return signals.exit_code
    if not quiet and changes is not None:
        print(_line(run, changes, report), file=sys.stderr, flush=True)
    return None


def _line(run: Run, changes: int, report: Path) -> str:
    totals = run.totals                              # the report's
    said = [f"{n} {s}" for s in ("ingested", "empty", "failed", "skipped") if (n := totals["by_status"].get(s))]
    if totals["pruned"]:
        said.append(f"{totals['pruned']} removed")
    return (f"watch: synced {changes} change{'s' if changes != 1 else ''}: {', '.join(said) or 'nothing to do'} "
            f"(report: {report})")


def _not_ours(uri: str, report: Path) -> Callable[[Any, str], bool]:
    """watchfiles' filter: False for the store's own files and the report's (NOTE)."""
    mine = [str(report)] + ([str(Path(uri).resolve())] if is_local(uri) else [])
    prefixes = tuple(p + sep for p in mine for sep in ("/", "."))
    return lambda change, path: path not in mine and not path.startswith(prefixes)


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns
