"""Walk the input folder: every file becomes a FileJob, in a deterministic (sorted) order."""
from __future__ import annotations

import errno
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from ingest.workers.messages import PageChunks


@dataclass
class FileJob:
    seq: int
    source: str                        # path relative to the folder, with "/" separators
    path: str
    fmt: str = ""
    size: int = 0
    mtime_ns: int = 0
    status: str = "pending"            # ingested | unchanged | skipped | failed
    error: str | None = None
    file_hash: str = ""
    old_hash: str | None = None        # the manifest's hash of the previous version
    pages: list[PageChunks] = field(default_factory=list)
    pending_ocr: set[int] = field(default_factory=set)
    chunks: int = 0
    ocr_pages: int = 0
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
    record: bool = False               # write a manifest entry once the file is written

    def chunk_texts(self) -> list[tuple[int | None, str]]:
        """(page, text) for every chunk, in page order, then chunk order."""
        ordered = sorted(self.pages, key=lambda p: -1 if p.page is None else p.page)
        return [(p.page, text) for p in ordered for text in p.chunks]

    def finish(self, status: str, error: str | None = None) -> None:
        self.status, self.error = status, error


def scan(root: Path, follow_symlinks: bool) -> Iterator[FileJob]:
    """FileJobs for every file under `root`, sorted by relative path; problems become failed/skipped jobs."""
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
        job = FileJob(seq=seq, source=source, path=path)
        if status is None:
            try:
                st = os.stat(path)
                job.size, job.mtime_ns = st.st_size, st.st_mtime_ns
            except OSError as exc:
                status, error = "failed", _stat_error(exc)
        if status is not None:
            job.finish(status, error)
        yield job


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
