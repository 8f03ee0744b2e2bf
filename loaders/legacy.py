"""Legacy Office (.doc, .ppt): converted to DOCX/PPTX by headless LibreOffice, run under
loaders/_guard.py, then read by the docx/pptx loaders.

NOTE (nothing from outside the document): a .doc or .ppt can link other files (INCLUDETEXT fields,
linked sections, OLE objects, images, DDE links) and carry macros. Every conversion starts from a
fresh profile seeded with PROFILE_SETTINGS: links are never updated on load (Writer
Content/Update/Link = 2, Calc's = 1: each application numbers "never" its own way), macros never
run (security level 3, execution disabled), links to untrusted locations are blocked; a link's
cached result (what the author saw when saving) is part of the document and is kept. The guard
also runs LibreOffice without network.
"""
from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from . import docx, pptx
from ._guard import TIMEOUT
from .base import Loader, LoaderError, LoaderOptions, Page, Unsupported, register

GUARD = Path(__file__).with_name("_guard.py")
GRACE_S = 10.0                     # the guard answers within timeout_s; past this much more, we stop waiting
SOURCE_EXT = {"docx": ".doc", "pptx": ".ppt", "doc": ".docx", "ppt": ".pptx"}   # what converts to each target
_SETTINGS = {"Writer/Content/Update": {"Link": ("int", 2)}, "Calc/Content/Update": {"Link": ("int", 1)},
             "Common/Security/Scripting": {"MacroSecurityLevel": ("int", 3), "DisableMacrosExecution": ("boolean", True),
                                           "BlockUntrustedRefererLinks": ("boolean", True)}}
PROFILE_SETTINGS = "".join(
    ['<?xml version="1.0" encoding="UTF-8"?>\n<oor:items xmlns:oor="http://openoffice.org/2001/registry" '
     'xmlns:xs="http://www.w3.org/2001/XMLSchema" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n']
    + [f'<item oor:path="/org.openoffice.Office.{group}"><prop oor:name="{name}" oor:op="fuse" oor:type="xs:{kind}">'
       f'<value>{str(value).lower()}</value></prop></item>\n'
       for group, props in _SETTINGS.items() for name, (kind, value) in props.items()]
    + ["</oor:items>\n"])


@contextmanager
def converting(path: Path, target: str, timeout_s: float) -> Iterator[Path]:
    """Convert `path` to format `target` ("docx", "pptx", "doc", "ppt"); the result's path, valid inside `with`.

    LibreOffice runs under loaders/_guard.py (see its NOTE) in a fresh temp dir holding its profile,
    the input under a safe name and the output; the guard removes that dir when the `with` ends or
    this process dies, and kills LibreOffice after `timeout_s`.
    """
    ext = path.suffix.lower() or "file"
    soffice = shutil.which("soffice") or shutil.which("libreoffice")
    if soffice is None:
        raise Unsupported(f"legacy {ext} needs LibreOffice (soffice) on PATH; "
                          "install libreoffice-writer-nogui / libreoffice-impress-nogui")
    workdir = Path(tempfile.mkdtemp(prefix="ingest-legacy-"))
    source = workdir / f"input{SOURCE_EXT.get(target, path.suffix.lower())}"   # any name converts
    os.symlink(path.absolute(), source)
    (workdir / "profile" / "user").mkdir(parents=True)
    (workdir / "profile" / "user" / "registrymodifications.xcu").write_text(PROFILE_SETTINGS)     # see the NOTE
    cmd = [soffice, "--headless", "--norestore", f"-env:UserInstallation={(workdir / 'profile').as_uri()}",
           "--convert-to", target, "--outdir", str(workdir / "out"), str(source)]
    guard = subprocess.Popen([sys.executable, "-I", str(GUARD), str(os.getpid()), str(workdir), repr(timeout_s), *cmd],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        ready, _, _ = select.select([guard.stdout], [], [], timeout_s + GRACE_S)
        verdict = guard.stdout.readline().strip() if ready else str(TIMEOUT).encode()
        if verdict == str(TIMEOUT).encode():
            raise LoaderError(f"LibreOffice did not convert the {ext} within {timeout_s:g} s; "
                              "raise [loaders.legacy] convert_timeout_s")
        converted = workdir / "out" / f"{source.stem}.{target}"
        if not converted.is_file():
            raise LoaderError(f"LibreOffice could not convert the {ext} ({_reason(workdir)}); "
                              "open and re-save it in an Office application")
        yield converted
    finally:
        guard.stdin.close()        # the guard kills what is left of LibreOffice and removes workdir
        try:
            guard.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            guard.kill()
            guard.wait()
        guard.stdout.close()
        shutil.rmtree(workdir, ignore_errors=True)      # already gone unless the guard failed


def _reason(workdir: Path) -> str:
    """The last error line LibreOffice (or the guard) logged."""
    try:
        log = (workdir / "soffice.log").read_text(errors="replace")
    except OSError:
        log = ""
    errors = [line.strip() for line in log.splitlines() if "rror" in line]
    return errors[-1][:160] if errors else "no output"


def convert(path: Path, target: str, outdir: Path, timeout_s: float) -> Path:
    """Convert `path` to format `target` into `outdir` (see `converting`); the result's path."""
    with converting(path, target, timeout_s) as converted:
        return Path(shutil.move(converted, outdir / f"{path.stem}.{target}"))


def _load_converted(path: Path, options: LoaderOptions, target: str, loader: Loader) -> Iterator[Page]:
    with converting(path, target, options.convert_timeout_s) as converted:
        pages = list(loader(converted, options))
    yield from pages


@register("doc", (".doc",), "docx")
def load_doc(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """A Word 97-2003 document, via DOCX: one page."""
    yield from _load_converted(path, options, "docx", docx.load)


@register("ppt", (".ppt",), "pptx")
def load_ppt(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """A PowerPoint 97-2003 deck, via PPTX: one page per slide."""
    yield from _load_converted(path, options, "pptx", pptx.load)
