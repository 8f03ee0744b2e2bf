"""The store family's errors, and what a message may show of a URI or a client's error (one line, never a
password). At the bottom of the family: every store module and the manifests import it, and it imports none."""
from __future__ import annotations

import re


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
