"""The term vectors of BM25 search in stores that do not tokenize themselves (Qdrant): ingest computes
them, with no model to download (fastembed's BM25 fetches one at run time).

A text's terms are its Unicode words, case-folded (NFKC first, so full-width and compatibility forms
match their plain ones); a Han, Kana or Hangul character is a term by itself, as in Milvus' standard
analyzer. No stop words are dropped: the store's IDF weighs common words down. A term's index is a
stable 32-bit hash of it (blake2b: the same on every machine, run and Python), so a collection can be
written and searched by different processes and versions. A chunk's value for a term is BM25's
saturated term frequency, tf * (K1 + 1) / (tf + K1 * (1 - B + B * len / AVG_LEN)), with AVG_LEN an
assumed chunk length; the store multiplies it by the term's IDF (Qdrant's `Modifier.IDF`) to complete
BM25. A query's vector is its distinct terms, each of weight 1.
"""
from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from functools import lru_cache

K1, B = 1.2, 0.75
AVG_LEN = 256.0           # assumed words in a chunk (chunks are token-bounded: their lengths vary little)

# One CJK character (Han, Hiragana, Katakana, Hangul syllables and jamo), or a run of other word characters.
_CJK = "\u1100-\u11ff\u3040-\u30ff\u3100-\u312f\u3130-\u318f\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff" \
       "\uac00-\ud7af\uf900-\ufaff\U00020000-\U0003134f"
_TERM = re.compile(f"[{_CJK}]|[^\\W{_CJK}]+")


def terms(text: str) -> list[str]:
    """The terms of `text`, in order (repeats kept)."""
    return _TERM.findall(unicodedata.normalize("NFKC", text).casefold())


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
