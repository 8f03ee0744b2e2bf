"""A [loaders] plugin for tests/test_supervisor_path.py: format "crashtxt" (.crashtxt files, the txt pool)
reads text as the txt loader does, but kills its worker on a file holding CRASH and hangs on one holding
HANG; with INGEST_BATCH_FORMATS=crashtxt its small files are batched (ingest/load_batch.py), so a batch
meets a crash or a hang among innocent files."""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Iterator

from ingest.loaders.base import LoaderOptions, Page, register


@register("crashtxt", (".crashtxt",), "txt")
def load_or_crash(path: Path, options: LoaderOptions) -> Iterator[Page]:
    text = path.read_text(encoding="utf-8")
    if "CRASH" in text:
        os._exit(7)
    if "HANG" in text:
        time.sleep(3600)
    yield Page(None, text)
