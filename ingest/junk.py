r"""The junk filter: chunks that are not language, skipped by the chunker ([chunking] skip_junk).

NOTE (junk): junk is what no language writes - encoded data (base64 with its data: URIs, long hex),
hex dumps, binary read as text (control characters, U+FFFD) - judged by character classes, never by
how a language looks. A long run without spaces is no sign by itself: Chinese, Japanese, Thai, Lao,
Khmer, Myanmar, Tibetan and Javanese write no spaces, OCR runs words together, formulas, table markup
and links are long runs too. Inside such runs only ASCII stretches of the base64 alphabet are looked
at (a link's run never), and they are encoded data when, taken together, they show what words and
identifiers never do (see _base64), or are long hex strings. A hex dump's words are pairs of hex digits
with letters inside them ("4f", "ff"; not a matrix's "a11 a12"). Control characters are binary's sign
only where the words around them are not words: inside text they are extraction artefacts (a math
font's delimiters as \x12 ... \x13, a symbol font's NULs), dropped from the chunk (`drop_controls`),
never a reason to drop it. When in doubt the chunk is kept: an embedded junk chunk costs a row, a
dropped one loses text.
"""
from __future__ import annotations

import re
from operator import eq

JUNK_SHARE = 0.5                    # a chunk is junk when encoded runs make up more than this share of it,
LANGUAGE_CHARS = 100                # and what is left of it is less than this (a sentence or a table row)
LONG_RUN = 40                       # a run of non-spaces this long is looked into
_CODE_RUN = re.compile(r"[A-Za-z0-9+/=_-]{32,}")             # a stretch of the base64(url) alphabet
_NO_UPPER = str.maketrans("", "", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")
_NO_LOWER = str.maketrans("", "", "abcdefghijklmnopqrstuvwxyz")
_NO_DIGIT = str.maketrans("", "", "0123456789")
_NO_HEX = str.maketrans("", "", "0123456789abcdefABCDEF")
_UPPER_PAIR = re.compile(r"[A-Z](?=[A-Z])")                 # capitals side by side: none in "SunMonTue"
_LOWER_WORD = re.compile(r"[a-z]{4,}")                      # most small letters of words ("XMLHttpRequest")
_SAME_CASE_WORD = re.compile(r"[a-z]{4,}|[A-Z]{4,}")
# a dump's word, 1 to 8 bytes, after a space (searched in " " + chunk: faster than a lookbehind)
_HEX_WORD = re.compile(r"\s((?:0x)?(?:[0-9a-fA-F]{2}){1,8}[,:]?)(?=\s|\Z)")
_NOT_HEXISH = str.maketrans("", "", "0123456789abcdefABCDEFx,:")     # deletes what a _HEX_WORD may hold
_HEXISH_BYTES = b"0123456789abcdefABCDEFx,:"
_ASCII_SPACE = b" \t\n\r\x0b\x0c"                 # where bytes.split splits
_ASCII_CONTROL = bytes([*range(0x00, 0x09), *range(0x0e, 0x1b), 0x7f])   # _CONTROL's ASCII characters
_ASCII_ODD = bytes([*range(0x00, 0x09), *range(0x0e, 0x20), 0x7f])    # controls, and spaces str.split adds
_HEX_LETTER = re.compile(r"[a-fA-F]")
_HEX_INNER = re.compile(r"[0-9a-fA-F][a-fA-F]")             # a letter not leading: "4f", "ff"; none in "a11 b12"
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1a\x7f-\x84\x86-\x9f]")   # Cc but spaces and ESC (colored logs)
_INNER_CONTROLS = re.compile(r"(?<=\w)[\x00-\x08\x0e-\x1a\x7f-\x84\x86-\x9f]+(?=\w)")
_BROKEN = re.compile(r"[\ufffd\ud800-\udfff]")              # a decoder's replacement, a lone surrogate
_EDGES = re.compile(r"^[\W_]+|[\W_]+$")                     # a word's punctuation around it
_JOINERS = re.compile(r"[-'\u2019.]")                       # inside a word: "K-Vektorraum", "don't", "z.B"
_NUMBER = re.compile(r"[\d.,:/%+\u2212\u2013-]+")              # 1,234.5  1995–96  12:30  -3
WORDS_SHARE = 0.3                   # text this much in words is language, whatever controls are in it (binary: < 0.1),
ARTEFACTS = 0.25                    # unless they are this share of it (formula-dense notes: 0.15; binary: most)
FORMULA_WORDS, FORMULA_KINDS = 0.15, 16     # formulas: less in words, among few kinds of controls (`_language`)


def _encoded(runs: list[str]) -> int:
    """The characters of `runs` (long runs of non-spaces) that are encoded data; links are not looked into."""
    hex_chars, codes = 0, []
    for run in runs:
        if "://" in run or run.startswith("www."):
            continue
        for code in _CODE_RUN.findall(run):
            if code.translate(_NO_HEX):
                codes.append(code)
            else:                                            # hex: sha sums, hex-encoded bytes
                n, digits = len(code), len(code) - len(code.translate(_NO_DIGIT))
                hex_chars += n if digits >= 0.3 * n and n - digits >= 0.1 * n else 0
    return hex_chars + (sum(map(len, codes)) if codes and _base64(codes) else 0)


def _base64(codes: list[str]) -> bool:
    """Whether these stretches of the base64 alphabet, taken together, are encoded data, not words run together:
    their letters mix cases at random (capitals side by side, small letters seldom four in a row); or digits
    stand among letters of both cases that make no words (the UTF-8 of CJK, Indic, Thai text); or the same
    characters come back every 4 (the lead bytes of one script's UTF-8, 3 bytes a letter)."""
    joined = " ".join(codes)
    n = len(joined) - len(codes) + 1
    upper, lower = n - len(joined.translate(_NO_UPPER)), n - len(joined.translate(_NO_LOWER))
    if min(upper, lower) >= 0.15 * n and 0 < 20 * len(_UPPER_PAIR.findall(joined)) >= upper \
            and sum(map(len, _LOWER_WORD.findall(joined))) < 0.7 * lower:
        return True
    if min(upper, lower) >= 0.02 * n and n - len(joined.translate(_NO_DIGIT)) >= 0.1 * n \
            and sum(map(len, _SAME_CASE_WORD.findall(joined))) < 0.3 * (upper + lower):
        return True
    flat = "".join(codes)
    return 3 * sum(map(eq, flat, flat[4:])) >= n and len(set(flat)) >= 16


def _ascii_junk(data: bytes) -> bool:
    """`is_junk` of an ASCII chunk without controls or \\x1c-\\x1f (most text), as bytes: bytes.split splits
    it where str.split does, no character is unreadable, and bytes' translate and split are ~2x cheaper (the
    loader's junk check from 18 to 8 us a 1 KB chunk: issue 45). The same answer as the str path."""
    words = data.split()
    visible = len(data.translate(None, _ASCII_SPACE))
    if visible < 16:
        return False
    if max(map(len, words)) >= LONG_RUN:
        encoded = _encoded([w.decode() for w in words if len(w) >= LONG_RUN])
        if encoded > JUNK_SHARE * visible and visible - encoded < LANGUAGE_CHARS:
            return True
    if len(words) < 16 or len(words) - len(data.translate(None, _HEXISH_BYTES).split()) <= 0.6 * len(words):
        return False
    return _hex_dump(" " + data.decode(), len(words))


def _hex_dump(spaced: str, words: int) -> bool:
    """Most of the `words` words of the text (`spaced`: after a space) are hex bytes, enough of them with letters."""
    hex_words = _HEX_WORD.findall(spaced)      # the words that are hex, in one pass over the chunk
    if len(hex_words) <= 0.6 * words:
        return False
    lettered = [w for w in hex_words if w.startswith("0x") or _HEX_LETTER.search(w)]
    inner = sum(1 for w in lettered if w.startswith("0x") or _HEX_INNER.search(w))
    return len(lettered) > 0.2 * words and inner > 0.05 * words


def _language(chunk: str, controls: list[str]) -> bool:
    """Language among the controls: words make WORDS_SHARE of it, or FORMULA_WORDS where the controls are few kinds
    (a math font's delimiters, each kind a glyph: formulas with words between them; binary read as text has
    20-50 kinds of controls and under 0.11 in words: 5,000 random chunks of 100-1,200 bytes in 5 encodings)."""
    share = _words_share(chunk)
    return share >= WORDS_SHARE or (share >= FORMULA_WORDS and len(set(controls)) <= FORMULA_KINDS)


def _words_share(text: str) -> float:
    """The share of the characters of `text`'s words (controls splitting them; those holding a letter or digit)
    that are in words as a language writes them (3 letters or more, in lower case after the first or all
    capitals, maybe joined by hyphens or apostrophes, not over LONG_RUN; a script without case) or numbers.
    Binary read as text: under 10% (its letters come one or two between controls); language: over 40%."""
    total = good = 0
    for w in _CONTROL.sub(" ", text).split():
        core = _EDGES.sub("", w)
        if not core:
            continue
        total += len(core)
        if _NUMBER.fullmatch(core) or 3 <= len(core) <= LONG_RUN and all(
                p.isalpha() and (p[1:] == p[1:].lower() or p.isupper()) for p in _JOINERS.split(core)):
            good += len(core)
    return good / total if total else 0.0


def drop_controls(chunk: str) -> str:
    """The chunk without control characters (extraction artefacts; NOTE): one between two word characters
    stands for a space or a delimiter ("ker\x10f", a glyph for each space) and becomes a space, others go."""
    if chunk.isascii():                         # bytes' translate: ~4x cheaper than the search over ASCII
        data = chunk.encode()
        if len(data.translate(None, _ASCII_CONTROL)) == len(data):
            return chunk
    elif not _CONTROL.search(chunk):
        return chunk
    return _CONTROL.sub("", _INNER_CONTROLS.sub(" ", chunk))


def is_junk(chunk: str) -> bool:
    """Encoded data (base64, data: URIs, long hex), hex dumps and binary read as text: not language,
    never worth a vector. Text in any script, OCR without spaces, formulas, tables and links are kept."""
    if chunk.isascii():
        data = chunk.encode()
        if len(data.translate(None, _ASCII_ODD)) == len(data):
            return _ascii_junk(data)
    words = chunk.split()                      # str.split and str.isspace agree on what is a space
    visible = sum(map(len, words))
    if visible < 16:
        return False
    encoded = _encoded([w for w in words if len(w) >= LONG_RUN]) if max(map(len, words)) >= LONG_RUN else 0
    if encoded > JUNK_SHARE * visible and visible - encoded < LANGUAGE_CHARS:
        return True
    controls = _CONTROL.findall(chunk)           # random bytes hold ~9% of them, of ~23 kinds alike, in any
    unreadable = len(controls)                   # 8-bit decoding; one kind making most of them stands for a
    if controls:                                 # glyph (a PDF's \x03 for each space): text
        top = max(map(controls.count, set(controls)))
        unreadable -= top if top > unreadable / 2 else 0
    if not chunk.isascii():                      # a mis-decoded letter is one U+FFFD: those count a quarter
        unreadable += len(_BROKEN.findall(chunk)) / 4
    if unreadable > 0.03 * visible and (len(controls) > ARTEFACTS * visible or not _language(chunk, controls)):
        return True
    if len(words) >= 16:
        # A hex word is a whole word of _HEXISH characters: words holding another are none (3x cheaper than the
        # findall, which prose then need not run: issue 45).
        if len(words) - len(chunk.translate(_NOT_HEXISH).split()) <= 0.6 * len(words):
            return False
        return _hex_dump(" " + chunk, len(words))
    return False
