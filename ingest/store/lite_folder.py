"""What may become a Milvus Lite store: Milvus Lite keeps a store in a folder of its own (collections/,
databases/, LOCK: milvus_lite/db.py), made on first open. A path naming a folder that already holds other
files (a folder of documents, `--store ./mydocs`) would get Milvus' files among them: `ingest run`, `watch`
(`open_collection`), `search`, `eval` (`Searcher`) and `status` refuse it in one line (`foreign_folder`),
before anything is created. Qdrant's local mode refuses such a folder the same way (`other_files`)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

LITE_MARKS = ("collections", "databases")     # folders every Milvus Lite open makes first, before its LOCK


def foreign_folder(uri: str) -> str | None:
    """The one-line error for a Lite store path that is a non-empty folder but no Milvus Lite store; None
    for a store, an empty folder, a path that is not a folder, or one that cannot be looked into (then
    opening it says what is wrong)."""
    path = Path(uri)
    if not other_files(path, lambda p: all((p / mark).is_dir() for mark in LITE_MARKS)):
        return None
    return (f"store {uri} is a folder of other files, not a Milvus Lite store, and ingest would write its files "
            f"among them; pass a path that does not exist yet, such as --store {path}.db")


def other_files(path: Path, is_store: Callable[[Path], bool]) -> bool:
    """Whether `path` is a non-empty folder that `is_store` does not recognize (an embedded store's folder
    must never be made among a user's files); False where it cannot be looked into."""
    try:
        if not path.is_dir() or is_store(path):
            return False
        with os.scandir(path) as entries:
            return next(entries, None) is not None
    except OSError:
        return False
