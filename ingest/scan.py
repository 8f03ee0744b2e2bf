"""The scan step: walk the folder; every file becomes a FileRef, in a deterministic (sorted) order."""
from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Iterator

from ingest.files import FileRef, Outcome


def scan(root: Path, follow_symlinks: bool) -> Iterator[tuple[FileRef, Outcome | None]]:
    """(FileRef, None) for every file under `root`, sorted by relative path; a file that cannot be
    listed, stat'ed or followed comes with its failed or skipped Outcome instead of None."""
    entries: list[tuple[str, str, str | None, str | None]] = []   # (source, path, status, error)

    def onerror(exc: OSError) -> None:
        rel = Path(exc.filename).relative_to(root).as_posix() if exc.filename else "?"
        entries.append((rel, str(exc.filename), "failed", f"cannot list folder: {exc.strerror}"))

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=False):
        dirnames.sort()
        for name in dirnames:
            full = os.path.join(dirpath, name)
            if os.path.islink(full):
                entries.append((_rel(root, full), full, "skipped", "directory symlink (not followed)"))
        for name in filenames:
            full = os.path.join(dirpath, name)
            status, error = None, None
            if os.path.islink(full) and not follow_symlinks:
                status, error = "skipped", "symlink (set [run] follow_symlinks = true to follow)"
            entries.append((_rel(root, full), full, status, error))
    for seq, (source, path, status, error) in enumerate(sorted(entries)):
        ref = FileRef(seq, source, path)
        if status is None:
            try:
                st = os.stat(path)
                ref = FileRef(seq, source, path, st.st_size, st.st_mtime_ns)
            except OSError as exc:
                status, error = "failed", _stat_error(exc)
        yield ref, None if status is None else Outcome(status, error)


def _rel(root: Path, path: str) -> str:
    return Path(path).relative_to(root).as_posix()


def _stat_error(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop; remove or fix the link"
    if exc.errno == errno.ENOENT:
        return "broken symlink; its target does not exist"
    if exc.errno == errno.EACCES:
        return "permission denied; check the file's permissions"
    return f"cannot stat file: {exc.strerror}"
