"""Office Open XML: which kind a ZIP is (for the sniff), and the checks shared by the DOCX and PPTX
loaders, run before python-docx / python-pptx open a file."""
from __future__ import annotations

import zipfile
from pathlib import Path
from .base import LoaderError, LoaderOptions, Unsupported

MB = 1024 * 1024
SIGNATURE = b"PK\x03\x04"
# main part -> the format it makes the ZIP
_MAIN_PARTS = {"word/document.xml": "docx", "ppt/presentation.xml": "pptx"}
# a part that names another kind of ZIP -> what it is, for the message refusing it
_OTHERS = {"xl/workbook.xml": "an Excel workbook (XLSX)", "visio/document.xml": "a Visio drawing (VSDX)",
           "META-INF/container.xml": "an EPUB e-book", "content.xml": "an OpenDocument file",
           "META-INF/MANIFEST.MF": "a Java archive (JAR)"}


def _not_a_zip(kind: str) -> LoaderError:
    return LoaderError(f"not a valid {kind} file (its zip directory cannot be read: damaged, truncated "
                       "or password-protected); re-save it from its application")


def zip_format(path: Path, kind: str) -> str:
    """"docx" or "pptx" by the main part in the ZIP's directory (its members are not read).

    Raises Unsupported for another kind of ZIP, LoaderError for one whose directory cannot be read;
    `kind` ("DOCX", "PPTX", "ZIP") names the file in that message.
    """
    try:
        with zipfile.ZipFile(path) as archive:
            names = set(archive.namelist())
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError):
        raise _not_a_zip(kind) from None
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
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError):
        raise _not_a_zip(kind) from None
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
