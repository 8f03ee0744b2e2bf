"""A page's tokens word by word, each word's tokens from a cache: the chunker's tokenizer pass.

NOTE (word cache): for a tokenizer additive over whitespace (ingest/chunk.py's NOTE on tokenizing
once), a text's tokens are its words' tokens one after the other, a word being a run of characters
outside chunk.WHITESPACE, each token's start shifted by its word's. Real text repeats its words (a
few thousand make most of any page), so each distinct word is tokenized once, by `encode_batch` over
the words not yet seen, and its ids and token starts are kept in flat arrays; a page is then a
split, a dict lookup per word and a gather, at about ten times the speed of tokenizing the page
(the tokenizer's normalizer and offsets cost more than the word piece search). The cache is
emptied when it holds MAX_WORDS words or MAX_CHARS characters, so it stays within a few tens of MB.
"""
from __future__ import annotations

import re
from itertools import repeat

import numpy as np

MAX_WORDS = 200_000
MAX_CHARS = 4_000_000
_ODD_SPACE = re.compile("[\x0b\x0c\x1c-\x1f\x85]")   # what str.split splits at but a BERT normalizer deletes


class WordTokens:
    """`tokens(text)`: (ids int32, starts int64) of `text`'s tokens without special tokens, as
    `tokenizer.encode_batch([text], add_special_tokens=False)` gives them, for an additive tokenizer."""

    def __init__(self, tokenizer, whitespace: frozenset[str]):
        self._tokenizer = tokenizer
        self._space = np.zeros(max(map(ord, whitespace)) + 2, dtype=bool)    # the last entry: every higher code
        self._space[[ord(c) for c in whitespace]] = True
        self.clear()

    def clear(self) -> None:
        """Forget every word."""
        self._index: dict[str, int] = {}
        self._chars = 0
        self._first = np.zeros(1024, dtype=np.int64)     # per word: its tokens' offset in the flat arrays,
        self._count = np.zeros(1024, dtype=np.int64)     # and how many there are
        self._ids = np.zeros(1 << 16, dtype=np.int32)    # flat: every cached word's ids, word after word,
        self._rel = np.zeros(1 << 16, dtype=np.int64)    # and its tokens' starts within the word
        self._used = 0

    def tokens(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        space = self._space[np.minimum(codes, len(self._space) - 1)]
        edges = np.flatnonzero(np.diff(np.concatenate(([True], space, [True])).view(np.int8)))
        begins = edges[0::2]
        words = text.split() if not _ODD_SPACE.search(text) else []
        if len(words) != len(begins):
            words = [text[a:b] for a, b in zip(begins.tolist(), edges[1::2].tolist())]
        if len(self._index) >= MAX_WORDS or self._chars >= MAX_CHARS:
            self.clear()
        wids = np.fromiter(map(self._index.get, words, repeat(-1)), dtype=np.int64, count=len(words))
        missing = np.flatnonzero(wids < 0)
        if missing.size:
            self._add(list(dict.fromkeys(words[i] for i in missing.tolist())))
            wids[missing] = [self._index[words[i]] for i in missing.tolist()]
        counts = self._count[wids]
        total = int(counts.sum())
        ends = np.cumsum(counts)
        pos = np.repeat(self._first[wids] - (ends - counts), counts) + np.arange(total)
        return self._ids[pos], self._rel[pos] + np.repeat(begins.astype(np.int64), counts)

    def _add(self, words: list[str]) -> None:
        """Tokenize `words` (distinct, none cached) and cache them."""
        encs = self._tokenizer.encode_batch(words, add_special_tokens=False)
        n, start = len(self._index), self._used
        lengths = [len(e.ids) for e in encs]
        self._used += sum(lengths)
        self._first = _room(self._first, n + len(words))
        self._count = _room(self._count, n + len(words))
        self._ids, self._rel = _room(self._ids, self._used), _room(self._rel, self._used)
        self._count[n:n + len(words)] = lengths
        self._first[n:n + len(words)] = start + np.cumsum([0, *lengths[:-1]])
        self._ids[start:self._used] = [i for e in encs for i in e.ids]
        self._rel[start:self._used] = [o[0] for e in encs for o in e.offsets]
        for k, word in enumerate(words, n):
            self._index[word] = k
        self._chars += sum(map(len, words))


def _room(a: np.ndarray, size: int) -> np.ndarray:
    """`a`, grown (doubled) to hold `size` entries."""
    if size <= len(a):
        return a
    grown = np.zeros(max(size, 2 * len(a)), dtype=a.dtype)
    grown[:len(a)] = a
    return grown
