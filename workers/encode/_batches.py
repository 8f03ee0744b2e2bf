"""The coordinator's units of work: a window (consecutive texts of one run, tokenized and
sorted by length together) and its batches (what one encode worker computes at a time)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ._messages import TokenBatch
    from ._stream import EncodeRun


class Window:
    __slots__ = ("run", "number", "first", "texts", "tokens", "rows", "pending", "tokenize_attempts")

    def __init__(self, run: EncodeRun, number: int, first: int, texts: list[str],
                 tokens: tuple[np.ndarray, np.ndarray] | None = None):
        self.run, self.number, self.first, self.texts = run, number, first, texts
        self.tokens = tokens                   # (flat ids, lengths) when the texts came pretokenized
        self.rows: np.ndarray | None = None
        self.pending = 0
        self.tokenize_attempts = 0

    def cut(self, batches: tuple[TokenBatch, ...], first_id: int, dim: int) -> list[Batch]:
        """The window's batches, once tokenized; its rows are filled in as they come back."""
        self.rows = np.empty((len(self.texts), dim), dtype=np.float32)
        self.pending = len(batches)
        return [Batch(first_id + i, self, b.positions, b.ids, b.lengths) for i, b in enumerate(batches)]

    def store(self, batch: Batch, embeddings: np.ndarray) -> None:
        """A batch's rows are back; once all are, the window goes to its run."""
        self.rows[batch.positions] = embeddings[:len(batch.positions)]     # past them: a bounded plan's row copies
        self.pending -= 1
        if self.pending == 0:
            self.run.window_done(self.number, self.rows)


class Batch:
    __slots__ = ("id", "window", "positions", "ids", "lengths", "attempts", "suspect")

    def __init__(self, batch_id: int, window: Window, positions, ids, lengths, suspect: bool = False):
        self.id, self.window, self.positions, self.ids, self.lengths = batch_id, window, positions, ids, lengths
        self.attempts = 0
        self.suspect = suspect                 # already failed in a larger batch: split at once

    def __len__(self) -> int:
        return len(self.positions)

    def halves(self, first_id: int) -> tuple[Batch, Batch]:
        h = len(self) // 2                     # rows are sorted longest first: trim the padding
        a = Batch(first_id, self.window, self.positions[:h], self.ids[:h, :self.lengths[0]], self.lengths[:h], True)
        b = Batch(first_id + 1, self.window, self.positions[h:], self.ids[h:, :self.lengths[h]], self.lengths[h:], True)
        return a, b

    def describe_first_chunk(self) -> tuple[int, str]:
        position = int(self.positions[0])
        return self.window.first + position, describe(self.window.texts[position])


def describe(text: str) -> str:
    """A text as an error names it: its first 40 characters, quoted."""
    return repr(text[:40] + ("…" if len(text) > 40 else ""))
