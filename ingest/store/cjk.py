"""Keyword search in scripts written without spaces: runs of CJK characters (Han, Kana, Hangul) rewritten as
their overlapping bigrams, as Lucene's CJK analyzer does, so that every store's own tokenizer finds a phrase
from inside a longer run. Imports nothing of ingest.

NOTE (the rule, one for every store). A run of CJK characters becomes its overlapping two-character pieces
separated by spaces ("東京タワー" -> "東京 京タ タワ ワー"); a run of one or two characters stays itself; a run
is set apart by a space from any other character it touches ("iPhone手机。" -> "iPhone 手机 。"). Nothing
else changes: a text without CJK comes back as it was (the same object), so Latin-script search is as before.
- Where: in exactly two places, what a row's BM25 indexes (`ingest.store.rows.search_text`: every store's
  writes, Qdrant's term vectors too) and the words of a bm25 or hybrid query, once, at the search face
  (`ingest.search.Searcher.search`). Qdrant's terms (`ingest.store.sparse`) are the same bigrams.
- Why it works everywhere (measured): to each store's tokenizer a run of CJK letters is one token:
  Milvus Lite's standard analyzer (runs of word characters), a Milvus server's standard tokenizer (runs of
  Unicode alphanumerics), PostgreSQL's parser under 'simple' (one word), Lance's simple tokenizer (one
  token, and dropped past 40 bytes: a sentence was not found even whole). So a phrase inside a run matched nothing;
  now a typed phrase of n characters is its n - 1 bigrams, each a token in the chunk that holds it. Every
  store ORs a query's tokens (BM25 and the sparse dot product; PostgreSQL's tsquery is built with `|`), so
  the chunk holding all of them ranks first, and a 2-character phrase is one bigram.
- A one-character query finds only lone characters (as with Lucene's analyzer without unigrams).
- The rewrite is idempotent (bigrams rewritten again are themselves).
- Reuse (ingest/reuse.py) compares stored search_text with a chunk's: on a store written before, the CJK
  rows of a changed file are encoded again once; those of unchanged files keep their old search_text (their
  phrases are found once rewritten: `--reembed`).
"""
from __future__ import annotations

import re
from operator import add

# CJK characters: Hangul jamo, CJK radicals, 々〆〇, Hiragana, Katakana (not the middle dot ・), Bopomofo,
# Hangul compatibility jamo, Katakana extensions, Han (extension A, the unified block, extensions B-H,
# compatibility ideographs), Hangul jamo extensions and syllables, half-width Katakana and Hangul.
CJK = ("\u1100-\u11ff\u2e80-\u2fdf\u3005-\u3007\u3041-\u309f\u30a1-\u30fa\u30fc-\u30ff\u3100-\u312f"
       "\u3130-\u318f\u31a0-\u31bf\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\ua960-\ua97f\uac00-\ud7af"
       "\ud7b0-\ud7ff\uf900-\ufaff\uff66-\uff9f\uffa0-\uffdc\U00020000-\U000323af")
_ONE, _RUN = re.compile(f"[{CJK}]"), re.compile(f"[{CJK}]+")      # one is found 3x faster than a run


def pairs(run: str) -> list[str]:
    """The overlapping bigrams of a run of CJK characters; a run of one character is itself."""
    return [run] if len(run) < 2 else list(map(add, run, run[1:]))


def bigrams(text: str) -> str:
    """`text` with each run of CJK characters rewritten as its bigrams separated by spaces (module NOTE)."""
    if text.isascii() or not _ONE.search(text):
        return text
    return _RUN.sub(_rewrite, text)


def _rewrite(m: re.Match[str]) -> str:
    text, start, end = m.string, m.start(), m.end()
    before = " " if start and not text[start - 1].isspace() else ""
    after = " " if end < len(text) and not text[end].isspace() else ""
    return before + " ".join(pairs(m.group())) + after
