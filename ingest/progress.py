"""tqdm bars on stderr: files written and chunks embedded."""
from __future__ import annotations

import sys
import threading

from tqdm import tqdm


class Progress:
    def __init__(self, total_files: int, quiet: bool):
        self._lock = threading.Lock()
        self.files = tqdm(total=total_files, desc="files", unit="file", position=0, file=sys.stderr,
                          disable=quiet, dynamic_ncols=True)
        self.chunks = tqdm(desc="chunks embedded", unit="chunk", position=1, file=sys.stderr,
                           disable=quiet, dynamic_ncols=True)

    def written(self, chunks: int) -> None:
        with self._lock:
            self.files.update(1)
            if chunks:
                self.chunks.update(chunks)

    def close(self) -> None:
        self.chunks.close()
        self.files.close()
