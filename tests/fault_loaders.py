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
    """Dies the first time it sees a file, then loads it (the retry in a fresh worker works).
    Each attempt appends its pid to <file>.attempts beside the folder, so a test can prove the retry."""
    marker = Path(tempfile.gettempdir()) / ("ingest-flaky-" + hashlib.md5(str(path.resolve()).encode()).hexdigest())
    with open(path.parent.parent / (path.name + ".attempts"), "a") as log:
        log.write(f"{os.getpid()}\n")
    if not marker.exists():
        marker.write_text("x")
        os._exit(9)
    yield Page(None, path.read_text())


@register("fault-note", (".note",), "txt")
def note_pid(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Loads like text and appends its worker's pid to pids.log beside the folder."""
    with open(path.parent.parent / "pids.log", "a") as log:
        log.write(f"{os.getpid()}\n")
    yield Page(None, path.read_text())


@register("fault-killtxt", (".killtxt",), "pdf")
def kill_txt_workers(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Once per file, from the pdf pool: waits until the txt pool has loaded the .note files and sits
    idle, then SIGKILLs its workers (pids from pids.log). A worker that dies while its pool runs no
    task breaks a pebble pool, which must be replaced."""
    marker = path.parent.parent / (path.name + ".killed")
    if not marker.exists():
        marker.write_text("x")
        time.sleep(2)
        for line in (path.parent.parent / "pids.log").read_text().split():
            try:
                os.kill(int(line), signal.SIGKILL)
            except ProcessLookupError:
                pass
    yield Page(None, path.read_text())


@register("fault-bignum", (".bignum",), "txt")
def page_number_overflow(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """A buggy loader: its page number does not fit the store's INT64 field, so the store refuses its rows."""
    yield Page(2 ** 70, path.read_text())


@register("fault-slowtxt", (".slowtxt",), "txt")
def slow_text(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Loads like a text file, slowly: gives kill-and-resume tests time to strike mid-run."""
    time.sleep(float(os.environ.get("INGEST_TEST_SLOW_S", "1")))
    yield Page(None, path.read_text())


@register("fault-gatetxt", (".gatetxt",), "txt")
def gated_text(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Loads like a text file once the test opens its gate (a file of its name in gates/ beside the
    folder): a kill-and-resume test decides exactly which files a run can finish before the kill."""
    gate = path.parent.parent / "gates" / path.name
    deadline = time.monotonic() + 600
    while not gate.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield Page(None, path.read_text())


@register("fault-killparent", (".killparent",), "txt")
def kill_parent(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """SIGKILLs the process that started its worker: on the Ray engine, the load task's Ray worker (the
    task dies, not the file's loader), after appending that pid to killed.pids beside the folder. Never use it
    with the local engine: that parent is `ingest run`."""
    with open(path.parent.parent / "killed.pids", "a") as log:
        log.write(f"{os.getppid()}\n")
    os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(60)
    yield Page(None, "never")
