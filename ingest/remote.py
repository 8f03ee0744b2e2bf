"""Folders in object storage: `ingest run s3://bucket/prefix`, or any fsspec URL that other processes can
read too (`file://`, `s3://`, `gs://`, ...; not `memory://`, which lives in one process).

`scan_url` lists the folder as `ingest.scan.scan` walks a local one: a FileRef per object (its `source` the
key relative to the prefix, its `path` the full URL), a "directory" (a common prefix) listed at a time and
sorted by name, a subdirectory descended at its sorted place; a listing that fails is the scan's "cannot
list folder" failure, so nothing under it is taken for deleted. A `file://` folder is walked by the scan
itself, so its symlinks obey `[run] follow_symlinks` as the same folder given as a path does. The sniff reads
a URL's head with one ranged read (`read_head`); a loader gets a local copy (`local_copy`), fetched once per
file (NOTE below).

Credentials and endpoint are those of the protocol's own library, as a user sets them for any tool; for S3
(s3fs, botocore): AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or the machine's role),
AWS_ENDPOINT_URL for an S3-compatible server (MinIO, Ceph, moto), AWS_DEFAULT_REGION; fsspec's
FSSPEC_<PROTOCOL>_<OPTION> variables work too. The Ray engine forwards the AWS_* and FSSPEC_* variables of
its driver to its workers (`forwarded_env`).

Change key: size and last-modified time (S3's LastModified, as mtime_ns), as for a local file: an unchanged
object is neither fetched nor read. A changed one is fetched, and its sha256 (computed while fetching)
confirms: equal content is "unchanged". The ETag is not used: a multipart upload's ETag is no digest of
the content (it depends on the part size), so it cannot stand for the content hash, and every overwrite
already changes LastModified; the one change missed is a same-size overwrite within the same second, as
with a file system's coarse mtime. A protocol that gives no modification time gets the run's clock, so
every run fetches such a file and compares its hash.

NOTE (local copies: protocol). Loaders need a local path (a file:// URL's file is read in place), so a
load task fetches the object into <fetch dir>/<sha256 of the URL><suffix> (0600; written to a .part name,
then os.replace), hashing as it streams. The fetch dir is private (mkdtemp: 0700, named ingest-fetch-*)
and named by FETCH_ENV, which the processes a run starts inherit: `fetch_dir` makes it for the run (the
supervisor, before its loader pools spawn) and removes it with whatever is in it when the run ends, also
on a stop signal; a process killed at once leaves it in the system temp dir under that name. A Ray worker
makes its own (`private_fetch_dir`, before its loader pools spawn; removed at its exit; a worker the
cluster kills leaves it empty, named ingest-fetch-<pid>-*), as another node cannot see the driver's.
Every later task of the file (its OCR pages; any task given the file's URL) calls `local_copy` too, finds
the copy by its name and does not fetch again. The copy lives until the file ends: the dispatcher (local
engine) or the load task (Ray) calls `discard` once the file is Finished, when no task of it runs any
more. Every call to the object store is bounded by the protocol's timeouts (S3: S3_CONFIG).
"""
from __future__ import annotations

import atexit
import errno
import functools
import hashlib
import itertools
import os
import re
import shutil
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from ingest.files import FileRef, Outcome
from ingest.loaders import LoaderError
from ingest.scan import CANNOT_LIST, printable, scan, too_long

FETCH_ENV = "_INGEST_FETCH_DIR"             # not INGEST_*: the Ray driver forwards those to its workers
FETCH_PREFIX = "ingest-fetch-"
BLOCK = 1 << 20                        # bytes read and hashed at a time while fetching
FORWARDED = ("AWS_", "FSSPEC_")        # environment the Ray workers need to reach the objects
# botocore's timeouts (every call bounded) and retries; s3fs adds its own retries of throttled calls.
S3_CONFIG = {"connect_timeout": 10, "read_timeout": 60, "retries": {"max_attempts": 3, "mode": "standard"}}
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_private: str | None = None


def is_url(root: str | Path) -> bool:
    """Whether `root` is a URL (`s3://...`) rather than a local path."""
    return isinstance(root, str) and _URL.match(root) is not None


@functools.lru_cache(maxsize=None)
def _filesystem(protocol: str) -> Any:
    import fsspec

    options: dict[str, Any] = {"use_listings_cache": False}      # a listing is read once: keep none in memory
    if protocol in ("s3", "s3a"):
        options["config_kwargs"] = S3_CONFIG
    return fsspec.filesystem(protocol, **options)


def _split(url: str) -> tuple[Any, str]:
    """(the URL's file system, its path there)."""
    fs = _filesystem(url.split("://", 1)[0].lower())
    return fs, fs._strip_protocol(url).rstrip("/")


def _reason(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _hint(url: str) -> str:
    if url.lower().startswith(("s3://", "s3a://")):
        return ("check the endpoint (AWS_ENDPOINT_URL), the credentials (AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and the bucket's name")
    return "check the URL and the credentials of its protocol"


def unreadable(url: str) -> str | None:
    """None when the folder at `url` answers; else the one-line error of a run that cannot start."""
    if url.lower().startswith("memory://"):
        return f"cannot ingest {url}: a memory:// file system lives in one process, and loaders run in others"
    try:
        fs, root = _split(url)
        info = fs.info(root)
    except ImportError as exc:
        return f"cannot read {url}: {_reason(exc)} (pip install 'ingest[s3]' for s3://)"
    except FileNotFoundError:
        return f"folder {url} not found (nothing under that prefix); {_hint(url)}"
    except PermissionError as exc:
        return f"access to {url} denied ({_reason(exc)}); {_hint(url)}"
    except Exception as exc:             # the protocol's own errors: no endpoint, bad URL, ...
        return f"cannot reach {url} ({_reason(exc)}); {_hint(url)}"
    if info.get("type") != "directory":
        return f"{url} is a single object, not a folder; pass its prefix to ingest"
    return None


def forwarded_env(root: str | Path) -> tuple[str, ...]:
    """The prefixes of environment variables the Ray workers need for `root` (none for a local folder)."""
    return FORWARDED if is_url(root) else ()


# -- the scan --------------------------------------------------------------------------------
def scan_url(url: str, follow_symlinks: str = "inside") -> Iterator[tuple[FileRef, Outcome | None]]:
    """(FileRef, None) for every object under the prefix `url`, in the scan's order (module docstring); a
    folder that cannot be listed comes as a failed Outcome. A `file://` folder is walked by `ingest.scan.scan`
    itself, so its links obey `follow_symlinks` ([run] follow_symlinks) as the same folder given as a path
    does; each `path` is then the file's (a followed link's target's) file:// URL."""
    fs, root = _split(url)
    if getattr(fs, "local_file", False):
        for ref, problem in scan(Path(root), follow_symlinks):
            yield FileRef(ref.seq, ref.source, fs.unstrip_protocol(ref.path), ref.size, ref.mtime_ns), problem
        return
    seq = itertools.count()
    yield from _walk(fs, root, root, seq)


def _walk(fs: Any, root: str, folder: str, seq: Iterator[int]) -> Iterator[tuple[FileRef, Outcome | None]]:
    try:
        entries = sorted(fs.ls(folder, detail=True), key=lambda e: e["name"].rstrip("/"))
    except Exception as exc:             # the protocol's own errors too: the folder's content is unknown
        source = printable(folder[len(root) + 1:]) or "."
        yield FileRef(next(seq), source, fs.unstrip_protocol(folder)), Outcome("failed", f"{CANNOT_LIST}: {_reason(exc)}")
        return
    for info in entries:
        name = info["name"].rstrip("/")
        if not name.startswith(folder + "/"):           # the folder's own marker object
            continue
        if info.get("type") == "directory":             # no object store has links (file:// is the scan's)
            yield from _walk(fs, root, name, seq)
            continue
        ref = FileRef(next(seq), printable(name[len(root) + 1:]), fs.unstrip_protocol(name))
        if (long := too_long(ref.source, "the object's key")) is not None:
            yield ref, long
        else:
            yield FileRef(ref.seq, ref.source, ref.path, int(info.get("size") or 0), _mtime_ns(info)), None


def _mtime_ns(info: dict[str, Any]) -> int:
    """The object's modification time in ns; the clock's now when the protocol gives none (see the docstring)."""
    value = next((info[k] for k in ("LastModified", "mtime", "last_modified", "updated", "modified") if info.get(k)),
                 None)
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    if isinstance(value, datetime):
        value = value if value.tzinfo else value.replace(tzinfo=timezone.utc)
        return (value - _EPOCH) // timedelta(microseconds=1) * 1000
    if isinstance(value, (int, float)):
        return int(value * 1e9)
    return time.time_ns()


# -- reading ---------------------------------------------------------------------------------
def read_head(url: str, size: int) -> bytes:
    """The first `size` bytes of the object (one ranged read); LoaderError when it cannot be read."""
    fs, path = _split(url)
    try:
        return fs.cat_file(path, start=0, end=size)
    except OSError as exc:
        if exc.errno == errno.EINVAL and "range" in str(exc).lower():
            return b""                   # an empty object has no byte 0
        raise _read_error(exc) from None
    except Exception as exc:
        raise _read_error(exc) from None


def _read_error(exc: BaseException) -> LoaderError:
    if isinstance(exc, FileNotFoundError):
        return LoaderError("object not found (removed during the run)")
    if isinstance(exc, PermissionError):
        return LoaderError(f"cannot read the object ({_reason(exc)}); check its permissions or storage class")
    return LoaderError(f"cannot read the object: {_reason(exc)}")


def local_copy(path: str) -> tuple[str, str | None]:
    """In a loader worker: (a local path to read `path` from, its sha256 if computed here). A local path (or
    file:// URL) is itself (no digest); a URL's object is fetched into the fetch dir, unless an earlier task
    of the file fetched it (NOTE). LoaderError when the object cannot be read."""
    if not is_url(path):
        return path, None
    fs, key = _split(path)
    if getattr(fs, "local_file", False):                # file://: read in place
        return key, None
    target = _copy_path(path, _fetch_dir_here())
    if os.path.exists(target):
        return target, None
    digest, part = hashlib.sha256(), f"{target}.{os.getpid()}.part"
    try:
        with os.fdopen(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as out, \
                fs.open(key, "rb", block_size=8 * BLOCK) as src:
            while block := src.read(BLOCK):
                digest.update(block)
                out.write(block)
        os.replace(part, target)
    except Exception as exc:
        Path(part).unlink(missing_ok=True)
        raise _read_error(exc) from None
    return target, digest.hexdigest()


def discard(path: str) -> None:
    """The file has ended: remove its local copy, if it has one (NOTE)."""
    folder = os.environ.get(FETCH_ENV)
    if folder and is_url(path):
        Path(_copy_path(path, folder)).unlink(missing_ok=True)


def _copy_path(url: str, folder: str) -> str:
    suffix = PurePosixPath(url).suffix
    suffix = suffix if re.fullmatch(r"\.[A-Za-z0-9]{1,10}", suffix) else ""    # loaders may look at it
    return os.path.join(folder, hashlib.sha256(url.encode()).hexdigest()[:32] + suffix)


@contextmanager
def fetch_dir(root: str | Path) -> Iterator[str | None]:
    """For a run of a URL `root`: a private fetch dir for its processes (yielded; None for a local root),
    removed at the end, or by the run's quit on a stop that outlasts its grace (NOTE)."""
    if not is_url(root):
        yield None
        return
    folder, old = tempfile.mkdtemp(prefix=FETCH_PREFIX), os.environ.get(FETCH_ENV)
    os.environ[FETCH_ENV] = folder
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        if old is None:
            os.environ.pop(FETCH_ENV, None)
        else:
            os.environ[FETCH_ENV] = old


def private_fetch_dir() -> str:
    """This process's own fetch dir, made once and named in FETCH_ENV for the processes it starts later
    (a Ray worker's loader pools); removed at its exit (NOTE)."""
    global _private
    if _private is None:
        _private = tempfile.mkdtemp(prefix=f"{FETCH_PREFIX}{os.getpid()}-")     # a leftover names its process
        atexit.register(shutil.rmtree, _private, True)
    os.environ[FETCH_ENV] = _private
    return _private


def _fetch_dir_here() -> str:
    """The fetch dir this process inherited; its own one when it inherited none (a process no run started)."""
    folder = os.environ.get(FETCH_ENV)
    return folder if folder and os.path.isdir(folder) else private_fetch_dir()
