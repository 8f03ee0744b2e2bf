"""The scan step: walk the folder lazily; every file becomes a FileRef, in a deterministic order
(a directory's entries by name, a subdirectory at its sorted place).

A file's `source` (its manifest key, its name in the store and the report) is its relative path in
printable form, so any name the file system allows can be stored; its `path` is what is opened.

Several PATHs (`ingest run docs/a.pdf other/`): the walk starts at their ROOT, the deepest folder holding
every one (`common_root`), and goes only into the named entries, so a file's source is its path from
ROOT and `ingest run docs/a.pdf` names it `a.pdf` as `ingest run docs/` does.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

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
    if rel.isprintable() and "\\" not in rel:      # the common case: nothing to escape
        return rel
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


def scan(root: Path, follow_symlinks: str,
         named: Iterable[str] | None = None) -> Iterator[tuple[FileRef, Outcome | None]]:
    """(FileRef, None) for every file under `root`, lazily, directory by directory; a file that cannot be
    listed, stat'ed or followed, or is not to be followed, comes with its failed or skipped Outcome instead.

    The order is deterministic: a directory's entries sorted by name, a subdirectory walked at its
    sorted place; `seq` counts the files in that order as they are yielded, so the first file comes
    at once whatever the folder's size (only one directory's names are held per level).
    `follow_symlinks` ([run] follow_symlinks): "inside" follows a link to a file only when its
    target lies inside `root`, "all" follows every one, "none" none. A followed link's `path` is its
    resolved target. Links to folders are never followed. `named` (paths relative to `root`, "/"-joined, as
    `common_root` gives them): only those files and folders, in the same order; None: all of `root`.
    """
    inside = os.path.realpath(root)
    seq = 0
    stack = [iter(_listing(str(root), ".", _tree(named)))]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            continue
        full, source, kind, why, below = entry
        if kind == "dir":
            stack.append(iter(_listing(full, source, below)))
            continue
        number, seq = seq, seq + 1
        if kind == "unlisted":
            yield FileRef(number, source, full), Outcome("failed", f"{CANNOT_LIST}: {why}")
        elif kind == "dirlink":
            yield FileRef(number, source, full), Outcome("skipped", "directory symlink (not followed)")
        elif kind == "link" and follow_symlinks == "none":
            yield FileRef(number, source, full), Outcome("skipped", f"symlink; {_FOLLOW_HINT['none']}")
        else:
            yield _follow(number, source, full, follow_symlinks, inside, kind == "link")


_Tree = dict[str, "_Tree | None"]         # the named entries of a folder: name -> those under it (None: all)
_Entry = tuple[str, str, str, str, "_Tree | None"]


def _listing(folder: str, source: str, only: _Tree | None = None) -> list[_Entry]:
    """`folder`'s entries sorted by name, as (path, source, kind, "", only below it): kind "dir", "dirlink" (a
    link to a folder), "link" (to anything else, or broken) or "file"; or [(folder, source, "unlisted", why,
    None)] if it cannot be listed to its end (then none of its entries: what it holds is unknown). `source`
    is the folder's own ("." for the root). `only`: just those entries (not listed: each is lstat'ed)."""
    try:
        if only is None:
            with os.scandir(folder) as it:
                entries = sorted((e.name, e.path, _kind(e)) for e in it)
        else:
            paths = ((name, os.path.join(folder, name)) for name in sorted(only))
            entries = [(name, path, kind) for name, path in paths if (kind := _lkind(path))]
    except OSError as exc:
        return [(folder, source, "unlisted", exc.strerror or str(exc), None)]
    prefix = "" if source == "." else source + "/"
    return [(path, prefix + printable(name), kind, "", None if only is None else only[name])
            for name, path, kind in entries]


def _lkind(path: str) -> str:
    """As `_kind`, of a path; "" if it is gone."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return ""
    if stat.S_ISLNK(mode):
        return "dirlink" if os.path.isdir(path) else "link"
    return "dir" if stat.S_ISDIR(mode) else "file"


def _tree(named: Iterable[str] | None) -> _Tree | None:
    """The named paths as nested folders; a folder named itself keeps all it holds (None)."""
    if named is None:
        return None
    tree: _Tree = {}
    for rel in named:
        node: _Tree | None = tree
        *folders, last = rel.split("/")
        for name in folders:
            if (node := node.setdefault(name, {})) is None:      # a folder above is named: all of it already
                break
        else:
            node[last] = None
    return tree


def common_root(paths: Path | Sequence[Path]) -> tuple[Path, list[str] | None]:
    """ROOT, the deepest folder holding every path of `paths` (existing files and folders; a folder holds
    itself, a file its parent folder), and the paths relative to it ("/"-joined), or None if ROOT is one of
    them (all of it). Folders are resolved; a file's name is kept (a link stays a link for the scan)."""
    paths = [paths] if isinstance(paths, Path) else paths
    full = [(p.resolve(), True) if p.is_dir() else (p.parent.resolve() / p.name, False) for p in paths]
    root = Path(os.path.commonpath([f if is_dir else f.parent for f, is_dir in full]))
    if any(is_dir and f == root for f, is_dir in full):
        return root, None
    return root, sorted({f.relative_to(root).as_posix() for f, _ in full})


def under(sources: Iterable[str], named: Iterable[str] | None) -> Iterable[str]:
    """The `sources` at or below a path of `named` (as `scan` takes them); all of them if None."""
    if named is None:
        return sources
    exact = {printable(n) for n in named}
    below = tuple(n + "/" for n in exact)
    return [s for s in sources if s in exact or s.startswith(below)]


def _kind(entry: os.DirEntry) -> str:
    try:
        is_dir = entry.is_dir()
    except OSError:                        # as os.walk: an entry that cannot be told a folder is not one
        is_dir = False
    link = entry.is_symlink()
    return ("dirlink" if link else "dir") if is_dir else ("link" if link else "file")


class Scan:
    """A scan as an engine pulls it: `found` files so far (`on_found` called for each), `finished` once it ended."""

    def __init__(self, files: Iterator[tuple[FileRef, Outcome | None]], on_found: Callable[[], None]):
        self.files, self.on_found = files, on_found
        self.found, self.finished = 0, False

    def __iter__(self) -> Scan:
        return self

    def __next__(self) -> tuple[FileRef, Outcome | None]:
        try:
            item = next(self.files)
        except StopIteration:
            self.finished = True
            raise
        self.found += 1
        self.on_found()
        return item


def too_long(source: str, what: str) -> Outcome | None:
    """The failed Outcome of a source too long for the store's field, naming `what` to shorten; else None."""
    size = len(source.encode())
    if size <= SOURCE_MAX:
        return None
    return Outcome("failed", f"path is {size} bytes, too long for the store (at most {SOURCE_MAX}); shorten {what}")


def _follow(seq: int, source: str, full: str, follow_symlinks: str, inside: str,
            link: bool) -> tuple[FileRef, Outcome | None]:
    """File `seq` stat'ed, with a followed link's target as its path; or its failed or skipped Outcome."""
    if (long := too_long(source, "the file's path or name")) is not None:
        return FileRef(seq, source, full), long
    try:
        st = os.stat(full)
    except OSError as exc:
        return FileRef(seq, source, full), Outcome("failed", _stat_error(exc))
    path = full
    if link:
        path = os.path.realpath(path)
        if follow_symlinks == "inside" and os.path.commonpath((inside, path)) != inside:
            outside = f"link leads outside the folder; {_FOLLOW_HINT['inside']}"
            return FileRef(seq, source, full), Outcome("skipped", outside)
    return FileRef(seq, source, path, st.st_size, st.st_mtime_ns), None


def _stat_error(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "symlink loop; remove or fix the link"
    if exc.errno == errno.ENOENT:
        return "broken symlink; its target does not exist"
    if exc.errno == errno.EACCES:
        return "permission denied; check the file's permissions"
    return f"cannot stat file: {exc.strerror}"
