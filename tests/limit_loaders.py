"""A loader plugin for the memory limit ([loaders] plugins = ["limit_loaders"]).

A ".hog" file makes its loader worker allocate `HOG_MB` at once, past a small [limits] worker_memory_mb.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

from ingest.loaders import Page, register

HOG_MB = 3072


@register("hog", (".hog",), "txt")
def hog(path: Path, options: object) -> Iterator[Page]:
    block = bytearray(HOG_MB * 1024 * 1024)
    yield Page(None, f"allocated {len(block)} bytes")
