"""Legacy Office (.doc, .ppt): converted to DOCX/PPTX by headless LibreOffice, then read by the
docx/pptx loaders."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

from . import docx, pptx
from .base import Loader, LoaderError, LoaderOptions, Page, Unsupported, register


def convert(path: Path, target: str, workdir: Path, timeout_s: float) -> Path:
    """Convert `path` to format `target` ("docx", "pptx", "doc", "ppt") into `workdir`; the result's path.

    LibreOffice gets a fresh profile under `workdir` (parallel conversions don't clash) and runs in
    its own process group, killed after `timeout_s`.
    """
    ext = path.suffix.lower() or "file"
    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    if soffice is None:
        raise Unsupported(f"legacy {ext} needs LibreOffice (soffice) on PATH; "
                          "install libreoffice-writer-nogui / libreoffice-impress-nogui")
    cmd = [soffice, "--headless", "--norestore", f"-env:UserInstallation={(workdir / 'profile').as_uri()}",
           "--convert-to", target, "--outdir", str(workdir), str(path.absolute())]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise LoaderError(f"LibreOffice did not convert the {ext} within {timeout_s:g} s; "
                          "raise [loaders.legacy] convert_timeout_s") from None
    converted = workdir / f"{path.stem}.{target}"
    if not converted.is_file():
        errors = [line.strip() for line in err.decode(errors="replace").splitlines() if "rror" in line]
        reason = errors[-1][:160] if errors else "no output"
        raise LoaderError(f"LibreOffice could not convert the {ext} ({reason}); "
                          "open and re-save it in an Office application")
    return converted


def _load_converted(path: Path, options: LoaderOptions, target: str, loader: Loader) -> Iterator[Page]:
    with tempfile.TemporaryDirectory(prefix="ingest-legacy-") as workdir:
        pages = list(loader(convert(path, target, Path(workdir), options.convert_timeout_s), options))
    yield from pages


@register("doc", (".doc",), "docx")
def load_doc(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """A Word 97-2003 document, via DOCX: one page."""
    yield from _load_converted(path, options, "docx", docx.load)


@register("ppt", (".ppt",), "pptx")
def load_ppt(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """A PowerPoint 97-2003 deck, via PPTX: one page per slide."""
    yield from _load_converted(path, options, "pptx", pptx.load)
