"""A task's failure as a value (like pebble's ProcessExpired), never an exception in flight."""
from __future__ import annotations

import signal
from dataclasses import dataclass


@dataclass(frozen=True)
class Failure:
    """Where a task failed, with the process that ran it. None of it carries a file's bytes."""
    where: str                 # e.g. "pdf loader", "encode worker cpu"
    error: str                 # one line for the user
    pid: int | None = None
    exitcode: int | None = None
    traceback: str | None = None
    skip: bool = False         # the input is unsupported here (reported as skipped, not failed)

    @property
    def line(self) -> str:
        """The report's line for it (a task whose worker died was retried once in a fresh one: workers/pool.py)."""
        if self.exitcode is not None and self.pid is not None:
            return f"{self.error} (pid {self.pid}); retried once in a fresh worker"
        return self.error

    @staticmethod
    def describe_exit(exitcode: int | None) -> str:
        if exitcode is None:
            return "worker died"
        if exitcode < 0:
            try:
                return f"worker killed by {signal.Signals(-exitcode).name}"
            except ValueError:
                return f"worker killed by signal {-exitcode}"
        return f"worker exited with code {exitcode}"
