"""The durable per-file manifest: SQLite next to the store.

A file's entry is written only after its rows are in the store (store first, then the
record), inside one transaction, so a crash never leaves an entry that claims rows the
store does not have. The entry is what the store holds: a failed file keeps the entry of
the version that was last ingested.
"""
from __future__ import annotations

import hashlib
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ingest.store import is_local

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    source TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, file_hash TEXT,
    status TEXT, chunks INTEGER, format TEXT, settings TEXT, updated REAL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
"""


@dataclass(frozen=True)
class Entry:
    source: str
    size: int
    mtime_ns: int
    file_hash: str
    status: str
    chunks: int
    format: str
    settings: str


def manifest_path(uri: str, collection: str) -> Path:
    if is_local(uri):
        return Path(f"{Path(uri).resolve()}.{collection}.manifest.sqlite")
    key = hashlib.blake2b(uri.encode(), digest_size=6).hexdigest()
    return Path.cwd() / f".ingest-{collection}-{key}.manifest.sqlite"


class Manifest:
    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def all(self) -> dict[str, Entry]:
        rows = self._db.execute(
            "SELECT source, size, mtime_ns, file_hash, status, chunks, format, settings FROM files")
        return {r[0]: Entry(*r) for r in rows}

    def record(self, entries: Iterable[Entry]) -> None:
        """Write entries in one transaction (call only after their rows are flushed to the store)."""
        now = time.time()
        with self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(e.source, e.size, e.mtime_ns, e.file_hash, e.status, e.chunks, e.format, e.settings, now)
                 for e in entries])

    def remove(self, sources: Iterable[str]) -> None:
        with self._transaction():
            self._db.executemany("DELETE FROM files WHERE source=?", [(s,) for s in sources])

    def clear(self) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM files")
            self._db.execute("DELETE FROM meta")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")
