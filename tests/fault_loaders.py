"""A loader plugin for fault injection ([loaders] plugins = ["fault_loaders"]).

Each extension misbehaves in one way inside a real loader worker process.
"""
from __future__ import annotations

import faulthandler
import hashlib
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Iterator

from ingest.loaders.base import LoaderOptions, Page, register


@register("fault-sleep", (".sleep",), "txt")
def sleep_forever(path: Path, options: LoaderOptions) -> Iterator[Page]:
    time.sleep(3600)
    yield Page(None, "never")


@register("fault-exit", (".exit",), "txt")
def exit_hard(path: Path, options: LoaderOptions) -> Iterator[Page]:
    os._exit(3)
    yield Page(None, "never")


@register("fault-segv", (".segv",), "txt")
def segfault(path: Path, options: LoaderOptions) -> Iterator[Page]:
    faulthandler.disable()
    faulthandler._sigsegv()
    yield Page(None, "never")


@register("fault-noterm", (".noterm",), "txt")
def ignore_sigterm(path: Path, options: LoaderOptions) -> Iterator[Page]:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(3600)
    yield Page(None, "never")


@register("fault-flaky", (".flaky",), "txt")
def crash_once(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Dies the first time it sees a file, then loads it (the retry in a fresh worker works)."""
    marker = Path(tempfile.gettempdir()) / ("ingest-flaky-" + hashlib.md5(str(path.resolve()).encode()).hexdigest())
    if not marker.exists():
        marker.write_text("x")
        os._exit(9)
    yield Page(None, path.read_text())


@register("fault-slowtxt", (".slowtxt",), "txt")
def slow_text(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Loads like a text file, slowly: gives kill-and-resume tests time to strike mid-run."""
    time.sleep(float(os.environ.get("INGEST_TEST_SLOW_S", "1")))
    yield Page(None, path.read_text())
