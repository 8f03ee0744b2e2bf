"""Tokens word by word, each distinct word's tokens from a cache: the chunker's tokenizer pass over a
page (`WordTokens.tokens`, with each token's start) and the encode pool's over a window of raw texts
(`WordTokens.many`, ids only, with the special tokens and the truncation of the exact tokenizer).

NOTE (word cache): for a tokenizer additive over whitespace (`additive`: its pre-tokenizer splits at
whitespace, its normalizer works character by character, its added tokens hold no whitespace; and
`template`: its post-processor only adds a prefix and a suffix), a text's tokens are its words' tokens
one after the other, a word being a run of characters outside WHITESPACE, each token's start shifted
by its word's. Real text repeats its words (a few thousand make most of any page), so each distinct
word is tokenized once, by `encode_batch` over the words not yet seen, and its ids and token starts
are kept in flat arrays; a text is then a split, a dict lookup per word and a gather, at about ten
times the speed of tokenizing the text (the tokenizer's normalizer and offsets cost more than the
word piece search). The cache is emptied when it holds MAX_WORDS words or MAX_CHARS characters, so it
stays within a few tens of MB.
"""
from __future__ import annotations

import json
import re
from itertools import chain, repeat

import numpy as np

MAX_WORDS = 200_000
MAX_CHARS = 4_000_000
# Unicode White_Space less the control characters (a BERT normalizer deletes those, joining their neighbours)
WHITESPACE = frozenset("\t\n\r \xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
                       "\u2028\u2029\u202f\u205f\u3000")
_ODD_SPACE = re.compile("[\x0b\x0c\x1c-\x1f\x85]")   # what str.split splits at but a BERT normalizer deletes
_WORD = re.compile("[^" + re.escape("".join(sorted(WHITESPACE))) + "]+")
_ADDITIVE_PRE = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}
_CHARWISE_NORM = {"BertNormalizer", "Lowercase", "NFC", "NFD", "NFKC", "NFKD", "StripAccents"}


def additive(cfg: dict) -> bool:
    """Whether a tokenizer.json's pipeline gives any text's tokens as the sum of its whitespace-separated parts'."""
    norm = cfg.get("normalizer")
    norms = [] if norm is None else norm.get("normalizers", []) if norm["type"] == "Sequence" else [norm]
    pre = cfg.get("pre_tokenizer") or {}
    return (pre.get("type") in _ADDITIVE_PRE and all(n.get("type") in _CHARWISE_NORM for n in norms)
            and not any(WHITESPACE.intersection(t["content"]) or t.get("lstrip") or t.get("rstrip")
                        for t in cfg.get("added_tokens", ())))


def template(exact, plain, max_length: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(prefix, suffix): the special tokens the exact tokenizer (load_tokenizer's: specials added,
    truncated to max_length) puts around a text's plain tokens (no specials, no truncation), found on
    "a" and checked on a text past max_length; None when its ids are not prefix + plain[:keep] + suffix."""
    raw, enc = plain.encode("a", add_special_tokens=False).ids, exact.encode("a")
    k = enc.special_tokens_mask.index(0) if 0 in enc.special_tokens_mask else 0
    prefix, suffix = np.asarray(enc.ids[:k], np.int32), np.asarray(enc.ids[k + len(raw):], np.int32)
    keep = max_length - len(prefix) - len(suffix)
    long = " ".join(["a"] * (max_length + 1))
    long_raw = np.asarray(plain.encode(long, add_special_tokens=False).ids[:keep], np.int32)
    ok = (bool(raw) and enc.ids == [*prefix.tolist(), *raw, *suffix.tolist()]
          and exact.encode(long).ids == np.concatenate([prefix, long_raw, suffix]).tolist())
    return (prefix, suffix) if ok else None


class WordTokens:
    """`tokens(text)`: (ids int32, starts int64) of `text`'s tokens without special tokens, as
    `tokenizer.encode_batch([text], add_special_tokens=False)` gives them, for an additive tokenizer."""

    def __init__(self, tokenizer, whitespace: frozenset[str] = WHITESPACE):
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
        pos, counts = self._gather(words)
        return self._ids[pos], self._rel[pos] + np.repeat(begins.astype(np.int64), counts)

    def many(self, texts: list[str], prefix: np.ndarray, suffix: np.ndarray,
             max_length: int) -> tuple[np.ndarray, np.ndarray]:
        """(flat ids int32, lengths int32) of `texts`, each prefix + its tokens (at most max_length
        with the specials) + suffix: the exact tokenizer's ids when `template` found these specials."""
        words = [t.split() if not _ODD_SPACE.search(t) else _WORD.findall(t) for t in texts]
        per_text = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        pos, counts = self._gather(list(chain.from_iterable(words)))
        ends = np.cumsum(counts)                                  # per word: its tokens' end, all texts' flat
        text_ends = ends[np.cumsum(per_text) - 1] if len(ends) else np.zeros(len(texts), np.int64)
        text_ends = np.where(per_text > 0, text_ends, 0)
        text_ends = np.maximum.accumulate(text_ends) if len(texts) else text_ends
        raw_len = np.diff(np.concatenate(([0], text_ends)))
        specials = len(prefix) + len(suffix)
        kept = np.minimum(raw_len, max_length - specials)
        lengths = (kept + specials).astype(np.int32)
        out_start = np.concatenate(([0], np.cumsum(lengths[:-1], dtype=np.int64)))
        out = np.empty(int(lengths.sum()), dtype=np.int32)
        within = np.arange(len(pos)) - np.repeat(text_ends - raw_len, raw_len)    # each token's place in its text
        keep = within < np.repeat(kept, raw_len)
        out[np.repeat(out_start, raw_len)[keep] + len(prefix) + within[keep]] = self._ids[pos[keep]]
        if len(prefix):
            out[(out_start[:, None] + np.arange(len(prefix))).ravel()] = np.tile(prefix, len(texts))
        if len(suffix):
            out[(out_start[:, None] + len(prefix) + kept[:, None] + np.arange(len(suffix))).ravel()] = \
                np.tile(suffix, len(texts))
        return out, lengths

    def _gather(self, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(positions in the flat arrays of the words' tokens, one after the other; tokens per word)."""
        if len(self._index) >= MAX_WORDS or self._chars >= MAX_CHARS:
            self.clear()
        wids = np.fromiter(map(self._index.get, words, repeat(-1)), dtype=np.int64, count=len(words))
        missing = np.flatnonzero(wids < 0)
        if missing.size:
            self._add(list(dict.fromkeys(words[i] for i in missing.tolist())))
            wids[missing] = [self._index[words[i]] for i in missing.tolist()]
        counts = self._count[wids]
        ends = np.cumsum(counts)
        return np.repeat(self._first[wids] - (ends - counts), counts) + np.arange(int(ends[-1]) if len(ends) else 0), counts

    def _add(self, words: list[str]) -> None:
        """Tokenize `words` (distinct, none cached) and cache them: one encode of the words joined by spaces
        (additive: the same tokens as each word alone, at a fraction of the per-call cost), each token
        given to the word its start falls in."""
        enc = self._tokenizer.encode(" ".join(words), add_special_tokens=False)
        begins = np.cumsum([0, *[len(w) + 1 for w in words[:-1]]])
        ids = np.asarray(enc.ids, dtype=np.int32)
        starts = np.fromiter((o[0] for o in enc.offsets), dtype=np.int64, count=len(ids))
        owner = np.searchsorted(begins, starts, side="right") - 1
        counts = np.bincount(owner, minlength=len(words))
        n, start = len(self._index), self._used
        self._used += len(ids)
        self._first = _room(self._first, n + len(words))
        self._count = _room(self._count, n + len(words))
        self._ids, self._rel = _room(self._ids, self._used), _room(self._rel, self._used)
        self._count[n:n + len(words)] = counts
        self._first[n:n + len(words)] = start + np.cumsum(counts) - counts
        self._ids[start:self._used] = ids
        self._rel[start:self._used] = starts - begins[owner]
        for k, word in enumerate(words, n):
            self._index[word] = k
        self._chars += sum(map(len, words))


def exact_words(tokenizer_file: str, exact, max_length: int):
    """A function texts -> (flat ids, lengths) giving `exact`'s ids (load_tokenizer's tokenizer) from a
    word cache, or None when the tokenizer is not additive (module NOTE)."""
    from tokenizers import Tokenizer

    plain = Tokenizer.from_file(tokenizer_file)
    plain.no_truncation()
    plain.no_padding()
    specials = template(exact, plain, max_length)
    if specials is None or not additive(json.loads(plain.to_str())):
        return None
    cache = WordTokens(plain)
    return lambda texts: cache.many(texts, *specials, max_length)


def _room(a: np.ndarray, size: int) -> np.ndarray:
    """`a`, grown (doubled) to hold `size` entries."""
    if size <= len(a):
        return a
    grown = np.zeros(max(size, 2 * len(a)), dtype=a.dtype)
    grown[:len(a)] = a
    return grown
