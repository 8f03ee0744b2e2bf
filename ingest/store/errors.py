"""The store family's errors, and what a message may show of a URI or a client's error (one line, never a
password). At the bottom of the family: every store module and the manifests import it, and it imports none."""
from __future__ import annotations

import functools
import re
import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")


class StoreError(RuntimeError):
    """A store problem the user must act on; the message is one line."""


class StoreRejected(StoreError):
    """The server answered but refused the call (bad data such as an over-long field): the
    problem belongs to the rows sent, not to the store."""


class LeaseLost(StoreError):
    """This run no longer owns its collection: the run must stop (not fail one file)."""


_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@?#]*):(?P<pw>[^@/?#]*)@", re.I)
_QUERY_SECRET = re.compile(r"(?P<key>[?&](password|api_key|apikey|token)=)[^&#]*", re.I)


def redact(uri: str) -> str:
    """`uri` with any password or key in it replaced by ***: what messages, reports and status show."""
    uri = _PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", uri)
    return _QUERY_SECRET.sub(lambda m: f"{m['key']}***", uri)


def one_line(exc: BaseException) -> str:
    """The useful part of a client's error, on one line (gRPC's details when it has them)."""
    text = " ".join(str(exc).split())
    found = re.search(r'details = "([^"]+)"', text) or re.search(r"message=(.+?)\)>", text)
    return redact((found.group(1) if found else text)[:300] or type(exc).__name__)


# NOTE (reconnect protocol): a server store's call that fails because the server went away (the connection
# ended: a restart, a terminated backend; the server unreachable; no answer within the call's timeout) raises
# Disconnected, not a plain StoreError. `retry` runs such a call again after `reset` (drop the client, make a
# new connection; a lease store also takes its lock or lease back, or raises LeaseLost if another run holds
# the collection), with backoff (RETRY_FIRST_S doubling to RETRY_MAX_S), for at most `timeout_s` from the first
# failure ([store] timeout_s): then the first Disconnected is raised, its message naming the cause and how long
# it lasted, and the run stops with that one line. Only idempotent calls are retried (upserts by deterministic
# id, deletes by id or version, the manifest's upserts, reads), so a call that did reach the server before its
# answer was lost does no harm run twice. A call inside a retried call is not retried again (the outer retry
# owns the bound), so the bound is never multiplied.
RETRY_FIRST_S, RETRY_MAX_S = 0.2, 2.0


class Disconnected(StoreError):
    """The server store went away during a call (`cause`: connection ended, server unreachable, did not answer
    within N s); the call may succeed again after a reconnect (`retry`)."""

    def __init__(self, message: str, cause: str = "server unreachable"):
        super().__init__(message)
        self.cause = cause


_retrying = threading.local()


def retry(call: Callable[[], T], timeout_s: float, reset: Callable[[], None], what: str = "") -> T:
    """call(), run again after reset() while it raises Disconnected, for at most `timeout_s` from the first
    failure (NOTE: reconnect protocol); then the first Disconnected, saying how long the store stayed away."""
    if getattr(_retrying, "on", False):
        return call()
    _retrying.on = True
    try:
        first, seen, pause = None, None, RETRY_FIRST_S
        while True:
            try:
                return call()
            except Disconnected as exc:
                now = time.monotonic()
                first, seen = (now, exc) if seen is None else (first, seen)
                if now - first >= timeout_s:        # the cause first seen: what went wrong, not its aftermath
                    head, sep, tail = str(seen).partition("; check")
                    raise Disconnected(f"{head} (still away after retrying for {now - first:.0f} s){sep}{tail}",
                                       seen.cause) from None
            time.sleep(min(pause, max(0.0, first + timeout_s - time.monotonic())))
            pause = min(2 * pause, RETRY_MAX_S)
            try:
                reset()
            except Disconnected:
                pass                     # still away: the next call says so
    finally:
        _retrying.on = False


def retried(method: Callable[..., T]) -> Callable[..., T]:
    """A store method run through `retry` with the store's timeout_s and its `reconnect`."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        return retry(lambda: method(self, *args, **kwargs), self.timeout_s, self.reconnect)
    return run


class DiskFull(StoreError):
    """The disk under an embedded store (or its manifest) is full: the run stops with one line; a rerun with
    room resumes from the manifest."""


_DISK_FULL = re.compile(r"no space left on device|database or disk is full|disk quota exceeded|errno 28\b|"
                        r"\benospc\b|os error 28\b", re.I)


def is_disk_full(exc: BaseException | str) -> bool:
    """Whether an error (an OSError; SQLite's, Arrow's or Lance's; a Milvus Lite host's answer) says the disk is
    full."""
    if isinstance(exc, OSError) and exc.errno in (28, 122):          # ENOSPC, EDQUOT
        return True
    return bool(_DISK_FULL.search(str(exc)))


def disk_full(where: object) -> DiskFull:
    """The one line of a full disk under `where` (a store or manifest path)."""
    return DiskFull(f"disk full (No space left on device) writing {redact(str(where))}; free space on its disk, "
                    "then rerun (what was committed is kept)")


def refused(what: str, reason: str, disk: object = None) -> StoreError:
    """A call the store answered with a refusal: StoreRejected (the rows'), unless the reason says that the disk
    under the embedded store at `disk` is full (DiskFull: the run's)."""
    return disk_full(disk) if disk is not None and is_disk_full(reason) else \
        StoreRejected(f"the store refused to {what}: {reason}")
