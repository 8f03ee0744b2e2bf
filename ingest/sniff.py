"""The sniff step: what a file is before any loader opens it, and whether it needs one at all.

Its format comes from its extension, confirmed by its first bytes (at most HEAD_BYTES are
read, so this stays cheap enough for the dispatcher's thread); text-encoding knowledge (BOMs,
BOM-less UTF-16) comes from the text loader. Then the size limit, and the manifest: a file
whose size and mtime are unchanged is done here.
"""
from __future__ import annotations

import errno
import os
import stat
from dataclasses import replace
from pathlib import Path

from ingest.files import FileRef, Finished, Outcome
from ingest.loaders import LoaderError, Unsupported, format_for_extension
from ingest.loaders.text import BOMS, HEAD_BYTES, utf16_without_bom
from ingest.manifest import Entry

# kind -> (signature at offset 0, how to name it in a message, extension to suggest)
_MAGIC: dict[str, tuple[bytes, str, str]] = {
    "pdf": (b"%PDF-", "PDF", ".pdf"),
    "zip": (b"PK\x03\x04", "a ZIP (Office Open XML) archive", ".docx or .pptx"),
    "ole": (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "a legacy Office (OLE2) file", ".doc or .ppt"),
    "rtf": (b"{\\rtf", "RTF", ".doc"),
    "png": (b"\x89PNG\r\n\x1a\n", "a PNG image", ".png"),
    "jpeg": (b"\xff\xd8\xff", "a JPEG image", ".jpg"),
    "tiff-le": (b"II*\x00", "a TIFF image", ".tif"),
    "tiff-be": (b"MM\x00*", "a TIFF image", ".tif"),
    "bmp": (b"BM", "a BMP image", ".bmp"),
}
_IMAGES = {"png", "jpeg", "tiff-le", "tiff-be", "bmp"}
# format -> content kinds it accepts; "text" means: not binary. Formats not listed (plugins) are not checked.
_EXPECTED: dict[str, set[str]] = {
    "pdf": {"pdf"},
    "docx": {"zip"},
    "pptx": {"zip"},
    "doc": {"ole", "zip", "rtf"},   # LibreOffice reads a .docx or RTF saved as .doc too
    "ppt": {"ole", "zip"},
    "image": _IMAGES,
    "txt": {"text"},
    "md": {"text"},
}
_CONTROL = frozenset(range(0x09)) | (frozenset(range(0x0E, 0x20)) - {0x1B})   # not \t \n \v \f \r ESC


def _kind(head: bytes) -> str | None:
    if head[:2] == b"BM" and head[6:10] != b"\0\0\0\0":
        return None                       # "BM..." text, not a bitmap header (reserved bytes are zero)
    return next((k for k, (sig, _, _) in _MAGIC.items() if head.startswith(sig)), None)


def _is_binary(head: bytes) -> bool:
    if any(head.startswith(bom) for bom, _ in BOMS) or utf16_without_bom(head):
        return False
    controls = sum(1 for b in head if b in _CONTROL)
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


def detect_format(path: Path) -> str:
    """The registered format for `path`, after checking that its content matches its extension.

    Raises Unsupported for an extension no loader handles, LoaderError for an unreadable,
    empty or misnamed file.
    """
    ext = path.suffix.lower()
    fmt = format_for_extension(ext)
    if fmt is None:
        raise Unsupported(f"unsupported file type {ext}" if ext else "unsupported file type (no extension)")
    head = _read_head(path)
    if not head:
        raise LoaderError("empty file")
    expected = _EXPECTED.get(fmt)
    if expected is None:
        return fmt
    kind = "pdf" if fmt == "pdf" and b"%PDF-" in head[:1024] else _kind(head)
    if kind in expected or (kind is None and "text" in expected and not _is_binary(head)):
        return fmt
    if kind is not None:
        _, label, suggest = _MAGIC[kind]
        raise LoaderError(f"content is {label} but the name ends in {ext}; rename it to {suggest}")
    if "text" in expected:
        raise LoaderError(f"binary content in a {ext} file; check what the file really is")
    raise LoaderError(f"content does not look like a {ext} file; the file is damaged or misnamed")


def sniff(ref: FileRef, known: Entry | None, settings: str, max_file_mb: float) -> FileRef | Finished:
    """The step before loading: `ref` with its format, or the Finished file when it needs no
    loader (unsupported, unreadable or misnamed, over max_file_mb, or unchanged by size and mtime)."""
    suffix = Path(ref.path).suffix.lower()
    guess = replace(ref, fmt=format_for_extension(suffix) or suffix.lstrip(".") or "unknown")
    try:
        ref = replace(ref, fmt=detect_format(Path(ref.path)))
    except Unsupported as exc:
        return Finished(guess, Outcome("skipped", str(exc)))
    except LoaderError as exc:
        return Finished(guess, Outcome("failed", str(exc)))
    if ref.size > max_file_mb * 1e6:
        return Finished(ref, Outcome("failed", f"file is {ref.size / 1e6:.0f} MB, over [limits] max_file_mb = "
                                               f"{max_file_mb:g}; raise the limit to ingest it"))
    if (known is not None and known.status == "ingested" and known.settings == settings
            and (known.size, known.mtime_ns) == (ref.size, ref.mtime_ns)):
        return Finished(replace(ref, file_hash=known.file_hash), Outcome("unchanged", chunks=known.chunks))
    return ref
