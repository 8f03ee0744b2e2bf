"""Stop signals of a run: SIGINT (Ctrl-C) and SIGTERM are stop requests. Protocol: NOTE in ingest/engines/local.py;
the other processes' side: NOTE (stop signals) in workers/spawn.py."""
from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any, Callable

STOP_GRACE_S = 30.0     # after a first stop signal, at most this long to write what is encoded, then quit
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):
    """A stop signal while the run was starting (a BaseException, like KeyboardInterrupt: no step catches it)."""


class StopSignals:
    """Handles SIGINT and SIGTERM while entered (main thread only; elsewhere a no-op). The first signal
    sets `stopping` and raises Interrupted while the run starts, calls `on_stop` once it ingests; a second
    signal, or STOP_GRACE_S after the first, ends the process at once with 128 + the first signal."""

    def __init__(self, stopping: threading.Event, on_stop: Callable[[], None]):
        self.stopping, self._on_stop = stopping, on_stop
        self.signum: int | None = None
        self._ingesting = False
        self._grace: threading.Timer | None = None
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
        if self.signum is not None:
            self._quit(f"second stop signal ({signal.Signals(signum).name})")
        self.signum = signum
        self.stopping.set()
        self._grace = threading.Timer(STOP_GRACE_S, self._quit, (f"still stopping after {STOP_GRACE_S:g} s",))
        self._grace.daemon = True
        self._grace.start()
        if not self._ingesting:
            raise Interrupted
        self._on_stop()

    def _quit(self, why: str) -> None:
        """Quit now: what is recorded is durable, the rerun redoes the rest."""
        print(f"\ningest: {why}: quitting at once; a rerun redoes the files not recorded", file=sys.stderr, flush=True)
        os._exit(self.exit_code)
