"""What a LanceDB store's folder holds: a table is a folder `<name>.lance` whose `_versions/` holds a manifest for
each committed version (Lance writes the data, then the version's manifest, renamed into place). A path naming a
folder of other files is refused before anything is written among them (`foreign_folder`); a table folder that a
full disk left without any version holds nothing that was ever committed, and Lance would neither open it nor make
it again ("Table ... was not found" on every rerun): `remove_unmade` removes it, so the run makes it anew."""
from __future__ import annotations

import shutil
from pathlib import Path

from ingest.store.lite_folder import other_files

LANCE_DIRS = ("data", "_versions", "_transactions", "_indices", "_deletions")   # what Lance makes in a table's folder


def foreign_folder(path: Path, uri: str) -> str | None:
    """The one-line refusal of a folder that holds other files and no Lance table; None if fine."""
    if not other_files(path, lambda p: any(c.name.endswith(".lance") for c in p.iterdir())):
        return None
    return (f"store {uri} is a folder of other files, not a LanceDB store, and ingest would write its files "
            f"among them; pass a folder that does not exist yet, such as lancedb://{path}.lance")


def committed(table: Path) -> bool:
    """Whether `table` is a table's folder: one with a committed version, or one not told apart from such (a
    `_versions/` that cannot be read, or more in it than Lance's own folders): never removed on evidence not
    fully read."""
    if not table.is_dir():
        return False
    try:
        return any(p.name.endswith(".manifest") for p in (table / "_versions").iterdir()) or any(
            not p.is_dir() or p.name not in LANCE_DIRS for p in table.iterdir())
    except OSError:
        return True


def remove_unmade(table: Path) -> None:
    """Remove the folder `table` if it holds Lance's own folders and no committed version."""
    if table.is_dir() and not committed(table):
        shutil.rmtree(table)
