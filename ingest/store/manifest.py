"""The durable per-file manifest: what the store holds, file by file.

`Manifest` is the interface the run uses. An embedded store (Milvus Lite, Qdrant's local mode, LanceDB) keeps
it in SQLite next to the store (`SqliteManifest`); a server store keeps it in the same server
(`StoreBase.own`: e.g. `ingest.store.server_manifest.ServerManifest`), so every machine sees it.

A file's entry is written only after its rows are in the store (store first, then the
record), so a crash never leaves an entry that claims rows the store does not have. The
entry is what the store holds: a failed file keeps the entry of the version that was last
ingested.

NOTE (reserve): a commit (ingest.store.base NOTE: commit order) deletes the versions its files replace, then
records them. A disk that fills between the two would leave the store holding versions that neither the
manifest nor the report names (or both versions of a file, where the delete could not be written). So a run
keeps room aside on the store's disk: `<manifest>.reserve`, RESERVE_MIN plus the manifest's own size (a
transaction rewrites at most every page it has, plus new ones), RESERVE_MAX at most, made at open where the
disk has room. A commit that finds the disk full removes it and is done once more (each step is idempotent:
deletes by version, upserts by id), and the run stops right after its files are reported written
(`ingest.ledger`). The next run with room makes it again; a disk without room for it runs without, as before.
"""
from __future__ import annotations

import os
import sqlite3
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, Protocol, Sequence

from ingest.store.errors import StoreError, disk_full, is_disk_full
from ingest.store.uri import local_path

_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    source TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, file_hash TEXT,
    status TEXT, chunks INTEGER, format TEXT, settings TEXT, updated REAL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS cards (source TEXT PRIMARY KEY, card TEXT);
"""
RESERVE_MIN = 2 << 20     # a commit's new pages: 1,024 new files' entries and cards took 0.9 MB of WAL
RESERVE_MAX = 16 << 20    # 1,024 changed files scattered over a 100,000-file manifest rewrote 14.7 MB
CARD_META = "card:"          # a server manifest keeps a file's card as the meta value CARD_META + source


class Entry(NamedTuple):
    """One file's record (a tuple: a million of them load in a second)."""
    source: str
    size: int
    mtime_ns: int
    file_hash: str
    status: str
    chunks: int
    format: str
    settings: str


class Manifest(Protocol):
    """Per-file entries and a few meta values ("settings") of one collection."""

    def get_meta(self, key: str) -> str | None: ...
    def set_meta(self, key: str, value: str) -> None: ...
    def all(self) -> dict[str, Entry]: ...
    def record(self, entries: Iterable[Entry]) -> None: ...
    def remove(self, sources: Iterable[str]) -> None: ...
    def clear(self) -> None: ...
    def close(self) -> None: ...

    def fence(self) -> None:
        """Raise LeaseLost (a StoreError) unless this run still owns the collection, checked now: call it
        before deleting rows or writing entries."""


class Summary(NamedTuple):
    """What a manifest says of its collection (`ingest status`): its meta values, and its files counted
    by (format, status) as (format, status, files, chunks)."""
    meta: dict[str, str]
    counts: list[tuple[str, str, int, int]]


def read_summary(path: Path) -> Summary:
    """The Summary of the SQLite manifest at `path` (absolute), read in one read-only transaction: it
    answers while a run writes it (WAL) and changes nothing (sqlite3.Error if it cannot be read). With no
    write-ahead log beside it (no run has it open) it is read as immutable, which leaves none behind."""
    wal = path.with_name(path.name + "-wal").exists()
    db = sqlite3.connect(f"{path.as_uri()}?{'mode=ro' if wal else 'immutable=1'}", uri=True, isolation_level=None)
    try:
        db.execute("BEGIN")
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        counts = db.execute("SELECT format, status, COUNT(*), TOTAL(chunks) FROM files GROUP BY format, status")
        return Summary(meta, [(f, s, n, int(c)) for f, s, n, c in counts])
    finally:
        db.close()


def read_cards(path: Path, sources: Iterable[str] | None = None) -> dict[str, str]:
    """The cards (JSON) of the SQLite manifest at `path` by source: of `sources`, or of every file; read-only
    as read_summary, {} when it has none (a manifest made before cards) or cannot be read."""
    if not path.exists():
        return {}
    wal = path.with_name(path.name + "-wal").exists()
    try:
        db = sqlite3.connect(f"{path.as_uri()}?{'mode=ro' if wal else 'immutable=1'}", uri=True, isolation_level=None)
    except sqlite3.Error:
        return {}
    try:
        if sources is None:
            return dict(db.execute("SELECT c.source, c.card FROM cards c JOIN files f ON f.source = c.source"))
        wanted = list(sources)
        return dict(db.execute(f"SELECT source, card FROM cards WHERE source IN ({','.join('?' * len(wanted))})",
                               wanted)) if wanted else {}
    except sqlite3.Error:
        return {}
    finally:
        db.close()


def record_cards(manifest: Manifest, cards: dict[str, str]) -> None:
    """Keep each file's card (JSON) in `manifest`, after its entry: a SQLite manifest in its `cards` table,
    a server's as meta values (CARD_META + source)."""
    if not cards:
        return
    if isinstance(manifest, SqliteManifest):
        manifest.record_cards(cards)
    else:
        for source, card in cards.items():
            manifest.set_meta(CARD_META + source, card)


def release_reserve(manifest: Manifest) -> bool:
    """Free the room a SQLite manifest's run set aside (NOTE: reserve); whether there was any."""
    if not isinstance(manifest, SqliteManifest):
        return False
    try:
        manifest.reserve.unlink()
    except OSError:
        return False
    return True


def unreadable(path: Path, exc: sqlite3.Error) -> str:
    """The one-line error of a manifest SQLite cannot open or read: a permission problem, or a damaged file and
    how to rebuild it (--reembed makes the collection and its manifest anew from the folder)."""
    if "unable to open" in str(exc) or "readonly" in str(exc) or not os.access(path, os.R_OK):
        hint = "check the permissions of the file and its folder"
    else:
        hint = (f"the file is damaged: move it aside (mv {path} {path}.damaged), then rerun ingest run with "
                "--reembed (same --store and --collection) to rebuild the collection and its manifest")
    return f"cannot read the manifest {path}: {exc}; {hint}"


def _full(path: Path, exc: sqlite3.Error) -> bool:
    """Whether SQLite failed for a full disk: said so, or a "disk I/O error" (what it says when it cannot make or
    grow the WAL or its shared-memory file) where `path`'s disk has under 1 MiB left. Never "damaged" for that."""
    if is_disk_full(exc):
        return True
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return False
    return "disk I/O error" in str(exc) and st.f_bavail * st.f_frsize < 1 << 20


def manifest_path(uri: str, collection: str) -> Path:
    """The SQLite manifest of an embedded store (a Milvus Lite file, a Qdrant local folder): next to it."""
    return Path(f"{local_path(uri)}.{collection}.manifest.sqlite")


class SqliteManifest:
    """The manifest of a Milvus Lite store, in SQLite; each write is one transaction."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=FULL")
                self._db.executescript(_SCHEMA)
            except sqlite3.Error:
                self._db.close()
                raise
        except sqlite3.Error as exc:
            raise (disk_full(path) if _full(path, exc) else StoreError(unreadable(path, exc))) from None

        self.reserve = path.with_name(path.name + ".reserve")

    def close(self) -> None:
        self._db.close()

    def hold_reserve(self) -> None:
        """Keep room aside for a commit on a disk that fills (NOTE: reserve): the reserve file made, or grown to
        what the manifest's size asks, where the disk has room (as it is where not)."""
        want = RESERVE_MIN + min(RESERVE_MAX - RESERVE_MIN, sum(
            p.stat().st_size for p in (self.path, self.path.with_name(self.path.name + "-wal")) if p.exists()))
        try:
            fd = os.open(self.reserve, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                if os.fstat(fd).st_size < want:
                    os.posix_fallocate(fd, 0, want)
            finally:
                os.close(fd)
        except OSError:
            pass                             # no room (or no fallocate): the run goes on without one

    def fence(self) -> None:
        """Nothing to check: the run holds the store's flock until it ends."""

    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        with self._transaction():            # a full disk: DiskFull, not SQLite's error
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def all(self) -> dict[str, Entry]:
        rows = self._db.execute(
            "SELECT source, size, mtime_ns, file_hash, status, chunks, format, settings FROM files")
        one: dict[str, str] = {}                # one str per distinct status, format or settings, not one per file
        return {r[0]: Entry(r[0], r[1], r[2], r[3], one.setdefault(r[4], r[4]), r[5], one.setdefault(r[6], r[6]),
                            one.setdefault(r[7], r[7])) for r in rows}

    def recorded_of(self, sources: Sequence[str]) -> set[str]:
        """Those of `sources` that have an entry, of any status."""
        found: set[str] = set()
        for i in range(0, len(sources), 500):
            part = sources[i:i + 500]
            found.update(r[0] for r in self._db.execute(
                f"SELECT source FROM files WHERE source IN ({','.join('?' * len(part))})", part))
        return found

    def chunks_recorded(self) -> int:
        """The chunks of every ingested file: the rows its store holds once every commit was recorded."""
        return int(self._db.execute("SELECT COALESCE(SUM(chunks), 0) FROM files WHERE status='ingested'").fetchone()[0])

    def record(self, entries: Iterable[Entry]) -> None:
        """Write entries in one transaction (call only after their rows are flushed to the store)."""
        now = time.time()
        with self._transaction():
            self._db.executemany(
                "INSERT OR REPLACE INTO files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(e.source, e.size, e.mtime_ns, e.file_hash, e.status, e.chunks, e.format, e.settings, now)
                 for e in entries])

    def record_cards(self, cards: dict[str, str]) -> None:
        """Each file's card (JSON) by source, in one transaction."""
        with self._transaction():
            self._db.executemany("INSERT OR REPLACE INTO cards VALUES (?, ?)", list(cards.items()))

    def remove(self, sources: Iterable[str]) -> None:
        gone = [(s,) for s in sources]
        with self._transaction():
            self._db.executemany("DELETE FROM files WHERE source=?", gone)
            self._db.executemany("DELETE FROM cards WHERE source=?", gone)

    def clear(self) -> None:
        with self._transaction():
            self._db.execute("DELETE FROM files")
            self._db.execute("DELETE FROM meta")
            self._db.execute("DELETE FROM cards")

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        """One transaction; a full disk is DiskFull (one line), the manifest as it was before it (SQLite rolls
        back a transaction it could not write, and a WAL frame is never half-applied)."""
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
        except sqlite3.Error as exc:
            if _full(self.path, exc):
                with suppress(sqlite3.Error):
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                raise disk_full(self.path) from None
            raise
