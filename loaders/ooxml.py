"""Checks shared by the DOCX and PPTX loaders, run before python-docx / python-pptx open a file."""
from __future__ import annotations

import zipfile
from pathlib import Path
from .base import LoaderError, LoaderOptions

MB = 1024 * 1024


def check_zip(path: Path, options: LoaderOptions, kind: str, main_part: str) -> None:
    """Refuse a non-zip, a zip without `main_part`, or one unzipping past [limits] max_unzipped_mb.

    Only the zip's directory is read; `kind` ("DOCX", "PPTX") names the file in messages.
    """
    limit = options.max_unzipped_mb
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError):
        raise LoaderError(f"not a valid {kind} file (not a zip archive: damaged, truncated or "
                          "password-protected); re-save it from its application") from None
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
