"""Cheap content checks: the format for a file, from its extension, confirmed by its first bytes.

Called by the supervisor for every file, so it imports only the stdlib and loaders.base and
reads at most HEAD_BYTES of the file.
"""
from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .base import LoaderError, Unsupported, format_for_extension

HEAD_BYTES = 8192

# Byte-order marks, longest first (the UTF-32 LE mark starts with the UTF-16 LE one).
BOMS: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xef\xbb\xbf", "utf-8-sig"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)

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


def utf16_without_bom(head: bytes) -> str | None:
    """The UTF-16 byte order when NULs fall on one byte position only (mostly-ASCII UTF-16), else None."""
    sample = head[: len(head) - len(head) % 2]
    if len(sample) < 4:
        return None
    pairs = len(sample) // 2
    even = sample[0::2].count(0) / pairs
    odd = sample[1::2].count(0) / pairs
    if odd > 0.1 and even < 0.02:         # ASCII "A" is 41 00 in UTF-16-LE
        return "utf-16-le"
    if even > 0.1 and odd < 0.02:
        return "utf-16-be"
    return None


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
