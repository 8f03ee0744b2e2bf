"""A loader plugin for tests/test_last_good_copy.py ([loaders] plugins = ["last_good_loaders"])."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

from ingest.loaders.base import LoaderOptions, Page, register

OVERFLOW = "OVERFLOW"


@register("paged", (".paged",), "txt")
def paged(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """One page per paragraph, numbered from 1; a paragraph reading OVERFLOW gets a page number the store's
    INT64 field cannot hold, so the store refuses the batch holding it (its file fails part-way through)."""
    for n, paragraph in enumerate(path.read_text().split("\n\n"), 1):
        if paragraph.strip() == OVERFLOW:
            yield Page(2 ** 70, "a page number no store can hold")
        elif paragraph.strip():
            yield Page(n, paragraph)


@register("gated", (".gated",), "txt")
def gated(path: Path, options: LoaderOptions) -> Iterator[Page]:
    """Writes `<file>.waiting` beside the folder, then waits (up to 10 minutes) for `go` there before it
    loads like text: a file sorted first holds the run before anything reaches the writer."""
    beside = path.parent.parent
    (beside / (path.name + ".waiting")).write_text("x")
    deadline = time.monotonic() + 600
    while not (beside / "go").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    yield Page(None, path.read_text())
