"""The scan step: walk the folder; every file becomes a FileRef, in a deterministic (sorted) order.

A file's `source` (its manifest key, its name in the store and the report) is its relative path in
printable form, so any name the file system allows can be stored; its `path` is what is opened.
"""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Iterable, Iterator

from ingest.files import FileRef, Outcome
from ingest.store import SOURCE_MAX

_ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r"}
CANNOT_LIST = "cannot list folder"
_FOLLOW_HINT = {"inside": 'set [run] follow_symlinks = "all" to follow it',
                "none": 'set [run] follow_symlinks = "inside" or "all" to follow it'}


def printable(rel: str) -> str:
    """`rel` (an OS path str, undecodable bytes as surrogate escapes) as a lossless, printable str.

    A backslash becomes `\\\\`; a byte that is not valid UTF-8 `\\xNN` (NN >= 80); a C0 control
    character or DEL `\\n`, `\\t`, `\\r` or `\\xNN` (NN < 80); a C1 control character `\\u00NN`.
    Everything else is kept, so distinct names stay distinct and a UTF-8 name without those is unchanged.
    """
    out: list[str] = []
    for ch in os.fsencode(rel).decode("utf-8", "surrogateescape"):
        code = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif 0xDC80 <= code <= 0xDCFF:                       # an undecodable byte
            out.append(f"\\x{code - 0xDC00:02x}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0x80 <= code <= 0x9F:
            out.append(f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def scan(root: Path, follow_symlinks: str) -> Iterator[tuple[FileRef, Outcome | None]]:
    """(FileRef, None) for every file under `root`, sorted by source; a file that cannot be listed,
    stat'ed or followed, or is not to be followed, comes with its failed or skipped Outcome instead.

    `follow_symlinks` ([run] follow_symlinks): "inside" follows a link to a file only when its
    target lies inside `root`, "all" follows every one, "none" none. A followed link's `path` is its
    resolved target. Links to folders are never followed.
    """
    entries: list[tuple[str, str, str | None, str | None]] = []   # (source, path, status, error)
    inside = os.path.realpath(root)

    def onerror(exc: OSError) -> None:            # a folder not listed, or not to its end
        rel = _rel(root, exc.filename) if exc.filename else "."      # which one unknown: the whole folder
        entries.append((rel, str(exc.filename or root), "failed", f"{CANNOT_LIST}: {exc.strerror}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=False):
        dirnames.sort()
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                entries.append((_rel(root, full), full, "skipped", "directory symlink (not followed)"))
        for name in filenames:
            full = os.path.join(dirpath, name)
            status, error = None, None
            if os.path.islink(full) and follow_symlinks == "none":
                status, error = "skipped", f"symlink; {_FOLLOW_HINT['none']}"
            entries.append((_rel(root, full), full, status, error))
    for seq, (source, path, status, error) in enumerate(sorted(entries, key=lambda e: e[0])):
        if status is None:
            yield _follow(FileRef(seq, source, path), follow_symlinks, inside)
        else:
            yield FileRef(seq, source, path), Outcome(status, error)


def unlisted(files: Iterable[tuple[FileRef, Outcome | None]]) -> list[str]:
    """The folders (sources; "." is the root) the scan could not list, or not to the end: what lies under
    them is unknown, so nothing recorded there may be taken for deleted."""
    return [ref.source for ref, problem in files
            if problem is not None and (problem.error or "").startswith(CANNOT_LIST)]


def _follow(ref: FileRef, follow_symlinks: str, inside: str) -> tuple[FileRef, Outcome | None]:
    """`ref` stat'ed, with a followed link's target as its path; or its failed or skipped Outcome."""
    size = len(ref.source.encode())
    if size > SOURCE_MAX:
        return ref, Outcome("failed", f"path is {size} bytes, too long for the store (at most {SOURCE_MAX}); "
                                      "shorten the file's path or name")
    try:
        st = os.stat(ref.path)
    except OSError as exc:
        return ref, Outcome("failed", _stat_error(exc))
    path = ref.path
    if os.path.islink(path):
        path = os.path.realpath(path)
        if follow_symlinks == "inside" and os.path.commonpath((inside, path)) != inside:
            return ref, Outcome("skipped", f"link leads outside the folder; {_FOLLOW_HINT['inside']}")
    return FileRef(ref.seq, ref.source, path, st.st_size, st.st_mtime_ns), None


def _rel(root: Path, path: str) -> str:
    return printable(Path(path).relative_to(root).as_posix())


def _stat_error(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop; remove or fix the link"
    if exc.errno == errno.ENOENT:
        return "broken symlink; its target does not exist"
    if exc.errno == errno.EACCES:
        return "permission denied; check the file's permissions"
    return f"cannot stat file: {exc.strerror}"
