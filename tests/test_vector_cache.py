"""The vector cache's lookups (ingest/vector_cache.py NOTE: lookups): only keys the file may hold are queried."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from conftest import sqlite
from ingest.vector_cache import VectorCache


def _keys(n: int, tag: bytes) -> list[bytes]:
    return [tag + i.to_bytes(15, "big") for i in range(n)]


def test_lookups_find_what_the_file_holds_and_what_was_put_or_noted_since(tmp_path: Path) -> None:
    path = tmp_path / "v.sqlite"
    first = VectorCache(path, 10, 4)
    old = _keys(50, b"a")
    first.put(old, np.arange(200, dtype=np.float32).reshape(50, 4))
    first.close()

    cache = VectorCache(path, 10, 4)
    queries: list[str] = []
    cache._con.set_trace_callback(queries.append)
    assert set(cache.get(old[:10])) == set(old[:10])
    assert np.array_equal(cache.get([old[3]])[old[3]], np.arange(12, 16, dtype=np.float32))
    queries.clear()
    assert cache.get(_keys(20, b"z")) == {}                 # none of them can be there: no query
    assert not [q for q in queries if q.startswith("SELECT")]

    new = _keys(5, b"n")
    cache.put(new, np.ones((5, 4), np.float32))             # put after the first get
    assert set(cache.get(new + _keys(3, b"z"))) == set(new)

    other = VectorCache(path, 10, 4)                        # another process's writer fills rows noted here
    noted = _keys(4, b"w")
    other.put(noted, np.full((4, 4), 2.0, np.float32))
    assert cache.get(noted) == {}                           # written after this cache's first get, not noted
    cache.note(noted)
    assert set(cache.get(noted)) == set(noted)
    other.close()
    cache.close()
    with sqlite(path) as con:
        assert con.execute("SELECT count(*) FROM vectors").fetchone()[0] == 59


def test_the_noted_keys_stay_within_the_bound_of_the_file(tmp_path: Path) -> None:
    """More keys noted than the file may hold: the filter is read again from the file, not kept growing."""
    path = tmp_path / "v.sqlite"
    cache = VectorCache(path, 0.0008, 4)                    # (4 floats + 64 bytes) a row: 10 rows
    assert cache.max_rows == 10 and cache.get(_keys(1, b"z")) == {}
    writer = VectorCache(path, 0.0008, 4)
    noted = _keys(11, b"w")
    writer.put(noted[:5], np.ones((5, 4), np.float32))      # another process wrote five of them
    cache.note(noted)
    assert set(cache.get(noted)) == set(noted[:5]) and not cache._added
    writer.close()
    cache.close()
