"""OLE2 compound files (legacy Office): which application wrote one, from the names in its root storage.

A small, bounded reader of the compound file binary format: the header, the FAT sectors that the
directory chain runs through, and at most MAX_DIR_SECTORS directory sectors; never the streams.
"""
from __future__ import annotations

import struct
from pathlib import Path
from typing import BinaryIO

from .base import LoaderError, Unsupported

SIGNATURE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
MAX_DIR_SECTORS = 64          # 256 entries with 512-byte sectors
MAX_DIFAT_SECTORS = 64        # FAT sectors listed past the header's 109: files up to ~500 MB
_ENTRY = 128                  # bytes per directory entry
_END = 0xFFFFFFFA             # sector and entry numbers from here up are markers (end of chain, none, ...)
# root stream -> the format it makes the file
_FORMATS = {"WordDocument": "doc", "PowerPoint Document": "ppt"}
# root stream -> what the file is, for the message refusing it
_OTHERS = {"Workbook": "an Excel 97-2003 workbook", "Book": "an Excel 95 workbook",
           "__properties_version1.0": "an Outlook message", "VisioDocument": "a Visio drawing"}
_ENCRYPTED = "EncryptedPackage"


class TooLong(Exception):
    """The directory runs past MAX_DIR_SECTORS."""


def _damaged(what: str) -> LoaderError:
    return LoaderError(f"damaged legacy Office file ({what}); re-save or replace it")


class _Reader:
    """Bounds-checked access to one open compound file's sectors and directory entries."""

    def __init__(self, f: BinaryIO, header: bytes):
        shift = struct.unpack_from("<H", header, 0x1E)[0]
        if shift not in (9, 12):
            raise _damaged("bad sector size in its header")
        self.f, self.size = f, 1 << shift
        self.per = self.size // 4                # sector numbers per FAT or DIFAT sector
        self.fat = [s for s in struct.unpack_from("<109I", header, 0x4C) if s < _END]
        self.next_difat, self.difat_read = struct.unpack_from("<I", header, 0x44)[0], 0
        self.chain = [struct.unpack_from("<I", header, 0x30)[0]]     # directory sectors found so far
        self.dir_data: dict[int, bytes] = {}

    def sector(self, number: int) -> bytes:
        self.f.seek((number + 1) * self.size)
        data = self.f.read(self.size)
        if len(data) != self.size:
            raise _damaged("a sector lies past its end")
        return data

    def _next(self, number: int) -> int:
        """The sector after `number` in its chain, through the FAT (and the DIFAT past 109 FAT sectors)."""
        index = number // self.per
        while index >= len(self.fat) and self.next_difat < _END and self.difat_read < MAX_DIFAT_SECTORS:
            numbers = struct.unpack(f"<{self.per}I", self.sector(self.next_difat))
            self.fat += [s for s in numbers[:-1] if s < _END]
            self.next_difat, self.difat_read = numbers[-1], self.difat_read + 1
        if index >= len(self.fat):
            raise _damaged("its allocation table is cut short")
        return struct.unpack_from("<I", self.sector(self.fat[index]), (number % self.per) * 4)[0]

    def entry(self, index: int) -> bytes:
        """Directory entry `index` (128 bytes). Raises TooLong past MAX_DIR_SECTORS."""
        k, offset = divmod(index * _ENTRY, self.size)
        while len(self.chain) <= k:
            if len(self.chain) == MAX_DIR_SECTORS:
                raise TooLong
            following = self._next(self.chain[-1])
            if following >= _END or following in self.chain:
                raise _damaged("an entry lies past the end of its directory")
            self.chain.append(following)
        if k not in self.dir_data:
            self.dir_data[k] = self.sector(self.chain[k])
        return self.dir_data[k][offset:offset + _ENTRY]


def root_names(path: Path) -> set[str]:
    """The names of the streams and storages in the root storage of compound file `path`.

    Raises TooLong when they lie past the bounded part of the directory, LoaderError for a damaged file.
    """
    with open(path, "rb") as f:
        header = f.read(512)
        if len(header) < 512 or not header.startswith(SIGNATURE):
            raise _damaged("its header is cut short")
        reader = _Reader(f, header)
        root = reader.entry(0)
        if root[66] != 5:
            raise _damaged("its directory has no root entry")
        names: set[str] = set()
        todo, seen = [struct.unpack_from("<I", root, 76)[0]], set()     # the root's child: a tree of siblings
        while todo:
            index = todo.pop()
            if index >= _END or index in seen:
                continue
            seen.add(index)
            entry = reader.entry(index)
            length = min(struct.unpack_from("<H", entry, 64)[0], 64)
            names.add(entry[:max(length - 2, 0)].decode("utf-16-le", errors="replace"))
            todo += struct.unpack_from("<II", entry, 68)                 # left and right siblings
        return names


def office_format(path: Path) -> str | None:
    """"doc" or "ppt" for a Word or PowerPoint 97-2003 file; None when its directory is too long to tell.

    Raises Unsupported for another kind of compound file, LoaderError for an encrypted or damaged one.
    """
    try:
        names = root_names(path)
    except TooLong:
        return None
    for name, fmt in _FORMATS.items():
        if name in names:
            return fmt
    if _ENCRYPTED in names:
        raise LoaderError("password-protected Office file; save it without a password to ingest it")
    what = next((label for name, label in _OTHERS.items() if name in names), "a legacy Office file of another kind")
    raise Unsupported(f"content is {what}, which is not supported; convert it to PDF or DOCX to ingest it")
