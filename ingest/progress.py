"""tqdm bars on stderr: files settled (the total grows as the scan finds files) and chunks embedded."""
from __future__ import annotations

import sys
import threading

from tqdm import tqdm


class Progress:
    def __init__(self, quiet: bool):
        self._lock = threading.Lock()
        self.files = tqdm(total=0, desc="files", unit="file", position=0, file=sys.stderr,
                          disable=quiet, dynamic_ncols=True)
        self.chunks = tqdm(desc="chunks embedded", unit="chunk", position=1, file=sys.stderr,
                           disable=quiet, dynamic_ncols=True)

    def found(self) -> None:
        """The scan found one more file."""
        with self._lock:
            self.files.total += 1

    def embedded(self, chunks: int) -> None:
        if chunks:
            with self._lock:
                self.chunks.update(chunks)

    def settled(self) -> None:
        with self._lock:
            self.files.update(1)

    def close(self) -> None:
        self.chunks.close()
        self.files.close()
