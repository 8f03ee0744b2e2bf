"""Office Open XML: which kind a ZIP is (for the sniff), and the checks shared by the DOCX and PPTX
loaders, run before python-docx / python-pptx open a file.

NOTE (bounded reads): zipfile reads and parses a ZIP's whole central directory, as long as the
end-of-central-directory record (or its ZIP64 version) declares it. `_directory` reads only those
records (the last 64 KiB at most, and 76 bytes more for ZIP64) and refuses a directory of more
than MAX_ENTRIES entries or MAX_DIRECTORY bytes before zipfile opens the file. zipfile then reads no
more than the declared directory, so the sniff (in the supervisor) and the loaders' checks cost at
most ~0.5 s and ~20 MB (22,000 one-letter names under a count that lies), whatever the file.
"""
from __future__ import annotations

import os
import struct
import zipfile
from pathlib import Path
from typing import BinaryIO

from .base import LoaderError, LoaderOptions, Unsupported

MB = 1024 * 1024
SIGNATURE = b"PK\x03\x04"
MAX_ENTRIES = 10_000                 # files in one DOCX or PPTX (a 3,000-slide deck has ~7,000)
MAX_DIRECTORY = MB                   # bytes of central directory: ~100 per entry (46 + its name, extra, comment)
_EOCD, _EOCD64, _LOCATOR64 = b"PK\x05\x06", b"PK\x06\x06", b"PK\x06\x07"
_EOCD_SIZE, _EOCD64_SIZE, _LOCATOR64_SIZE = 22, 56, 20
# main part -> the format it makes the ZIP
_MAIN_PARTS = {"word/document.xml": "docx", "ppt/presentation.xml": "pptx"}
# a part that names another kind of ZIP -> what it is, for the message refusing it
_OTHERS = {"xl/workbook.xml": "an Excel workbook (XLSX)", "visio/document.xml": "a Visio drawing (VSDX)",
           "META-INF/container.xml": "an EPUB e-book", "content.xml": "an OpenDocument file",
           "META-INF/MANIFEST.MF": "a Java archive (JAR)"}


GENERATORS = {"python-docx", "python-pptx"}     # the libraries' template defaults: they say nothing of the author


def core_meta(props: object) -> tuple[tuple[str, str], ...]:
    """An Office document's core properties that the document card reads (subject, author, keywords), less a
    generating library's defaults."""
    out = []
    for key, attr in (("subject", "subject"), ("author", "author"), ("keywords", "keywords")):
        value = " ".join(str(getattr(props, attr, "") or "").split())[:300]
        if value and value.lower() not in GENERATORS:
            out.append((key, value))
    return tuple(out)


def _not_a_zip(kind: str) -> LoaderError:
    return LoaderError(f"not a valid {kind} file (its zip directory cannot be read: damaged, truncated "
                       "or password-protected); re-save it from its application")


def _directory(f: BinaryIO) -> tuple[int, int] | None:
    """(entries, bytes) of the central directory as the end records declare it, found as zipfile finds
    them (reading at most the last 64 KiB + 76 bytes); None without an end record."""
    size = f.seek(0, os.SEEK_END)
    f.seek(max(0, size - _EOCD_SIZE - 0xFFFF))
    tail = f.read()
    at = len(tail) - _EOCD_SIZE
    if not (tail[at:at + 4] == _EOCD and tail[-2:] == b"\0\0"):          # zipfile: a comment follows the record
        at = tail.rfind(_EOCD)
    if at < 0 or len(tail) - at < _EOCD_SIZE:
        return None
    entries, directory = struct.unpack_from("<HI", tail, at + 10)
    end = size - len(tail) + at                        # the ZIP64 record and its locator come just before it
    if end >= _LOCATOR64_SIZE + _EOCD64_SIZE:
        f.seek(end - _LOCATOR64_SIZE - _EOCD64_SIZE)
        record = f.read(_EOCD64_SIZE + _LOCATOR64_SIZE)
        if record[:4] == _EOCD64 and record[_EOCD64_SIZE:_EOCD64_SIZE + 4] == _LOCATOR64:
            entries, directory = struct.unpack_from("<QQ", record, 32)
    return entries, directory


def _open(path: Path, kind: str) -> zipfile.ZipFile:
    """The ZIP at `path`, opened once its end records declare a bounded directory (see the NOTE)."""
    try:
        with open(path, "rb") as f:
            found = _directory(f)
        if found is not None and found[0] <= MAX_ENTRIES and found[1] <= MAX_DIRECTORY:
            return zipfile.ZipFile(path)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError):
        raise _not_a_zip(kind) from None
    if found is None:
        raise _not_a_zip(kind)
    entries, directory = found
    raise LoaderError(f"{kind} holds {entries:,} files in a {directory / MB:.1f} MB zip directory, over the "
                      f"{MAX_ENTRIES:,} files or {MAX_DIRECTORY / MB:.1f} MB read before unzipping (a zip bomb?); "
                      "split it into smaller files to ingest it")


def zip_format(path: Path, kind: str) -> str:
    """"docx" or "pptx" by the main part in the ZIP's directory (its members are not read).

    Raises Unsupported for another kind of ZIP, LoaderError for one whose directory cannot be read
    or is too large (see the NOTE); `kind` ("DOCX", "PPTX", "ZIP") names the file in that message.
    """
    with _open(path, kind) as archive:
        names = set(archive.namelist())
    fmt = next((fmt for part, fmt in _MAIN_PARTS.items() if part in names), None)
    if fmt is None:
        what = next((label for part, label in _OTHERS.items() if part in names), "a ZIP archive")
        raise Unsupported(f"content is {what}, which is not supported; extract or convert it to ingest it")
    return fmt


def check_zip(path: Path, options: LoaderOptions, kind: str, main_part: str) -> None:
    """Refuse a non-zip, a zip without `main_part`, or one unzipping past [limits] max_unzipped_mb.

    Only the zip's directory is read; `kind` ("DOCX", "PPTX") names the file in messages.
    """
    limit = options.max_unzipped_mb
    with _open(path, kind) as archive:
        members = archive.infolist()
    if main_part not in {m.filename for m in members}:
        raise LoaderError(f"not a {kind} file (the zip has no {main_part}); check the file's type")
    unzipped = sum(m.file_size for m in members)
    if unzipped > limit * MB:
        raise LoaderError(f"{kind} unzips to {unzipped / MB:.1f} MB, over [limits] max_unzipped_mb = "
                          f"{limit:g} (a zip bomb?); raise the limit to ingest it")


def open_error(kind: str, exc: Exception) -> LoaderError:
    """The LoaderError for a file that passed check_zip but that python-docx/pptx cannot parse."""
    reason = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
    return LoaderError(f"cannot read {kind}: {reason}; re-save it from its application")
