"""The local embedding cache: vectors by key (a hash of the embedded token ids and the embedding settings,
`ingest.reuse`), in one SQLite file, bounded in MB, shared by runs and processes.

It serves what the store cannot: a rerun after a crash (new files' vectors), copies of documents in
another folder or collection, a `--reembed` into a new collection with the same model and settings.
A key includes the model, backend, dtype and max_seq_length, so one file serves every setting and
never gives a vector of one to another.

NOTE (safety): SQLite in WAL mode with a busy timeout; every write is one transaction (INSERT OR
IGNORE: two processes writing the same key write the same vector), so a crash or a concurrent run
leaves the file whole. A new cache file is this user's only (0600, in a 0700 folder when it makes one).
The cache is never needed: a locked database skips that write or read (a miss),
and a damaged or unreadable one is said in one line and left alone for the rest of the run. Eviction
removes the least recently used rows once the rows pass the bound (checked every EVICT_EVERY rows
written, and at open).

NOTE (lookups): `get` asks SQLite only for keys the file may hold: at the first `get`, the first 8 bytes of
every key in the file are read into a sorted array (~8 bytes a row: 2.6 MB for 512 MB of rows), and keys
put since (`put`, or `note` for rows another process writes for this one: a run's writer processes) join
a set. A key past both is a miss without a query (a fresh cache: no query at all; a query cost the
supervisor ~100 us a group of a file's chunks). Once the set holds more keys than the file may (its bound
in rows: the oldest were evicted meanwhile), both are read again, so memory stays that of the bound. A row
another run writes meanwhile is missed: the cache is a shortcut, and a miss costs one encoding.

NOTE (layout): a rowid table with a unique index on the key. A row (a 16-byte key and 1,536 bytes of
vector at dim 384) is too big for a WITHOUT ROWID table, which earlier versions used: here that took
88 us of CPU a row written and 19 us a row read, against 25 and 3 with rowid, and 2.3x the disk
(bench/feed.py --backend stub). A file with the old table is the cache's own, so it is rebuilt empty
at open (its vectors are only a shortcut: they are encoded again).
"""
from __future__ import annotations

import os
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ingest.store.writers import NO_KEY       # a row not to be cached (a key is a 16-byte hash, never this)

ROW_OVERHEAD = 64           # bytes a row costs besides its vector: key, stamp, b-tree and index entries
EVICT_EVERY = 4096          # rows written between two checks of the bound
BUSY_MS = 2000              # how long a write waits for another process's transaction


class VectorCache:
    """Vectors of `dim` float32 by 16-byte key, in the SQLite file `path`, at most `max_mb` MB of rows."""

    def __init__(self, path: Path, max_mb: float, dim: int):
        self.path, self.dim, self.max_mb = path, dim, max_mb
        self.max_rows = max(1, int(max_mb * 1e6 // (4 * dim + ROW_OVERHEAD)))
        self._lock = threading.Lock()           # one connection, used by the encode thread and the pool's feeder
        self._con: sqlite3.Connection | None = None
        self._written = 0
        self._broken = False
        self._prefixes: np.ndarray | None = None    # sorted first 8 bytes of the keys at the first get (NOTE: lookups)
        self._added: set[bytes] = set()             # keys put or noted since
        self._open()

    @property
    def usable(self) -> bool:
        return not self._broken

    def get(self, keys: Sequence[bytes]) -> dict[bytes, np.ndarray]:
        """The cached vectors of `keys` (a subset); their rows marked as used now."""
        if not keys or self._broken:
            return {}
        found: dict[bytes, np.ndarray] = {}
        with self._lock:
            try:
                keys = self._maybe_held(keys)
                for start in range(0, len(keys), 500):
                    part = keys[start:start + 500]
                    rows = self._con.execute(f"SELECT key, vec FROM vectors WHERE key IN ({','.join('?' * len(part))})",
                                             part).fetchall()
                    found.update((k, np.frombuffer(v, dtype=np.float32)) for k, v in rows if len(v) == 4 * self.dim)
                if found:
                    with self._con:
                        self._con.executemany("UPDATE vectors SET used = ? WHERE key = ?",
                                              [(time.time(), k) for k in found])
            except sqlite3.OperationalError:        # locked by another process past the busy timeout: a miss
                pass
            except sqlite3.DatabaseError as exc:
                self._give_up(exc)
        return found

    def note(self, keys: Sequence[bytes]) -> None:
        """Keys whose rows another process writes into this file for this run (NOTE: lookups)."""
        with self._lock:
            self._added.update(keys)

    def _maybe_held(self, keys: Sequence[bytes]) -> list[bytes]:
        """The keys the file may hold (NOTE: lookups); under the lock."""
        if len(self._added) > self.max_rows:    # read again (NOTE: lookups)
            self._prefixes = None
            self._added.clear()
        if self._prefixes is None:
            blob = b"".join(k[:8].ljust(8, b"\0") for (k,) in self._con.execute("SELECT key FROM vectors"))
            self._prefixes = np.sort(np.frombuffer(blob, dtype="<u8"))
        added, held = self._added, self._prefixes
        if not len(held):
            return [k for k in keys if k in added]
        wanted = np.frombuffer(b"".join(k[:8].ljust(8, b"\0") for k in keys), dtype="<u8")
        at = np.minimum(np.searchsorted(held, wanted), len(held) - 1)
        maybe = (held[at] == wanted).tolist()
        return [k for k, m in zip(keys, maybe) if m or k in added]

    def put(self, keys: Sequence[bytes], vectors: np.ndarray) -> None:
        """Store `vectors` (one row per key; finite rows only) by key, in one transaction; evict past the bound."""
        if self._broken or not len(keys):
            return
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            return
        ok = np.isfinite(vectors).all(axis=1).tolist()
        blob, width, now = memoryview(vectors.tobytes()), 4 * self.dim, time.time()
        rows = [(k, blob[i * width:(i + 1) * width], now) for i, k in enumerate(keys) if ok[i]]
        if not rows:
            return
        with self._lock:
            try:
                with self._con:
                    self._con.executemany("INSERT OR IGNORE INTO vectors (key, vec, used) VALUES (?, ?, ?)", rows)
                if self._prefixes is not None:
                    self._added.update(r[0] for r in rows)
                self._written += len(rows)
                if self._written >= EVICT_EVERY:
                    self._evict()
            except sqlite3.OperationalError:
                pass
            except sqlite3.DatabaseError as exc:
                self._give_up(exc)

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
                self._con = None
            self._broken = True

    def _open(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))    # this user's only (its WAL follows it)
            self._con = sqlite3.connect(self.path, timeout=BUSY_MS / 1000, check_same_thread=False,
                                        isolation_level=None)
            self._con.execute(f"PRAGMA busy_timeout = {BUSY_MS}")
            self._con.execute("PRAGMA journal_mode = WAL")
            self._con.execute("PRAGMA synchronous = NORMAL")
            with self._con:
                self._con.execute("BEGIN IMMEDIATE")
                row = self._con.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'vectors'"
                                        ).fetchone()
                if row is not None and "WITHOUT ROWID" in row[0].upper():    # an older ingest's (NOTE: layout)
                    self._con.execute("DROP TABLE vectors")
                self._con.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB NOT NULL UNIQUE, vec BLOB NOT NULL, "
                                  "used REAL NOT NULL)")
                self._con.execute("CREATE INDEX IF NOT EXISTS vectors_used ON vectors (used)")
            self._evict()
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):                 # another run is creating it: this run goes without
                self._give_up(exc, quiet=True)
            else:
                self._give_up(exc)
        except (sqlite3.DatabaseError, OSError) as exc:
            self._give_up(exc)

    def _evict(self) -> None:
        """Remove the least recently used rows past the bound, down to 90% of it."""
        self._written = 0
        (rows,) = self._con.execute("SELECT count(*) FROM vectors").fetchone()
        if rows > self.max_rows:
            with self._con:
                self._con.execute("DELETE FROM vectors WHERE key IN (SELECT key FROM vectors ORDER BY used LIMIT ?)",
                                  (rows - int(self.max_rows * 0.9),))

    def _give_up(self, exc: BaseException, quiet: bool = False) -> None:
        """No cache for the rest of this run, said in one line (never fatal: the vectors are encoded)."""
        if not quiet:
            what = getattr(exc, "strerror", None) or " ".join(str(exc).split())[:200]
            print(f"ingest: warning: the embedding cache {self.path} is unusable ({what}); encoding without it "
                  "(delete the file to start a new one)", file=sys.stderr)
        self._broken = True
        if self._con is not None:
            try:
                self._con.close()
            except sqlite3.Error:
                pass
            self._con = None


_opened: dict[str, VectorCache] = {}        # a writer process's caches by path (put_written)


def put_written(target: tuple[str, float, int], joined: bytes, vectors: np.ndarray) -> int:
    """In a writer process, after it stored the rows (ingest/write.py NOTE: cache): those of them with a key
    (16 bytes a row, joined; NO_KEY: not cached) into the cache `target` (path, max_mb, dim), opened once a
    process. Never raises: the cache is never needed."""
    path, max_mb, dim = target
    keys = [joined[i:i + 16] for i in range(0, len(joined), 16)]
    keep = [i for i, k in enumerate(keys) if k != NO_KEY]
    try:
        cache = _opened.get(path)
        if cache is None:
            cache = _opened[path] = VectorCache(Path(path), max_mb, dim)
        if len(keep) < len(keys):
            keys, vectors = [keys[i] for i in keep], vectors[keep]
        cache.put(keys, vectors)
    except Exception:                       # a bug here must not cost the run a writer
        return 0
    return len(keys)
