"""The term vectors of BM25 search in stores that do not tokenize themselves (Qdrant): ingest computes
them, with no model to download (fastembed's BM25 fetches one at run time).

A text's terms are its Unicode words, case-folded (NFKC first, so full-width and compatibility forms
match their plain ones), and the overlapping bigrams of its runs of Han, Kana or Hangul characters (a lone
character is a term by itself): the tokens every other store's tokenizer finds in a search_text and a query
rewritten by ingest/store/cjk.py (NOTE there), so a phrase inside a run is found as on those stores. (Before,
each CJK character was a term: a collection written then finds its CJK rows by keyword again once they are
rewritten, by `--reembed` or a change of their files.) No stop words are dropped: the store's IDF weighs
common words down. A term's index is a stable 32-bit hash of it (blake2b: the same on every machine, run
and Python), so a collection can be written and searched by different processes and versions. A chunk's
value for a term is BM25's saturated term frequency, tf * (K1 + 1) / (tf + K1 * (1 - B + B * len / AVG_LEN)),
with AVG_LEN an assumed chunk length; the store multiplies it by the term's IDF (Qdrant's `Modifier.IDF`) to
complete BM25. A query's vector is its distinct terms, each of weight 1.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from functools import lru_cache

from ingest.store.cjk import CJK, bigrams

K1, B = 1.2, 0.75
AVG_LEN = 256.0           # assumed words in a chunk (chunks are token-bounded: their lengths vary little)

# A CJK bigram or lone character (after ingest/store/cjk.py's rewrite), or a run of other word characters.
_TERM = re.compile(f"[{CJK}]{{1,2}}|[^\\W{CJK}]+")


def terms(text: str) -> list[str]:
    """The terms of `text`, in order (repeats kept): its words, and the bigrams of its CJK runs."""
    return _TERM.findall(bigrams(unicodedata.normalize("NFKC", text).casefold()))


@lru_cache(maxsize=1 << 17)        # a corpus repeats its words: hash each once
def term_index(term: str) -> int:
    """A term's index in the sparse vector: a stable unsigned 32-bit hash."""
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8", "surrogatepass"), digest_size=4).digest(), "little")


def document_vector(text: str) -> tuple[list[int], list[float]]:
    """(indices, values) of a chunk's search text: each distinct term's saturated term frequency."""
    words = terms(text)
    norm = K1 * (1.0 - B + B * len(words) / AVG_LEN)
    counts: dict[int, int] = {}
    for term, n in Counter(words).items():
        i = term_index(term)
        counts[i] = counts.get(i, 0) + n                 # two terms of one hash (rare) count as one
    indices = sorted(counts)
    return indices, [counts[i] * (K1 + 1.0) / (counts[i] + norm) for i in indices]


def query_vector(text: str) -> tuple[list[int], list[float]]:
    """(indices, values) of a query: its distinct terms, each of weight 1."""
    indices = sorted({term_index(t) for t in terms(text)})
    return indices, [1.0] * len(indices)
