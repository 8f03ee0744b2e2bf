"""Stop signals of a run: SIGINT (Ctrl-C) and SIGTERM are stop requests. Protocol: NOTE in ingest/engines/run.py;
the other processes' side: NOTE (stop signals) in workers/spawn.py."""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Callable

GRACE_ENV = "INGEST_STOP_GRACE_S"    # sets STOP_GRACE_S (a service manager's stop timeout must exceed it)
DEFAULT_GRACE_S = 30.0
QUIT_S = 15.0           # the most that quitting may take (the report from the spool) before the process ends anyway
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _grace_s() -> float:
    """STOP_GRACE_S: $INGEST_STOP_GRACE_S if it is a positive number of seconds, else DEFAULT_GRACE_S."""
    value = os.environ.get(GRACE_ENV)
    try:
        seconds = float(value) if value else DEFAULT_GRACE_S
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        print(f"warning: {GRACE_ENV}={value!r} is not a positive number of seconds; the stop grace is "
              f"{DEFAULT_GRACE_S:g} s", file=sys.stderr)
        return DEFAULT_GRACE_S
    return seconds


STOP_GRACE_S = _grace_s()   # after a first stop signal, at most this long to write what is encoded, then quit


class Interrupted(BaseException):
    """A stop signal while the run was starting (a BaseException, like KeyboardInterrupt: no step catches it)."""


class StopSignals:
    """Handles SIGINT and SIGTERM while entered (main thread only; elsewhere a no-op). The first signal
    sets `stopping` and raises Interrupted while the run starts, calls `on_stop` once it ingests; a second
    signal, or STOP_GRACE_S after the first, quits: `on_quit(why)` (the report from the spool) in a thread
    of its own, then the process ends with 128 + the first signal (within QUIT_S in any case)."""

    def __init__(self, stopping: threading.Event, on_stop: Callable[[], None],
                 on_quit: Callable[[str], None]):
        self.stopping, self._on_stop, self._on_quit = stopping, on_stop, on_quit
        self.signum: int | None = None
        self._ingesting = False
        self._grace: threading.Timer | None = None
        self._quitting = threading.Lock()
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.getsignal(s) for s in SIGNALS}
            for s in SIGNALS:
                signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._old.items():
            signal.signal(s, handler)
        if self._grace is not None:
            self._grace.cancel()

    @property
    def name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    @property
    def exit_code(self) -> int | None:
        return 128 + self.signum if self.signum is not None else None

    def ingesting(self) -> None:
        """From now on a signal asks the run to stop (on_stop) instead of raising Interrupted."""
        self._ingesting = True
        if self.stopping.is_set():            # a signal came while a step caught Interrupted
            raise Interrupted

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:           # in a thread: the main thread may hold what on_quit waits for
            threading.Thread(target=self._quit, args=(f"a second stop signal ({signal.Signals(signum).name})",),
                             name="ingest-quit", daemon=True).start()
            return
        self.signum = signum
        self.stopping.set()
        self._grace = threading.Timer(STOP_GRACE_S, self._quit, (f"still stopping after the {STOP_GRACE_S:g} s "
                                                                 "stop grace",))
        self._grace.daemon = True
        self._grace.start()
        if not self._ingesting:
            raise Interrupted
        self._on_stop()

    def _quit(self, why: str) -> None:
        """Quit now: the report from the spool (on_quit), then the exit; what is recorded is durable, the
        rerun redoes the rest."""
        if not self._quitting.acquire(blocking=False):
            return                            # the other quit (grace or second signal) ends the process
        deadline = threading.Timer(QUIT_S, os._exit, (self.exit_code,))
        deadline.daemon = True
        deadline.start()
        print(f"\ningest: {why}: quitting now; the report lists the files not recorded as interrupted, "
              "a rerun redoes them", file=sys.stderr, flush=True)
        try:
            self._on_quit(why)
        except BaseException as exc:          # nothing may keep the process from ending
            print(f"ingest: quitting without a report: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        finally:
            os._exit(self.exit_code)
