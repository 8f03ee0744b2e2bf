"""The sniff step: what a file is before any loader opens it, and whether it needs one at all.

For the built-in formats the content decides, not the extension: the first bytes (at most
HEAD_BYTES), a ZIP's directory or a compound file's directory tell a PDF, DOCX, PPTX, DOC, PPT,
image or text file apart, so this stays cheap enough for the dispatcher's thread. Every read is
bounded whatever the file holds: a ZIP's directory is read only once its end record declares at
most ooxml.MAX_ENTRIES entries in ooxml.MAX_DIRECTORY bytes, a compound file's directory only as
far as ole.MAX_DIR_SECTORS. A file read by
its content despite its name gets a warning. Text-encoding knowledge (BOMs, BOM-less UTF-16) comes
from the text loader. Before any of that, the manifest: a file whose size and mtime are unchanged
is done here without being opened; after it, the size limit.

NOTE (deferred sniff): a small text or Markdown file (by its name; the dispatcher's `defer`: one that goes to a
loader several to a task, ingest/load_batch.py) is not opened here but by its loader worker, which sniffs it
first (`LoadTask.sniff`): the dispatcher's thread is spared four system calls a file, each a hand-off of the GIL
(~3 us of its CPU a chunk at 16 chunks a file, bench/feed.py). The worker's verdict is the same: a file the
sniff skips or fails comes back as that Failure, with the sniff's words; one whose content is another format
comes back `Misnamed`, and the dispatcher sends it alone to that format's pool, with the warning it gets here
(`content_format`).
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Callable

from ingest import remote
from ingest.files import FileRef, Finished, Outcome, evolve
from ingest.loaders import LoaderError, Unsupported, format_for_extension
from ingest.loaders.ole import SIGNATURE as OLE_SIGNATURE, office_format
from ingest.loaders.ooxml import SIGNATURE as ZIP_SIGNATURE, zip_format
from ingest.loaders.text import BOMS, HEAD_BYTES, utf16_without_bom
from ingest.names import suffix
from ingest.store.manifest import Entry

# The formats whose content the sniff knows, as it names them in a warning; other (plugin) formats
# are trusted by their extension.
LABELS = {"pdf": "a PDF", "docx": "a DOCX document", "pptx": "a PPTX presentation",
          "doc": "a Word 97-2003 or RTF document", "ppt": "a PowerPoint 97-2003 presentation",
          "image": "an image", "txt": "plain text", "md": "plain text"}
_TEXT = ("txt", "md")
_LEGACY = ("doc", "ppt")
_IMAGES = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"II*\x00", b"MM\x00*")
_CONTROL = bytes(sorted(frozenset(range(0x09)) | (frozenset(range(0x0E, 0x20)) - {0x1B})))   # not \t \n \v \f \r ESC


def _signature(head: bytes, claimed: str | None) -> str | None:
    """"pdf", "zip", "ole", "rtf" or "image" by the first bytes; None for anything else."""
    if head.startswith(ZIP_SIGNATURE):
        return "zip"
    if head.startswith(OLE_SIGNATURE):
        return "ole"
    if head.startswith(b"{\\rtf"):
        return "rtf"
    if head.startswith(_IMAGES) or (head[:2] == b"BM" and head[6:10] == b"\0\0\0\0"):
        return "image"                    # "BM..." text is no bitmap: a bitmap's reserved bytes are zero
    if head.startswith(b"%PDF-") or (b"%PDF-" in head[:1024] and (claimed == "pdf" or _is_binary(head))):
        return "pdf"                      # readers accept junk before the header
    return None


def _is_binary(head: bytes) -> bool:
    if any(head.startswith(bom) for bom, _ in BOMS) or utf16_without_bom(head):
        return False
    controls = len(head) - len(head.translate(None, _CONTROL))        # in C: 27 -> 1 µs for a 1.5 KB head
    return b"\0" in head or controls > len(head) * 0.05


def _read_head(path: Path) -> bytes:
    """The first HEAD_BYTES of a regular file (opened non-blocking, so a FIFO cannot hang the caller)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except PermissionError:
        raise LoaderError("permission denied; check the file's permissions") from None
    except FileNotFoundError:
        raise LoaderError("file not found (a broken symlink, or removed during the run)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise LoaderError("symlink loop; fix or remove the link") from None
        raise LoaderError(f"cannot open the file: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise LoaderError("not a regular file (a directory, pipe or device); leave it out of the folder")
        return os.read(fd, HEAD_BYTES)
    except OSError as exc:
        raise LoaderError(f"cannot read the file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def detect_format(path: Path | str, ext: str | None = None) -> str:
    """The format to read `path` (a local path, or a URL: ingest/remote.py) as: for the built-in formats,
    the one its content shows.

    `ext` is the extension its name claims (`path`'s own by default; a followed link's name may
    differ from its target's). Raises Unsupported for an unknown extension, an empty file or a
    known kind of file no loader reads, LoaderError for an unreadable, damaged or misnamed file.
    """
    url = remote.is_url(path)
    ext = (PurePosixPath(path).suffix if ext is None else ext).lower()
    claimed = format_for_extension(ext)
    if claimed is None and ext:
        raise Unsupported(f"unsupported file type {ext}")
    try:
        head = remote.read_head(str(path), HEAD_BYTES) if url else _read_head(Path(path))
        if not head.strip() and len(head) < HEAD_BYTES:
            raise Unsupported("empty file")
        if claimed is not None and claimed not in LABELS:
            return claimed
        if url and (kind := _signature(head, claimed)) in ("zip", "ole"):
            return _container_by_name(kind, claimed, ext)
        return _by_content(path, head, claimed, ext)
    except LoaderError:
        if claimed is None:
            raise Unsupported("unsupported file type (no extension)") from None
        raise


def _by_content(path: Path, head: bytes, claimed: str | None, ext: str) -> str:
    """The built-in format of the content; `claimed` is the extension's format (None: no extension)."""
    kind = _signature(head, claimed)
    try:
        if kind == "zip":
            return zip_format(path, claimed.upper() if claimed in ("docx", "pptx") else "ZIP")
        if kind == "ole":
            return _ole_format(path, claimed)
    except OSError as exc:
        raise LoaderError(f"cannot read the file: {exc.strerror or exc}") from None
    if kind is not None:
        return "doc" if kind == "rtf" else kind          # LibreOffice reads RTF as a document
    if claimed is None:
        raise Unsupported("unsupported file type (no extension)")
    if not _is_binary(head):
        if claimed in _TEXT:
            return claimed
        raise LoaderError(f"content does not look like a {ext} file (it is plain text); "
                          "rename it to .txt to ingest it as text")
    if claimed in _TEXT:
        raise LoaderError(f"binary content in a {ext} file; check what the file really is")
    raise LoaderError(f"content does not look like a {ext} file; the file is damaged or misnamed")


def _container_by_name(kind: str, claimed: str | None, ext: str) -> str:
    """An object's ZIP or compound file by its name: its directory lies past the head, so the loader, reading
    the local copy, tells a misnamed one."""
    if claimed in (("docx", "pptx") if kind == "zip" else _LEGACY):
        return claimed
    if claimed is None:
        raise Unsupported("unsupported file type (no extension)")
    what = "a ZIP archive" if kind == "zip" else "a legacy Office file"
    raise LoaderError(f"content is {what}, not a {ext} file; rename it to what it is to ingest it")


def _ole_format(path: Path, claimed: str | None) -> str:
    """doc or ppt by the compound file's directory; a .doc or .ppt that cannot be told is trusted to LibreOffice."""
    try:
        fmt = office_format(path)
    except LoaderError:
        if claimed in _LEGACY:
            return claimed
        raise
    if fmt is None and claimed in _LEGACY:
        return claimed
    if fmt is None:
        raise Unsupported("content is a legacy Office file whose kind could not be told; "
                          "convert it to PDF or DOCX to ingest it")
    return fmt


def unchanged(ref: FileRef, known: Entry | None, settings: str) -> Finished | None:
    """`ref` as an unchanged Finished file if its manifest entry has its size, mtime and settings (it is not
    opened), else None."""
    if (known is not None and known.status == "ingested" and known.settings == settings
            and (known.size, known.mtime_ns) == (ref.size, ref.mtime_ns)):
        return Finished(replace(ref, fmt=known.format, file_hash=known.file_hash),
                        Outcome("unchanged", chunks=known.chunks))
    return None


@dataclass(frozen=True)
class Misnamed:
    """A loader's answer for a file it sniffed (NOTE: deferred sniff) whose content is another format: `fmt`."""
    fmt: str


def sniffed(path: str, source: str, fmt: str) -> Misnamed | None:
    """In a loader worker (NOTE: deferred sniff): None if the file at `path` (`source` in the folder) is `fmt`, what
    its name says; Misnamed if its content is another format. Raises the sniff's Unsupported or LoaderError."""
    found = detect_format(path, suffix(source))
    return None if found == fmt else Misnamed(found)


def sniff(ref: FileRef, known: Entry | None, settings: str, max_file_mb: float,
          defer: Callable[[FileRef], bool] = lambda ref: False) -> FileRef | Finished:
    """The step before loading: `ref` with its format (and a warning when its content contradicts
    its name), or the Finished file when it needs no loader (unsupported, empty, unreadable or
    damaged, over max_file_mb, or unchanged by size and mtime, which is decided first: an unchanged
    file is not opened). A file `defer` takes, by its name's format, is not opened here: its loader
    sniffs it (NOTE: deferred sniff)."""
    if (same := unchanged(ref, known, settings)) is not None:
        return same
    ext = suffix(ref.source)        # the name in the folder, not a followed link's target
    claimed = format_for_extension(ext)
    guess = evolve(ref, fmt=claimed or ext.lstrip(".") or "unknown")
    if claimed is not None and ref.size <= max_file_mb * 1e6 and defer(guess):
        return guess
    try:
        fmt = detect_format(ref.path, ext)
    except Unsupported as exc:
        return Finished(guess, Outcome("skipped", str(exc)))
    except LoaderError as exc:
        return Finished(guess, Outcome("failed", str(exc)))
    return content_format(ref, fmt, max_file_mb)


def content_format(ref: FileRef, fmt: str, max_file_mb: float) -> FileRef | Finished:
    """`ref` read as `fmt`, what its content is: a warning if its name says otherwise; failed if over max_file_mb."""
    ext = suffix(ref.source)
    claimed = format_for_extension(ext)
    ref = evolve(ref, fmt=fmt)
    if claimed is not None and fmt != claimed:
        ref = replace(ref, warnings=(*ref.warnings, f"content is {LABELS[fmt]}; read as {fmt} despite the {ext} name"))
    if ref.size > max_file_mb * 1e6:
        return Finished(ref, Outcome("failed", f"file is {ref.size / 1e6:.0f} MB, over [limits] max_file_mb = "
                                               f"{max_file_mb:g}; raise the limit to ingest it"))
    return ref
